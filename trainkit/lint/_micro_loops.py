"""Micro-batch loops nested in the batch loop (or in a step function), with the optimizer step after them.

nanoGPT's ``for micro_step in range(gradient_accumulation_steps): ... loss.backward()``
followed by ``optimizer.step()`` accumulates too: the inner loop's backwards add up into
the one step after it. A ``zero_grad()`` run at every iteration of that inner loop wipes what
the earlier iterations added, so the step sees one iteration's gradient (TK103). A loss never
divided there makes the update the sum of the micro-batches' gradients (TK102), reported only when
the inner loop says it goes over micro-batches (``micro``, ``accum``, ``chunk``): a loop over
several task losses may mean them to add up. A loss divided only after its backward there
(TK101) is reported for such a loop too, or when the divisor is the inner loop's count. A step
function's body is read as one iteration of a batch loop: ``def train_step(batch):
opt.zero_grad(); for micro in batch.chunk(4): loss.backward()`` then ``opt.step()`` in the function
is the same shape, wherever the function is called from.

Left alone, since their inner loops may mean to collect gradients one by one: an inner loop
that reads ``.grad`` or calls anything else about gradients (``torch.autograd.grad``,
``get_grads()``), a backward with ``retain_graph`` (gradient surgery over several task losses,
as PCGrad does), or a call about gradients between the inner loop and the step (writing the
combined gradient back). An inner loop that steps itself is a training loop of its own.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from trainkit.lint._accumulating import stepped_optimizer
from trainkit.lint._calls import calls_step_function
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._loss import (backward_operand, divisor, late_normalisation, loss_of, normalised_before,
                                 through_reciprocal_name)
from trainkit.lint._nodes import dotted, method_name, names_in, pos, receiver
from trainkit.lint._registry import Hit

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
# Calls about gradients that do not collect them: zeroing and clipping.
_PLAIN = frozenset({"zero_grad", "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "no_grad", "enable_grad",
                    "set_grad_enabled", "requires_grad_"})


@dataclass(frozen=True)
class MicroLoop:
    """A loop over micro-batches inside a batch loop, and the step after it that sums its backwards."""

    outer: TrainingLoop
    inner: TrainingLoop
    step: ast.Call
    optimizer: Optional[str]


def _about_grads(node: ast.AST) -> bool:
    """``p.grad``, ``torch.autograd.grad(...)``, ``get_grads()``, ``backward(retain_graph=True)``."""
    if isinstance(node, ast.Attribute) and node.attr in ("grad", "grads"):
        return True
    if isinstance(node, ast.Call):
        if any(k.arg == "retain_graph" for k in node.keywords):
            return True
        name = method_name(node) or dotted(node.func) or ""
        name = name.split(".")[-1]
        return "grad" in name.lower() and name not in _PLAIN
    return False


def _enclosing_loop(ctx: FileContext, inner: ast.AST) -> Optional[ast.AST]:
    """The loop whose own iteration runs loop ``inner`` (no function between them), if any."""
    for parent in ctx.ancestors(inner):
        if isinstance(parent, _LOOPS):
            return parent
        if isinstance(parent, _SCOPES):
            return None
    return None


def _function_body(ctx: FileContext, inner: ast.AST) -> Optional[TrainingLoop]:
    """The function whose own body runs loop ``inner`` (no loop between them), read as one iteration
    of a loop: a step function's body is one step, as a batch loop's iteration is."""
    function = ctx.parents.get(inner)
    while function is not None and not isinstance(function, _SCOPES + _LOOPS):
        function = ctx.parents.get(function)
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    cache = ctx.__dict__.setdefault("_function_bodies", {})
    if id(function) not in cache:
        cache[id(function)] = TrainingLoop(ctx, function, ctx._region(function))  # type: ignore[arg-type]
    return cache[id(function)]


def micro_loops(ctx: FileContext) -> Iterator[MicroLoop]:
    """Each inner loop that runs backward, never steps, and is followed by the outer loop's step, or
    by a step of the function whose body runs it (``def train_step(batch): for micro in
    batch.chunk(4): ...; loss.backward()`` then ``opt.step()``)."""
    by_node = {id(loop.node): loop for loop in ctx.training_loops}
    for inner in ctx.training_loops:
        if inner.step_calls or any(calls_step_function(ctx, c) for c in inner.calls):
            continue
        if any(_about_grads(n) for n in inner.region):
            continue
        enclosing = _enclosing_loop(ctx, inner.node)
        outer = by_node.get(id(enclosing)) if enclosing is not None else _function_body(ctx, inner.node)
        if outer is None:
            continue
        end = (inner.node.end_lineno or inner.node.lineno, 1 << 30)
        step = next((s for s in outer.step_calls if pos(s) > end and not outer.exclusive(inner.node, s)), None)
        if step is None:
            continue
        if any(end < pos(n) < pos(step) and _about_grads(n) for n in outer.region):
            continue  # gradients combined by hand before the step
        yield MicroLoop(outer, inner, step, stepped_optimizer(ctx, step))


def micro_loop_wipes(ctx: FileContext) -> Iterator[Tuple[ast.Call, MicroLoop]]:
    """``(zero_grad call, micro loop)`` for each ``zero_grad()`` at every iteration of a micro-batch loop."""
    for micro in micro_loops(ctx):
        for call in micro.inner.calls:
            if method_name(call) != "zero_grad" or micro.inner.is_conditional(call):
                continue
            owner = receiver(call)
            if ctx.is_optimizer(owner) and micro.optimizer is not None and owner != micro.optimizer:
                continue  # another optimizer's gradients
            yield call, micro


def wipe_hits(ctx: FileContext) -> Iterator[Hit]:
    """TK103's findings in micro-batch loops."""
    for call, micro in micro_loop_wipes(ctx):
        line = micro.inner.node.lineno
        yield Hit(
            call,
            f"`{ast.unparse(call)}` runs at every iteration of the micro-batch loop (line {line}) but the step "
            f"(line {micro.step.lineno}) runs once after it: the gradients of the earlier iterations are wiped, "
            "only the last one's reach the step",
            f"move `{ast.unparse(call)}` before the loop on line {line} (or right after the step)",
        )


# An inner loop that says it goes over micro-batches: `for micro_step in range(grad_accum_steps)`, `x.chunk(k)`.
_MICRO_RE = re.compile(r"micro|accum|chunk", re.IGNORECASE)
_TK_ACCUMULATE = "or `with tk.accumulate(n, optimizer):`, which divides by the micro-batches actually in each window"


def _count(loop: ast.AST) -> Optional[str]:
    """How many iterations a micro-batch loop makes, as written: ``n`` of ``range(n)`` or ``x.chunk(n)``."""
    it = getattr(loop, "iter", None)
    if isinstance(it, ast.Call) and len(it.args) == 1 and not it.keywords:
        if dotted(it.func) == "range" or method_name(it) == "chunk":
            return ast.unparse(it.args[0])
    return None


def _named_micro(loop: ast.AST) -> bool:
    """Whether a ``for`` loop says it goes over micro-batches: its target or what it iterates over
    mentions ``micro``, ``accum`` or ``chunk``."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    return any(_MICRO_RE.search(n) for part in (loop.target, loop.iter) for n in names_in(part))


def _unwiped(ctx: FileContext) -> Iterator[MicroLoop]:
    """The micro-batch loops with no ``zero_grad()`` wiping their sum (TK103's finding comes first)."""
    wiped = {id(micro.inner) for _, micro in micro_loop_wipes(ctx)}
    return (micro for micro in micro_loops(ctx) if id(micro.inner) not in wiped)


def late_hits(ctx: FileContext) -> Iterator[Hit]:
    """TK101's findings in micro-batch loops: ``loss.backward(); loss = loss / n`` at each iteration of
    an inner loop whose backwards add up into the step after it. The loop must say it goes over
    micro-batches (as for TK102), or the divisor be its count (``for _ in range(n)`` and ``/ n``):
    dividing a task's loss after its backward may be for logging only."""
    for micro in _unwiped(ctx):
        inner = micro.inner
        count = _count(inner.node)
        for call in inner.backward_calls:
            name = loss_of(inner, call)
            if normalised_before(inner, call, name):
                continue  # dividing again afterwards (for logging) is harmless
            late = late_normalisation(inner, call, name)
            if late is None:
                continue
            by = divisor(late, ctx.reciprocal_names)
            by = through_reciprocal_name(ctx, by) if by is not None else None
            if not _named_micro(inner.node) and (count is None or by is None or ast.unparse(by) != count):
                continue
            yield Hit(
                late,
                f"`{ast.unparse(late)}` divides `{name}` after `{ast.unparse(call)}` on line {call.lineno}: the "
                f"gradients of the micro-batch loop (line {inner.node.lineno}), summed into the step (line "
                f"{micro.step.lineno}), were already computed from the undivided loss",
                f"move `{ast.unparse(late)}` before `{ast.unparse(call)}`; {_TK_ACCUMULATE}",
            )


def unnormalised_hits(ctx: FileContext) -> Iterator[Hit]:
    """TK102's findings in micro-batch loops: named as such (the target or what it iterates over says
    ``micro``, ``accum`` or ``chunk``; a loop over task losses may mean them to add up), with a
    backward whose loss is never divided, and no wiping ``zero_grad()`` (TK103's finding first)."""
    for micro in _unwiped(ctx):
        inner = micro.inner
        if not _named_micro(inner.node):
            continue
        count = _count(inner.node)
        for call in inner.backward_calls:
            name = loss_of(inner, call)
            if normalised_before(inner, call, name) or late_normalisation(inner, call, name) is not None:
                continue
            shown = name or ast.unparse(backward_operand(call) or call)
            times = f"`{count}` times too large" if count else "`k` times too large with `k` micro-batches"
            by = f"`{shown} = {shown} / {count}` before backward" if count else (
                f"`{shown} = {shown} / k` before backward, `k` the number of micro-batches")
            yield Hit(
                call,
                f"`{ast.unparse(call)}` runs at every iteration of the micro-batch loop (line {inner.node.lineno}), "
                f"whose gradients add up into the step (line {micro.step.lineno}), but `{shown}` is never divided: "
                f"the update is {times}",
                f"{by}; {_TK_ACCUMULATE}",
            )
