"""Backwards that take the gradient of an input, not of the model: an attack or a saliency map.

A PGD or FGSM evaluation loop (``x_adv.requires_grad_(True); loss = crit(model(x_adv), y);
loss.backward(); x_adv = x_adv + eps * x_adv.grad.sign()``), a saliency map or integrated
gradients run a backward on every batch, often under ``model.eval()``, but step no optimizer: what
they use is the gradient of the input. Such a loop (or a function such as ``def fgsm(model, x, y):``)
does not train, so it is no training loop (nor step function) and TK301/TK302 do not count its
iterations as training steps.

Read conservatively, since taking a training loop for an evaluation one hides its findings. Where
nothing steps (the caller checks that, also through step functions), a backward is an *input
backward* when:

* it is a plain ``t.backward(...)`` (not ``scaler.scale(loss).backward()``, nor a module's
  ``amp.backward(loss)`` or ``torch.autograd.backward(loss)``), and
* its gradients go to ``inputs=[x, ...]`` only, each a name the code made require gradients; or,
  without ``inputs=``, the code reads ``x.grad`` of such a name after it (a training loss's
  ``loss.backward()`` after the attack, in a ``train_step()``, has no such read: the model's);
* and the code touches no other ``.grad`` (``p.grad`` of a parameter) and clips no gradients
  (``clip_grad_norm_``): those are the model's gradients, in use.

An attack inside code that steps (adversarial training: Madry's PGD ``for _ in range(k):`` in the
batch loop, or in a ``train_step()`` that steps after it) is no training loop either but part of
that code's iteration, as it runs: its ``model.zero_grad()`` wipes an accumulating loop's window
(TK103). Its backwards are kept in :attr:`FileContext.probe_backwards`, so that no rule reads them
as the training step's (its undivided attack loss is no accumulated micro-batch: no TK102).

A name *requires gradients* when the code runs ``x.requires_grad_()`` (or ``(True)``), ``x.requires_grad
= True``, or binds ``x = <...>.requires_grad_(True)`` or ``x = f(..., requires_grad=True)``
(``torch.zeros_like(x, requires_grad=True)``): in the loop's iteration or, for a loop, before it in
its function (Madry's PGD makes ``delta`` once, then loops). A model's parameters require gradients
from their construction, so a name marked so is an input.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Iterable, Iterator, List, Optional, Set

from trainkit.lint._nodes import dotted, method_name, pos, receiver

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _true(args: List[ast.expr], keywords: List[ast.keyword]) -> bool:
    """``()`` or ``(True)``, ``(requires_grad=True)``: the call turns gradients on."""
    values = list(args) + [k.value for k in keywords]
    return len(values) <= 1 and all(isinstance(v, ast.Constant) and v.value is True for v in values)


def _marks(node: ast.AST) -> Iterator[str]:
    """The dotted names ``node`` (one node, not its children) makes require gradients."""
    if isinstance(node, ast.Call) and method_name(node) == "requires_grad_" and _true(node.args, node.keywords):
        name = receiver(node)
        if name is not None:
            yield name
    elif isinstance(node, ast.Assign):
        value = node.value
        marked = False
        if isinstance(value, ast.Call):
            if method_name(value) == "requires_grad_":
                marked = _true(value.args, value.keywords)
            else:
                marked = any(k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value is True
                             for k in value.keywords)
        for target in node.targets:
            if (isinstance(target, ast.Attribute) and target.attr == "requires_grad"
                    and isinstance(value, ast.Constant) and value.value is True):
                name = dotted(target.value)
                if name is not None:
                    yield name
            elif marked:
                name = dotted(target)
                if name is not None:
                    yield name


def marked_names(nodes: Iterable[ast.AST]) -> Set[str]:
    """The dotted names that ``nodes`` make require gradients (see the module)."""
    return {name for node in nodes for name in _marks(node)}


def plain_backward(ctx: "FileContext", call: ast.Call) -> bool:
    """``t.backward(...)`` on a tensor: not ``scaler.scale(loss).backward()``, ``amp.backward(loss)``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if isinstance(func.value, ast.Call) and method_name(func.value) == "scale":
        return False
    head = (dotted(func.value) or "").split(".")[0]
    return head not in ctx.aliases  # `amp.backward(loss)`, `torch.autograd.backward(loss)`: an imported module


def _inputs(call: ast.Call) -> Optional[List[Optional[str]]]:
    """The names given as ``inputs=`` (``[None]`` for anything not a dotted name), or None without it."""
    for keyword in call.keywords:
        if keyword.arg == "inputs":
            value = keyword.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return [dotted(e) for e in elts]
    return None


def input_backwards_only(ctx: "FileContext", backwards: List[ast.Call], code: List[ast.AST],
                         before: Iterable[ast.AST] = ()) -> bool:
    """Whether each of ``backwards`` (in ``code``, an iteration or a function's body) is an input
    backward (see the module); ``before`` are the statements that run before ``code`` in its
    function, where an input may be made to require gradients once."""
    if not backwards:
        return False
    marked = marked_names(code) | marked_names(before)
    if not marked:
        return False
    last_read = None  # where the input's gradient is last read: each backward must come before a read
    for node in code:
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            if dotted(node.value) not in marked:
                return False  # a parameter's gradient (`p.grad`): the model's gradients are used
            if isinstance(node.ctx, ast.Load) and (last_read is None or pos(node) > last_read):
                last_read = pos(node)
        elif isinstance(node, ast.Call) and "clip_grad" in (method_name(node) or dotted(node.func) or ""):
            return False
    for call in backwards:
        if not plain_backward(ctx, call):
            return False
        given = _inputs(call)
        if given is not None:
            if not all(name in marked for name in given):
                return False
        elif last_read is None or last_read < pos(call):
            return False  # no input's gradient read after it: `loss.backward()` of the training loss, after the attack
    return True


def _over_range(loop: ast.AST) -> bool:
    """``for _ in range(n):`` (or ``trange``): a part of a step, such as a critic's or an attack's iterations."""
    it = getattr(loop, "iter", None)
    return isinstance(it, ast.Call) and dotted(it.func) in ("range", "trange")


def in_stepping_code(ctx: "FileContext", loop: ast.AST) -> bool:
    """Whether the code around ``loop`` steps on the iterations that run it: a loop around it, or
    the function holding it (adversarial training's attack loop, in the batch loop or in
    ``train_step()``). A step in another pass over data (``for x, y in train_loader:`` beside the
    evaluation's ``for x, y in test_loader:``) does not count; one in a ``for _ in range(n):`` does."""
    from trainkit.lint._calls import calls_step_function  # _calls reads step functions with this module

    chain = {id(parent) for parent in ctx.ancestors(loop)}
    for parent in ctx.ancestors(loop):
        if isinstance(parent, (ast.ClassDef, ast.Lambda)):
            return False
        if not isinstance(parent, _LOOPS + _FUNCTIONS):
            continue
        stack: List[ast.AST] = list(parent.body)  # type: ignore[attr-defined]
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPES) or node is loop:
                continue
            if isinstance(node, _LOOPS) and id(node) not in chain and not _over_range(node):
                continue  # another pass over data
            if isinstance(node, ast.Call) and (ctx.is_step(node) or calls_step_function(ctx, node)):
                return True
            stack.extend(ast.iter_child_nodes(node))
        if isinstance(parent, _FUNCTIONS):
            return False
    return False


def nodes_before(ctx: "FileContext", loop: ast.AST) -> List[ast.AST]:
    """The nodes of ``loop``'s function (or module) that come before it, outside nested scopes."""
    scope: ast.AST = ctx.tree
    for parent in ctx.ancestors(loop):
        if isinstance(parent, _SCOPES):
            scope = parent
            break
    start = pos(loop)
    out: List[ast.AST] = []
    stack: List[ast.AST] = list(getattr(scope, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES) or (hasattr(node, "lineno") and pos(node) >= start):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out
