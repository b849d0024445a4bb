"""Following the loss by name through one loop iteration.

The loss is whatever ``.backward()`` is called on: ``loss.backward()``,
``scaler.scale(loss).backward()``, ``(loss / n).backward()`` (already
normalised), ``amp.backward(loss)``, ``torch.autograd.backward(loss)``, or
apex's ``with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()``.
"""
from __future__ import annotations

import ast
from typing import FrozenSet, Iterator, Optional

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, is_reciprocal, method_name, pos

# Reductions that keep the loss "the same value" for name tracking: ``loss.mean().backward()``.
_REDUCTIONS = frozenset({"mean", "sum", "squeeze"})
# ``loss.div(n)``, ``torch.div(loss, n)``: divisions spelled as calls.
_DIVISIONS = frozenset({"div", "divide", "true_divide"})
_MULTIPLICATIONS = frozenset({"mul", "multiply"})
# In-place spellings: ``loss.div_(n)`` divides the loss where it stands.
_IN_PLACE_DIVISIONS = frozenset({"div_", "divide_", "true_divide_"})
_IN_PLACE_MULTIPLICATIONS = frozenset({"mul_", "multiply_"})

_NO_NAMES: FrozenSet[str] = frozenset()


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


def _call_division(expr: ast.expr, reciprocals: FrozenSet[str]) -> Optional[ast.expr]:
    """The divided value of ``x.div(n)``, ``torch.div(x, n)`` or ``x.mul(1 / n)``, else None."""
    if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Attribute):
        return None
    name = expr.func.attr
    is_method = len(expr.args) == 1
    if name in _DIVISIONS:
        if is_method:
            return expr.func.value
        if len(expr.args) == 2 and (dotted(expr.func.value) or "").split(".")[-1] == "torch":
            return expr.args[0]
    if name in _MULTIPLICATIONS and is_method and is_reciprocal(expr.args[0], reciprocals):
        return expr.func.value
    return None


def is_normalisation(expr: ast.expr, reciprocals: FrozenSet[str] = _NO_NAMES) -> bool:
    """Whether ``expr`` divides: ``x / n``, ``x * (1 / n)``, ``x * 0.25``, ``x.div(n)``, ``x * scale``,
    or a sum whose every term divides (``ce / n + kl / n``), or a conditional expression one of
    whose branches divides (``loss / n if n > 1 else loss``: divided whenever accumulation is on,
    as the ``if n > 1: loss /= n`` block form is).

    ``reciprocals`` are names bound to ``1 / n`` (``loss_scale = 1.0 / accum``).
    """
    expr = unwrap_scale(expr)
    if isinstance(expr, ast.IfExp):
        return is_normalisation(expr.body, reciprocals) or is_normalisation(expr.orelse, reciprocals)
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Div):
            return True
        if isinstance(expr.op, ast.Mult):
            return is_reciprocal(expr.left, reciprocals) or is_reciprocal(expr.right, reciprocals)
        if isinstance(expr.op, (ast.Add, ast.Sub)):  # `ce / n + kl / n`: every term divided
            return is_normalisation(expr.left, reciprocals) and is_normalisation(expr.right, reciprocals)
    return _call_division(expr, reciprocals) is not None


def loss_name(expr: Optional[ast.expr], reciprocals: FrozenSet[str] = _NO_NAMES) -> Optional[str]:
    """The dotted name of the loss in a backward operand, or ``None`` for an anonymous expression."""
    if expr is None:
        return None
    expr = unwrap_scale(expr)
    if isinstance(expr, ast.IfExp):  # `loss / n if n > 1 else loss`: the same loss on both sides
        names = {loss_name(expr.body, reciprocals), loss_name(expr.orelse, reciprocals)}
        return names.pop() if len(names) == 1 else None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Div, ast.Mult)):
        side = expr.right if is_reciprocal(expr.left, reciprocals) else expr.left
        return loss_name(side, reciprocals)
    divided = _call_division(expr, reciprocals)
    if divided is not None:
        return loss_name(divided, reciprocals)
    if isinstance(expr, ast.Call) and method_name(expr) in _REDUCTIONS and not expr.args:
        return loss_name(expr.func.value, reciprocals)  # type: ignore[attr-defined]
    return dotted(expr)


def loss_of(loop: TrainingLoop, call: ast.Call) -> Optional[str]:
    """The name of the loss whose gradient ``call`` computes, followed through apex's ``scale_loss``.

    ``with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()``
    takes the gradient of ``loss`` (times the loss scale): the loss is ``loss``.
    """
    reciprocals = loop.ctx.reciprocal_names
    name = loss_name(backward_operand(call), reciprocals)
    if name is None:
        return None
    for parent in loop.ctx.ancestors(call, stop=loop.node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if (item.optional_vars is not None and dotted(item.optional_vars) == name
                        and isinstance(expr, ast.Call) and expr.args
                        and "scale" in ((dotted(expr.func) or "").split(".")[-1])):
                    return loss_name(expr.args[0], reciprocals)
    return name


def _in_place(stmt: ast.AST, name: str, reciprocals: FrozenSet[str]) -> bool:
    """``loss.div_(n)`` or ``loss.mul_(1 / n)`` as a statement: divides ``name`` where it stands."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    if not isinstance(call.func, ast.Attribute) or dotted(call.func.value) != name or len(call.args) != 1:
        return False
    if call.func.attr in _IN_PLACE_DIVISIONS:
        return True
    return call.func.attr in _IN_PLACE_MULTIPLICATIONS and is_reciprocal(call.args[0], reciprocals)


def _normalises(stmt: ast.AST, name: str, *, of_itself: bool, reciprocals: FrozenSet[str] = _NO_NAMES) -> bool:
    """Whether ``stmt`` rebinds ``name`` to a divided value (or divides it in place).

    With ``of_itself`` the divided value must be the loss itself (``loss = loss / n``,
    ``loss /= n`` or ``loss.div_(n)``), not a freshly computed one.
    """
    if _in_place(stmt, name, reciprocals):
        return True
    if isinstance(stmt, ast.AugAssign):
        if dotted(stmt.target) != name:
            return False
        return isinstance(stmt.op, ast.Div) or (isinstance(stmt.op, ast.Mult) and is_reciprocal(stmt.value, reciprocals))
    if isinstance(stmt, ast.Assign):
        targets = [dotted(t) for t in stmt.targets]
        value = stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [dotted(stmt.target)]
        value = stmt.value
    else:
        return False
    if name not in targets or not is_normalisation(value, reciprocals):
        return False
    return not of_itself or any(dotted(n) == name for n in ast.walk(value))


def _rebinds(stmt: ast.AST, name: str) -> bool:
    """Whether ``stmt`` binds ``name`` to a new value (``loss = loss.detach()``, ``for loss in ...``)."""
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
    else:
        return False
    return any(isinstance(getattr(n, "ctx", None), ast.Store) and dotted(n) == name
               for t in targets for n in ast.walk(t))


def normalised_before(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> bool:
    """Whether the loss of ``call`` is divided inline or by an assignment earlier in the iteration."""
    return normalisation_before(loop, call, name) is not None


def normalisation_before(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> Optional[ast.AST]:
    """The node that divides the loss of ``call`` before it (the call itself when inline), or None."""
    return next(normalisations_before(loop, call, name), None)


def normalisations_before(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> Iterator[ast.AST]:
    """Each node that divides the loss of ``call`` before it (the call itself when inline), in order."""
    reciprocals = loop.ctx.reciprocal_names
    operand = backward_operand(call)
    if operand is not None and is_normalisation(operand, reciprocals):
        yield call
    if name is None:
        return
    here = pos(call)
    for n in loop.region:
        if pos(n) < here and _normalises(n, name, of_itself=False, reciprocals=reciprocals):
            yield n


def divisor(node: ast.AST, reciprocals: FrozenSet[str] = _NO_NAMES) -> Optional[ast.expr]:
    """What a normalisation divides by: ``n`` in ``loss / n``, ``loss /= n``, ``loss * (1 / n)``,
    ``loss.div_(n)`` or ``(loss / n).backward()``; a reciprocal literal or name itself; the
    terms' common one in ``ce / n + kl / n``; else None.
    """
    if isinstance(node, ast.Expr):
        node = node.value
    if isinstance(node, ast.Call) and method_name(node) in _IN_PLACE_DIVISIONS | _IN_PLACE_MULTIPLICATIONS:
        return _reciprocal_divisor(node.args[0]) if node.func.attr in _IN_PLACE_MULTIPLICATIONS else node.args[0]  # type: ignore[attr-defined]
    if isinstance(node, ast.Call) and method_name(node) == "backward":
        operand = backward_operand(node)
        return divisor(operand, reciprocals) if operand is not None else None
    if isinstance(node, ast.AugAssign):
        return node.value if isinstance(node.op, ast.Div) else _reciprocal_divisor(node.value)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return divisor(node.value, reciprocals) if node.value is not None else None
    if isinstance(node, ast.expr):
        expr = unwrap_scale(node)
        if isinstance(expr, ast.IfExp):  # the dividing branch's divisor
            body = divisor(expr.body, reciprocals)
            return body if body is not None else divisor(expr.orelse, reciprocals)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
            return expr.right
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
            # `ce / n + kl / n`: the terms' common divisor; terms divided by different ones have none
            left, right = divisor(expr.left, reciprocals), divisor(expr.right, reciprocals)
            same = left is not None and right is not None and ast.dump(left) == ast.dump(right)
            return left if same else None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
            side = expr.left if is_reciprocal(expr.left, reciprocals) else expr.right
            return _reciprocal_divisor(side)
        if isinstance(expr, ast.Call) and _call_division(expr, reciprocals) is not None:
            arg = expr.args[-1]
            return _reciprocal_divisor(arg) if method_name(expr) in _MULTIPLICATIONS else arg
    return None


def through_reciprocal_name(ctx: FileContext, by: ast.expr) -> ast.expr:
    """``n`` for a name only ever bound to ``1 / n`` (``scale = 1 / n``, then ``loss * scale``); else ``by``.

    Every assignment of the name in the file must divide by the same ``n``: ``scale = 1 / n`` in
    one place and ``1 / k`` in another says nothing about this loop's divisor.
    """
    name = dotted(by)
    if name is None or name not in ctx.reciprocal_names:
        return by
    values = ctx.assignments.get(name, [])
    if not values or not all(isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div) for v in values):
        return by  # also `scale = 0.25`: no divisor written
    if len({ast.dump(v.right) for v in values}) != 1:  # type: ignore[attr-defined]
        return by
    return values[0].right  # type: ignore[attr-defined]


def _reciprocal_divisor(expr: ast.expr) -> ast.expr:
    """``n`` for ``1 / n``; a literal (0.25) or a name bound to ``1 / n`` as it is."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return expr.right
    return expr


def late_normalisation(loop: TrainingLoop, call: ast.Call, name: Optional[str]) -> Optional[ast.stmt]:
    """The ``loss = loss / n`` that comes after ``call`` in the same iteration, if any.

    The name is followed until it is rebound to something else: after
    ``loss = loss.detach()`` a ``loss /= world_size`` divides a logged copy,
    not the loss the backward saw.
    """
    if name is None:
        return None
    reciprocals = loop.ctx.reciprocal_names
    here = pos(call)
    for node in loop.region:
        if pos(node) <= here:
            continue
        if _normalises(node, name, of_itself=True, reciprocals=reciprocals):
            return node  # type: ignore[return-value]
        if _rebinds(node, name):
            return None
    return None
