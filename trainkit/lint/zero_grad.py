"""TK113-TK114: gradients zeroed where the step loses them, or never zeroed at all.

``loss.backward(); optimizer.zero_grad(); optimizer.step()`` wipes what the backward just made:
with ``set_to_none=True`` (the default) the step finds no gradient and moves nothing (TK113). A
loop that never zeroes its optimizer's gradients lets every backward add to those of all the
batches before, so each update follows their running sum (TK114). The zeroing mistakes of
gradient accumulation are TK103 (:mod:`trainkit.lint.accumulation`) and TK106
(:mod:`trainkit.lint.accumulate_blocks`).
"""
from __future__ import annotations

import ast
from typing import Iterator, List, Optional, Set, Tuple

from trainkit.lint._accumulating import is_grad, stepped_optimizer, zeroes_gradients, zeroing_owner
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, pos
from trainkit.lint._registry import Hit, rule
from trainkit.lint._step_bodies import functions_of
from trainkit.lint._zeroing import hands_over, may_zero, related_names, zeroed_in_file

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_EXITS = (ast.Continue, ast.Break, ast.Return, ast.Raise)
# Calls that give the gradients nothing back between a zeroing and the step.
_NO_GRADIENTS = frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "unscale_", "print"})


def _closure(ctx: FileContext, step: ast.Call) -> bool:
    """``optimizer.step(closure)``: the closure runs its own backward (L-BFGS), inside the step."""
    return any(k.arg == "closure" for k in step.keywords) or any(not ctx.is_optimizer(dotted(a)) for a in step.args)


def _inner_backwards(ctx: FileContext, it: TrainingLoop) -> List[ast.AST]:
    """The loops nested in ``it``'s iteration that run backwards of their own (nanoGPT's micro-batch
    loop, analysed as a training loop of its own): their gradients reach the step after them."""
    out: List[ast.AST] = []
    stack: List[ast.AST] = list(it.node.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, _LOOPS) and ctx.is_training_loop(node):
            out.append(node)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _conditions(it: TrainingLoop, node: ast.AST) -> Set[Tuple[int, object]]:
    """The branches ``node`` runs in, and the ``except`` handlers around it."""
    out: Set[Tuple[int, object]] = {(id(owner), side) for owner, side in it.branches(node)}
    out |= {(id(g), "except") for g in it.guards(node) if isinstance(g, ast.ExceptHandler)}
    return out


def _leaves_after(ctx: FileContext, it: TrainingLoop, node: ast.AST, before: Tuple[int, ...]) -> bool:
    """Whether a ``continue``/``break``/``return``/``raise`` of a block around ``node`` comes after it
    and before ``before``: ``optimizer.zero_grad(); continue`` skips the step (a batch thrown away)."""
    child = node
    for parent in ctx.ancestors(node, stop=it.node):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and any(s is child for s in block):
                if any(isinstance(s, _EXITS) and pos(child) < pos(s) < before for s in block):
                    return True
        child = parent
    return any(isinstance(s, _EXITS) and pos(child) < pos(s) < before for s in it.node.body)


def _refills(ctx: FileContext, it: TrainingLoop, node: ast.AST, names: frozenset) -> bool:
    """Whether ``node`` (between the zeroing and the step) may give the step gradients again: a
    backward, a write to ``p.grad``, a step function, or a call handed the optimizer or its model."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_grad(t) for t in targets)
    if not isinstance(node, ast.Call):
        return False
    if zeroes_gradients(node):
        return False
    if ctx.is_backward(node) or method_name(node) == "grad":
        return True  # `torch.autograd.grad(...)`, then written to `p.grad`
    if ctx.is_step(node) or (dotted(node.func) or "").split(".")[-1] in _NO_GRADIENTS:
        return False
    if isinstance(node.func, ast.Attribute) and is_grad(node.func.value):
        return True  # `p.grad.copy_(g)`
    if functions_of(ctx).resolve(it, node) is not None:
        return True  # this file's function: it may run a backward
    given = list(node.args) + [k.value for k in node.keywords]
    if isinstance(node.func, ast.Attribute):
        given.append(node.func.value)
    return any(hands_over(arg, names) for arg in given)


def _wastes(ctx: FileContext, it: TrainingLoop, zero: ast.AST, step: ast.Call, optimizer: str,
            backwards: List[ast.AST]) -> Optional[ast.AST]:
    """The backward whose gradients ``zero`` wipes before ``step`` uses them, or None (see TK113)."""
    here, there = pos(zero), pos(step)
    if not here < there or not _conditions(it, zero) <= _conditions(it, step):
        return None  # after the step, in another arm, or under a condition of its own (`if nan: zero_grad()`)
    guard = it.modulo_guard(step)
    if guard is not None and guard is not it.modulo_guard(zero):
        return None  # zeroed on every micro-batch of an accumulation: TK103's
    if _leaves_after(ctx, it, zero, there):
        return None
    owner = zeroing_owner(it, zero)
    names = frozenset({optimizer, owner or ""} | {m for m, o in ctx.parameter_optimizers.items() if optimizer in o})
    names = names | {n.split(".")[0] for n in names if n}
    if any(here < pos(n) < there and (n in backwards or _refills(ctx, it, n, names)) for n in it.region + backwards):
        return None
    before = [b for b in backwards if pos(b) < here and not it.exclusive(b, zero) and not it.exclusive(b, step)]
    if not before:
        return None
    last = max(before, key=pos)
    others = [s for s in it.step_calls if pos(last) < pos(s) < here and stepped_optimizer(ctx, s) == optimizer]
    return None if others else last


def _iterations(ctx: FileContext) -> Iterator[TrainingLoop]:
    """The training loops, then the bodies of the file's step functions read as one iteration."""
    yield from ctx.training_loops
    functions = functions_of(ctx)
    for defs in ctx.step_function_defs.values():
        for function in defs:
            body = functions.body(function)  # type: ignore[arg-type]
            if body is not None:
                yield body


@rule(
    "TK113",
    name="zero-grad-between-backward-and-step",
    severity="error",
    summary="zero_grad() between backward() and the step wipes the gradients the step was to use",
)
def check_zero_grad_before_step(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss.backward(); optimizer.zero_grad(); optimizer.step()``: the step finds no gradient.

    Also ``model.zero_grad()`` (or ``p.grad = None`` over ``model.parameters()``) where the file
    builds the stepping optimizer on ``model.parameters()``. Not flagged: another optimizer's (a
    GAN's), a zeroing after the step or before the backward, one in another arm than the step or
    under a condition of its own (``if not torch.isfinite(loss): optimizer.zero_grad()`` throws a
    bad batch away), one followed by ``continue``, a step given a closure (L-BFGS), and one on every
    micro-batch of an accumulation (TK103).
    """
    yield from wasted_zeroings(ctx)


def wasted_zeroings(ctx: FileContext) -> List[Hit]:
    """TK113's hits in the file, found once: TK102 reads them too (its wording beside TK113)."""
    cached = ctx.__dict__.get("_wasted_zeroings")
    if cached is None:
        cached = ctx.__dict__["_wasted_zeroings"] = list(_wasted_zeroings(ctx))
    return cached


def _wasted_zeroings(ctx: FileContext) -> Iterator[Hit]:
    seen: Set[Tuple[int, int]] = set()
    for it in _iterations(ctx):
        backwards: List[ast.AST] = list(it.backward_calls) + _inner_backwards(ctx, it)
        if not backwards:
            continue
        zeros = [n for n in it.region if zeroes_gradients(n)]
        for step in it.step_calls:
            optimizer = stepped_optimizer(ctx, step)
            if optimizer is None or _closure(ctx, step):
                continue
            for zero in zeros:
                owner = zeroing_owner(it, zero)
                if owner != optimizer and optimizer not in ctx.parameter_optimizers.get(owner or "", ()):
                    continue  # another optimizer's, or a model the file does not build this one on
                key = (getattr(zero, "lineno", 0), getattr(zero, "col_offset", 0))
                last = _wastes(ctx, it, zero, step, optimizer, backwards) if key not in seen else None
                if last is None:
                    continue
                seen.add(key)
                shown = ast.unparse(zero).splitlines()[0]
                # under an accumulation's `if`, what is lost is each window's summed gradients
                lost = ("every window's gradients are" if it.modulo_guard(step) is not None
                        else "every batch's backward is")
                moved = f"`{shown}`" if isinstance(zero, ast.Call) else f"`{shown}` (with its `for` loop)"
                yield Hit(
                    zero,
                    f"`{shown}` runs after the backward on line {last.lineno} and before `{ast.unparse(step)}` "
                    f"on line {step.lineno}: it wipes the gradients that backward just made, so the step finds "
                    "none (with `set_to_none=True`, the default, no parameter moves; with zeros, only momentum "
                    f"and weight decay do) and {lost} thrown away",
                    f"move {moved} after `{ast.unparse(step)}` (or to the top of the iteration, before the "
                    "forward pass)",
                )


def _fresh(loop: TrainingLoop, names: Set[str]) -> bool:
    """Whether the optimizer or its model is built anew in the iteration: each steps once (a task's
    own copy in meta-learning), so no gradient is carried from one step to the next."""
    return any(isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store) and dotted(n) in names
               for n in loop.region)


@rule(
    "TK114",
    name="gradients-never-zeroed",
    severity="error",
    summary="the optimizer steps but its gradients are never zeroed, so each update uses the sum of all "
            "earlier gradients",
)
def check_never_zeroed(ctx: FileContext) -> Iterator[Hit]:
    """Flag a training loop whose optimizer steps while nothing in the file zeroes its gradients.

    Conservative (see :mod:`trainkit.lint._zeroing`): any zeroing in the file that may reach the
    optimizer, a loop inside an ``accumulate(...)`` block, a step given a closure, an optimizer or
    model built in the loop, or a call the linter cannot read that may zero (a helper of another
    module given the model or optimizer) keeps it quiet.
    """
    for loop in ctx.training_loops:
        if loop.per_epoch or not (loop.backward_calls or _inner_backwards(ctx, loop)):
            continue
        stepped = {stepped_optimizer(ctx, s) for s in loop.step_calls} - {None}
        reported: Set[str] = set()
        for step in loop.step_calls:
            optimizer = stepped_optimizer(ctx, step)
            if optimizer is None or optimizer in reported or _closure(ctx, step):
                continue
            if ctx.inside_with(step, ("accumulate",)):
                continue  # the block (trainkit's or accelerate's) owns the window's gradients
            if zeroed_in_file(ctx, optimizer, stepped):  # type: ignore[arg-type]
                continue
            names = related_names(ctx, loop, optimizer)
            tied = {m for m, o in ctx.parameter_optimizers.items() if optimizer in o}
            if _fresh(loop, {optimizer} | tied):
                continue
            if any(may_zero(ctx, loop, call, optimizer, names) for call in loop.calls):
                continue
            reported.add(optimizer)
            shown = ast.unparse(step)
            yield Hit(
                step,
                f"`{shown}` steps `{optimizer}` but nothing in the file zeroes its gradients (no "
                f"`{optimizer}.zero_grad()`, nor its model's, nor `p.grad = None`): each backward adds to the "
                "gradients of all the batches before, so every update follows their running sum and training "
                "drifts or diverges",
                f"call `{optimizer}.zero_grad()` once per step: right after `{shown}` (or at the top of the "
                "iteration, before the forward pass); with accumulation, under the step's `if`",
            )
