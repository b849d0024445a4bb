"""Step functions: the file's own functions that run a training step when called.

``def _run_batch(self, x, y): opt.zero_grad(); loss.backward(); opt.step()`` called as
``self._run_batch(x, y)`` from a batch loop, or timm's ``_backward(loss)`` defined in the loop
body: the loop trains through the call. A function whose backward or step sits inside a loop of
its own (``def train(...): for x in loader: ...``) is a whole epoch, not a step: the epoch loop
that calls it is not a training loop; so is one holding a batch loop that steps, with one more step
after it for a short last window (TK112's fix). A function that steps nothing and whose backwards
only take an input's gradient (an attack: ``def fgsm(model, x, y):``, see
:mod:`trainkit.lint._input_grads`) is no step function either. A call that switches the function's
training off (``step(..., train=False)``, :mod:`trainkit.lint._switches`) is no step call. What the function's
body runs at every step (TK301, TK302) is read through the call by :mod:`trainkit.lint._step_bodies`;
TK1xx and TK2xx read it written at the call (:mod:`trainkit.lint._step_inline`).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, List, Union

from trainkit.lint._input_grads import input_backwards_only
from trainkit.lint._nodes import own_nodes
from trainkit.lint._switches import switched_off

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Not part of one call of the function: nested scopes, and loops (a loop makes it an epoch).
_SKIPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def is_batch_loop(ctx: "FileContext", loop: ast.AST) -> bool:
    """A ``for`` over anything but ``range(...)`` whose body runs both a backward and a step: a pass
    over the data that updates as it goes (a critic's ``for _ in range(n_critic):`` is part of a step)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("range", "trange"):
        return False
    backward = step = False
    stack: List[ast.AST] = list(loop.body)
    while stack and not (backward and step):
        current = stack.pop()
        if isinstance(current, _SCOPES):
            continue
        if isinstance(current, ast.Call):
            backward = backward or ctx.is_backward(current)
            step = step or ctx.is_step(current)
        stack.extend(ast.iter_child_nodes(current))
    return backward and step


def step_function_defs(ctx: "FileContext") -> Dict[str, List[Function]]:
    """The file's functions and methods whose own body, outside loops, runs backward or a step, by name.

    Not a function that also holds a batch loop of its own (see :func:`is_batch_loop`): its step
    after that loop steps a short last window (TK112's fix), and the function is a whole epoch.
    """
    found: Dict[str, List[Function]] = {}
    for node in ctx.nodes:
        if not isinstance(node, _FUNCTIONS):
            continue
        stack: List[ast.AST] = list(node.body)
        steps = epoch = False
        backwards: List[ast.Call] = []
        while stack and not epoch:
            current = stack.pop()
            if isinstance(current, _LOOPS):
                epoch = is_batch_loop(ctx, current)
            if isinstance(current, _SKIPPED):
                continue
            if isinstance(current, ast.Call):
                steps = steps or ctx.is_step(current)
                if ctx.is_backward(current):
                    backwards.append(current)
            stack.extend(ast.iter_child_nodes(current))
        if epoch or not (steps or backwards):
            continue
        # `def fgsm(model, x, y): ...; loss.backward(); return x + eps * x.grad.sign()`: an attack, no step
        if steps or not input_backwards_only(ctx, backwards, own_nodes(node)):
            found.setdefault(node.name, []).append(node)
    return found


def calls_step_function(ctx: "FileContext", call: ast.Call) -> bool:
    """``train_step(...)`` or ``self.train_step(...)`` where ``train_step`` is one of the file's step
    functions, unless the call switches its training off (``step(..., train=False)``, see
    :mod:`trainkit.lint._switches`)."""
    func = call.func
    if isinstance(func, ast.Name):
        name = func.id
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        name = func.attr
    else:
        return False
    functions = ctx.step_function_defs.get(name)
    return bool(functions) and not switched_off(ctx, call, functions)
