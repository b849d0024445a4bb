"""AST helpers that look at one node or expression, with no file around it.

Dotted names (``self.opt.step`` -> ``"self.opt"``), method names, ``a % b`` in a
test, device checks, reciprocals, and source positions. The file model that
uses them (imports, training loops) is in :mod:`trainkit.lint._core`, the
conditions a loop's statements run under in :mod:`trainkit.lint._conditions`.
"""
from __future__ import annotations

import ast
from typing import FrozenSet, Iterator, List, Optional, Tuple, Union


def dotted(node: ast.AST) -> Optional[str]:
    """Return ``"a.b.c"`` for a Name/Attribute chain, else ``None``."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):  # a loop, not recursion: chains can be thousands long
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def method_name(call: ast.Call) -> Optional[str]:
    """Return ``"step"`` for ``x.step(...)``; ``None`` for a plain function call."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def receiver(call: ast.Call) -> Optional[str]:
    """Return the dotted receiver of a method call: ``"self.opt"`` for ``self.opt.step()``."""
    return dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None


def has_modulo(test: ast.AST) -> bool:
    """Whether an ``if`` test computes ``a % b`` (string formatting ``"%s" % x`` excluded)."""
    return find_modulo(test) is not None


def find_modulo(test: ast.AST) -> Optional[ast.BinOp]:
    """Return the first ``a % b`` in ``test`` whose left side is not a string literal."""
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)):
                return node
    return None


_DEVICE_NAMES = ("cuda", "mps", "xpu")


def is_device_check(test: ast.AST) -> bool:
    """Whether an ``if`` test only asks which device there is.

    ``torch.cuda.is_available()``, ``torch.backends.mps.is_available()``,
    ``device.type == "cuda"``, ``args.device != "cpu"``, and ``and``/``or``/``not``
    of those: on one machine the answer is the same on every iteration.
    """
    if isinstance(test, ast.BoolOp):
        return all(is_device_check(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_device_check(test.operand)
    if isinstance(test, ast.Call) and not test.args and not test.keywords:
        name = dotted(test.func) or ""
        parts = name.split(".")
        return parts[-1] == "is_available" and any(p in _DEVICE_NAMES for p in parts[:-1])
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
        sides = [test.left, test.comparators[0]]
        consts = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        others = [s for s in sides if s not in consts]
        if len(consts) != 1 or len(others) != 1:
            return False
        value = consts[0].value.split(":")[0].lower()
        other = others[0]
        if isinstance(other, ast.Call) and isinstance(other.func, ast.Name) and other.func.id == "str" and other.args:
            other = other.args[0]
        name = (dotted(other) or "").lower()
        return value in _DEVICE_NAMES + ("cpu",) and "device" in name
    return False


def is_reciprocal(expr: ast.AST, names: FrozenSet[str] = frozenset()) -> bool:
    """``1 / n``, ``1.0 / n``, a literal such as 0.25, or a name in ``names`` bound to one of those.

    Multiplying by a reciprocal is a division.
    """
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return isinstance(expr.left, ast.Constant) and expr.left.value == 1
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, float) and 0 < expr.value < 1
    return bool(names) and dotted(expr) in names


def names_in(node: ast.AST) -> Iterator[str]:
    """Yield every identifier and attribute name mentioned in ``node``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def pos(node: ast.AST) -> Tuple[int, ...]:
    """Source position used to order statements inside one loop iteration. The copy of a function's
    body inlined at its call (see :mod:`trainkit.lint._inline`) comes at the call, in its own order."""
    here = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
    at = getattr(node, "inlined_at", None)
    return at + here if at is not None else here


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def own_nodes(function: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> List[ast.AST]:
    """Every node of ``function``'s own body, its loops included, but not its nested functions,
    lambdas or classes (their code does not run when ``function`` does)."""
    out: List[ast.AST] = []
    stack: List[ast.AST] = list(function.body)
    while stack:
        current = stack.pop()
        if isinstance(current, _SCOPES):
            continue
        out.append(current)
        stack.extend(ast.iter_child_nodes(current))
    return out
