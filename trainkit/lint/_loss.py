"""Following the loss by name through one loop iteration.

The loss is whatever ``.backward()`` is called on: ``loss.backward()``,
``scaler.scale(loss).backward()``, ``(loss / n).backward()`` (already
normalised), ``amp.backward(loss)`` or ``torch.autograd.backward(loss)``.
"""
from __future__ import annotations

import ast
from typing import Optional

from trainkit.lint._core import TrainingLoop, dotted, method_name, pos

# Reductions that keep the loss "the same value" for name tracking: ``loss.mean().backward()``.
_REDUCTIONS = frozenset({"mean", "sum", "squeeze"})


def backward_operand(call: ast.Call) -> Optional[ast.expr]:
    """The expression whose gradient ``call`` computes (``loss`` in ``amp.backward(loss)``)."""
    if call.args:
        return call.args[0]
    if isinstance(call.func, ast.Attribute):
        return call.func.value
    return None


def unwrap_scale(expr: ast.expr) -> ast.expr:
    """``scaler.scale(loss)`` -> ``loss``: the scaler multiplies, it does not normalise."""
    while isinstance(expr, ast.Call) and method_name(expr) == "scale" and expr.args:
        expr = expr.args[0]
    return expr


def _is_reciprocal(expr: ast.expr) -> bool:
    # ``1 / n`` or a literal such as 0.25: multiplying by it is a division.
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return isinstance(expr.left, ast.Constant) and expr.left.value == 1
    return isinstance(expr, ast.Constant) and isinstance(expr.value, float) and 0 < expr.value < 1


def is_normalisation(expr: ast.expr) -> bool:
    """Whether ``expr`` divides: ``x / n``, ``x * (1 / n)``, ``(1 / n) * x``, ``x * 0.25``."""
    expr = unwrap_scale(expr)
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Div):
            return True
        if isinstance(expr.op, ast.Mult):
            return _is_reciprocal(expr.left) or _is_reciprocal(expr.right)
    return False


def loss_name(expr: Optional[ast.expr]) -> Optional[str]:
    """The dotted name of the loss in a backward operand, or ``None`` for an anonymous expression."""
    if expr is None:
        return None
    expr = unwrap_scale(expr)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Div, ast.Mult)):
        side = expr.right if _is_reciprocal(expr.left) else expr.left
        return loss_name(side)
    if isinstance(expr, ast.Call) and method_name(expr) in _REDUCTIONS and not expr.args:
        return loss_name(expr.func.value)  # type: ignore[attr-defined]
    return dotted(expr)


def _normalises(stmt: ast.AST, name: str, *, of_itself: bool) -> bool:
    """Whether ``stmt`` rebinds ``name`` to a divided value.

    With ``of_itself`` the divided value must be the loss itself (``loss = loss / n``
    or ``loss /= n``), not a freshly computed one.
    """
    if isinstance(stmt, ast.AugAssign):
        if dotted(stmt.target) != name:
            return False
        return isinstance(stmt.op, ast.Div) or (isinstance(stmt.op, ast.Mult) and _is_reciprocal(stmt.value))
    if isinstance(stmt, ast.Assign):
        targets = [dotted(t) for t in stmt.targets]
        value = stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [dotted(stmt.target)]
        value = stmt.value
    else:
        return False
    if name not in targets or not is_normalisation(value):
        return False
    return not of_itself or any(dotted(n) == name for n in ast.walk(value))


def normalised_before(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> bool:
    """Whether the loss of ``call`` is divided inline or by an assignment earlier in the iteration."""
    return normalisation_before(loop, call, name) is not None


def normalisation_before(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> Optional[ast.AST]:
    """The node that divides the loss of ``call`` before it (the call itself when inline), or None."""
    operand = backward_operand(call)
    if operand is not None and is_normalisation(operand):
        return call
    if name is None:
        return None
    here = pos(call)
    for n in loop.region:
        if pos(n) < here and _normalises(n, name, of_itself=False):
            return n
    return None


def late_normalisation(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> Optional[ast.stmt]:
    """The ``loss = loss / n`` that comes after ``call`` in the same iteration, if any."""
    if name is None:
        return None
    here = pos(call)
    for node in loop.region:
        if pos(node) > here and _normalises(node, name, of_itself=True):
            return node  # type: ignore[return-value]
    return None
