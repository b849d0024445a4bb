"""TK2xx: GradScaler misuse in mixed-precision loops (wrong or stalled updates)."""
from __future__ import annotations

import ast
from typing import Iterator

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, receiver
from trainkit.lint._loss import backward_operand
from trainkit.lint._registry import Hit, rule

_TK_AMP = "or let trainkit do it: `with tk.autocast_scaled(scaler) as amp:` then `amp.backward(loss); amp.step(optimizer)` unscales, steps, updates and counts skipped steps"


def _updates_around(ctx: FileContext, loop: TrainingLoop) -> Iterator[ast.Call]:
    """Calls that run with each pass of ``loop``: its own and those of the loops around it.

    ``for opt in optimizers: scaler.step(opt)`` is a loop of its own whose
    ``scaler.update()`` follows it, once per batch, in the enclosing loop; a loop over
    optimizers (its target is an optimizer) also counts the statements right after it
    (a per-batch ``train_step`` function).
    """
    yield from loop.calls
    target = getattr(loop.node, "target", None)
    parent = ctx.parents.get(loop.node)
    if target is not None and ctx.is_optimizer(dotted(target)) and parent is not None:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and any(s is loop.node for s in block):
                after = block[[id(s) for s in block].index(id(loop.node)) + 1:]
                for stmt in after:
                    yield from (n for n in ast.walk(stmt) if isinstance(n, ast.Call))
    for outer in ctx.ancestors(loop.node):
        if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            break
        if isinstance(outer, (ast.For, ast.AsyncFor, ast.While)):
            yield from (n for n in ast.walk(outer) if isinstance(n, ast.Call))


@rule(
    "TK201",
    name="scaler-step-without-update",
    severity="error",
    summary="scaler.step() without scaler.update() in the loop: the loss scale never adapts",
)
def check_step_without_update(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``scaler.step(opt)`` in a loop that never calls ``scaler.update()``."""
    for loop in ctx.training_loops:
        updated = {receiver(c) for c in _updates_around(ctx, loop) if method_name(c) == "update"}
        for step in loop.step_calls:
            name = receiver(step)
            if ctx.is_scaler(name) and name not in updated:
                yield Hit(
                    step,
                    f"`{ast.unparse(step)}` with no `{name}.update()` in the loop: after one overflow "
                    "the scale never shrinks back, or never grows, and steps keep being skipped",
                    f"call `{name}.update()` right after `{ast.unparse(step)}`; {_TK_AMP}",
                )


def _scaled_backward(ctx: FileContext, call: ast.Call) -> bool:
    operand = backward_operand(call)
    return isinstance(operand, ast.Call) and method_name(operand) == "scale" and ctx.is_scaler(receiver(operand))


@rule(
    "TK202",
    name="scaled-backward-plain-step",
    severity="error",
    summary="scaler.scale(loss).backward() followed by a plain optimizer.step(): the step uses scaled gradients",
)
def check_plain_step_after_scaled_backward(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``optimizer.step()`` in a loop whose backward goes through ``scaler.scale(...)``."""
    for loop in ctx.training_loops:
        scaled = [c for c in loop.backward_calls if _scaled_backward(ctx, c)]
        if not scaled:
            continue
        scaler = receiver(backward_operand(scaled[0]))  # type: ignore[arg-type]
        unscaled = [c for c in loop.calls if method_name(c) == "unscale_" and receiver(c) == scaler]
        for step in loop.step_calls:
            name = receiver(step)
            # ``if use_amp: scaled backward + scaler.step  else: plain backward + step`` is fine.
            if ctx.is_optimizer(name) and not ctx.is_scaler(name) and not loop.exclusive(scaled[0], step):
                # After `scaler.unscale_(opt)` (to clip) the gradients are true ones: what is wrong then
                # is that the step is taken whatever they hold, and the scale never adapts.
                what = (f"`{ast.unparse(unscaled[0])}` (line {unscaled[0].lineno}) unscaled the gradients, but "
                        "inf/NaN steps are not skipped and the loss scale never adapts" if unscaled else
                        "the gradients are still multiplied by the loss scale (65536 at first) and inf/NaN steps "
                        "are not skipped")
                yield Hit(
                    step,
                    f"`{ast.unparse(step)}` after `{ast.unparse(scaled[0])}` (line {scaled[0].lineno}): {what}",
                    f"`{scaler}.step({name}); {scaler}.update()` instead of `{ast.unparse(step)}`; {_TK_AMP}",
                )
