"""TK1xx: gradient accumulation mistakes (wrong gradients, silently).

Gradient accumulation runs ``backward()`` on N micro-batches and steps once.
The gradients of the N backwards add up, so each loss must be divided by N
*before* its backward, and the gradients must survive until the step.
"""
from __future__ import annotations

import ast
from typing import Iterator, Optional, Tuple

from trainkit.lint._core import FileContext, TrainingLoop, find_modulo, method_name
from trainkit.lint._loss import (backward_operand, late_normalisation, loss_name, normalisation_before,
                                 normalised_before)
from trainkit.lint._registry import Hit, rule

_TK_ACCUMULATE = "or let trainkit do it: `with tk.accumulate(n, optimizer):` divides by the micro-batches actually in each window, a short last window included"


def _accumulating_loops(ctx: FileContext) -> Iterator[Tuple[TrainingLoop, ast.Call, str]]:
    """Each loop that steps under ``if ... % n ...``, its first such step, and ``n`` as written.

    Loops inside trainkit's ``tk.accumulate(...)`` (or accelerate's ``accumulate``)
    are left out: the helper normalises and zeroes for you.
    """
    for loop in ctx.training_loops:
        for step in loop.step_calls:
            guard = loop.modulo_guard(step)
            if guard is not None and not ctx.inside_with(step, ("accumulate",)):
                modulo = find_modulo(guard.test)
                yield loop, step, ast.unparse(modulo.right) if modulo is not None else "N"
                break


@rule(
    "TK101",
    name="loss-normalised-after-backward",
    severity="error",
    summary="the loss is divided after its backward(), so the gradients are not divided",
)
def check_late_normalisation(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss.backward(); loss = loss / n``: the division comes too late to matter."""
    for loop in ctx.training_loops:
        for call in loop.backward_calls:
            name = loss_name(backward_operand(call))
            if normalised_before(loop, call, name):
                continue  # dividing again afterwards (for logging) is harmless
            late = late_normalisation(loop, call, name)
            if late is not None:
                yield Hit(
                    late,
                    f"`{ast.unparse(late)}` divides `{name}` after `{ast.unparse(call)}` on line {call.lineno}: "
                    "the gradients were already computed from the undivided loss",
                    f"move `{ast.unparse(late)}` before `{ast.unparse(call)}`; {_TK_ACCUMULATE}",
                )


@rule(
    "TK102",
    name="accumulation-without-normalisation",
    severity="error",
    summary="gradients accumulated over N micro-batches but the loss is never divided by N",
)
def check_unnormalised_accumulation(ctx: FileContext) -> Iterator[Hit]:
    """Flag an accumulating loop (step under ``% n``) whose loss is never divided."""
    for loop, step, every in _accumulating_loops(ctx):
        for call in loop.backward_calls:
            name = loss_name(backward_operand(call))
            # A division after backward is TK101's finding: one mistake, one report.
            if normalised_before(loop, call, name) or late_normalisation(loop, call, name) is not None:
                continue
            shown = name or ast.unparse(backward_operand(call) or call)
            yield Hit(
                call,
                f"`{ast.unparse(call)}` accumulates gradients over `{every}` micro-batches "
                f"(step on line {step.lineno}) but `{shown}` is never divided: the update is `{every}` times too large",
                f"`{shown} = {shown} / {every}` before backward; {_TK_ACCUMULATE}",
            )


@rule(
    "TK103",
    name="zero-grad-every-micro-batch",
    severity="error",
    summary="zero_grad() runs every micro-batch in a loop that accumulates, so only the last micro-batch counts",
)
def check_zero_grad_every_micro_batch(ctx: FileContext) -> Iterator[Hit]:
    """Flag an unconditional ``zero_grad()`` in a loop whose step is under ``% n``."""
    for loop, step, every in _accumulating_loops(ctx):
        for call in loop.calls:
            if method_name(call) == "zero_grad" and not loop.is_conditional(call):
                yield Hit(
                    call,
                    f"`{ast.unparse(call)}` runs on every micro-batch but the step (line {step.lineno}) "
                    f"runs every `{every}`: the accumulated gradients are wiped, only the last micro-batch is used",
                    f"move `{ast.unparse(call)}` under the same `if` as the step, right after it; {_TK_ACCUMULATE}",
                )


@rule(
    "TK104",
    name="loss-normalised-twice",
    severity="error",
    summary="the loss is divided inside an accumulate block that already divides the gradients",
)
def check_double_normalisation(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss / n`` before backward inside ``with tk.accumulate(...)`` (or accelerate's)."""
    for loop in ctx.training_loops:
        for call in loop.backward_calls:
            if not ctx.inside_with(call, ("accumulate",)):
                continue
            name = loss_name(backward_operand(call))
            node = normalisation_before(loop, call, name)
            if node is not None:
                shown = ast.unparse(node).splitlines()[0]
                yield Hit(
                    node,
                    f"`{shown}` divides the loss inside an `accumulate(...)` block, which already divides "
                    "the gradients by the micro-batches in each window: the update is n times too small",
                    "pass the plain per-micro-batch mean loss (drop the division); "
                    "with `normalize=\"items\"`, count items with `acc.add_items(k)` instead",
                )


def _tk_accumulate_block(ctx: FileContext, node: ast.AST) -> Optional[ast.Call]:
    """The ``tk.accumulate(...)`` call of trainkit's own accumulate block around ``node``, if any.

    Only trainkit's (resolved through the imports): accelerate's ``accumulate`` divides the loss,
    and its ``clip_grad_norm_`` clips only where the gradients are synced.
    """
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call):
                    qual = ctx.qualname(expr.func) or ""
                    if qual.startswith("trainkit.") and qual.endswith(".accumulate"):
                        return expr
    return None


@rule(
    "TK105",
    name="clip-inside-accumulate",
    severity="error",
    summary="clip_grad_norm_ inside a tk.accumulate block clips the undivided running sum at every micro-batch",
)
def check_clip_inside_accumulate(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``clip_grad_norm_(...)`` run inside ``with tk.accumulate(...)``."""
    for call in ctx.calls:
        # through the imports: `from torch.nn.utils import clip_grad_norm_ as clip` too, and the
        # deprecated clip_grad_norm; a method (FSDP1's model.clip_grad_norm_) by its name
        target = (ctx.qualname(call.func) or "").rsplit(".", 1)[-1]
        if target not in ("clip_grad_norm_", "clip_grad_norm"):
            continue
        block = _tk_accumulate_block(ctx, call)
        if block is None:
            continue
        given = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "max_norm"), None)
        max_norm = ast.unparse(given) if given is not None else "max_norm"
        yield Hit(
            call,
            f"`{ast.unparse(call).splitlines()[0]}` runs inside `{ast.unparse(block.func)}(...)` (line "
            f"{block.lineno}), whose window gradients are a running, undivided sum until the real step: "
            "it clips that sum at every micro-batch, not the window's gradient as a big batch would",
            f"drop it and pass `clip_grad_norm={max_norm}` to `{ast.unparse(block.func)}(...)` (or to "
            "`amp.step`), which clips each window's divided gradient once, right before the real step",
        )
