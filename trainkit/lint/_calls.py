"""Step functions: the file's own functions that run a training step when called.

``def _run_batch(self, x, y): opt.zero_grad(); loss.backward(); opt.step()`` called as
``self._run_batch(x, y)`` from a batch loop, or timm's ``_backward(loss)`` defined in the loop
body: the loop trains through the call. A function whose backward or step sits inside a loop of
its own (``def train(...): for x in loader: ...``) is a whole epoch, not a step: the epoch loop
that calls it is not a training loop.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, FrozenSet, List, Set

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Not part of one call of the function: nested scopes, and loops (a loop makes it an epoch).
_SKIPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.AsyncFor, ast.While)


def step_function_names(ctx: "FileContext") -> FrozenSet[str]:
    """Names of the file's functions and methods whose own body, outside loops, runs backward or a step."""
    found: Set[str] = set()
    for node in ctx.nodes:
        if not isinstance(node, _FUNCTIONS) or node.name in found:
            continue
        stack: List[ast.AST] = list(node.body)
        while stack:
            current = stack.pop()
            if isinstance(current, _SKIPPED):
                continue
            if isinstance(current, ast.Call) and (ctx.is_backward(current) or ctx.is_step(current)):
                found.add(node.name)
                break
            stack.extend(ast.iter_child_nodes(current))
    return frozenset(found)


def calls_step_function(call: ast.Call, names: FrozenSet[str]) -> bool:
    """``train_step(...)`` or ``self.train_step(...)`` where ``train_step`` is one of ``names``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in names
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
            and func.attr in names)
