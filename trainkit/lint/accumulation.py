"""TK1xx: gradient accumulation mistakes (wrong gradients, silently).

Gradient accumulation runs ``backward()`` on N micro-batches and steps once.
The gradients of the N backwards add up, so each loss must be divided by N
*before* its backward, and the gradients must survive until the step. These rules read
hand-written accumulation; those inside a ``tk.accumulate`` block (TK104-TK106) are in
:mod:`trainkit.lint.accumulate_blocks`.
"""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from trainkit.lint._accumulating import (Accumulation, accumulating_loops, runs_with, stepped_by_another,
                                          is_grad, zeroes_gradients, zeroing_owner)
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._micro_loops import late_hits, unnormalised_hits, wipe_hits
from trainkit.lint._nodes import dotted
from trainkit.lint._loss import backward_operand, late_normalisation, loss_of, normalised_before
from trainkit.lint._registry import Hit, rule

_TK_ACCUMULATE = "or let trainkit do it: `with tk.accumulate(n, optimizer):` divides by the micro-batches actually in each window, a short last window included"


@rule(
    "TK101",
    name="loss-normalised-after-backward",
    severity="error",
    summary="the loss is divided after its backward(), so the gradients are not divided",
)
def check_late_normalisation(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss.backward(); loss = loss / n`` in a loop that accumulates: the division comes too late."""
    for acc in accumulating_loops(ctx):
        loop = acc.loop
        for call in acc.backwards:
            name = loss_of(loop, call)
            if normalised_before(loop, call, name):
                continue  # dividing again afterwards (for logging) is harmless
            late = late_normalisation(loop, call, name)
            if late is not None:
                yield Hit(
                    late,
                    f"`{ast.unparse(late)}` divides `{name}` after `{ast.unparse(call)}` on line {call.lineno}: "
                    f"the gradients summed over `{acc.every}` micro-batches were already computed from the "
                    "undivided loss",
                    f"move `{ast.unparse(late)}` before `{ast.unparse(call)}`; {_TK_ACCUMULATE}",
                )
    yield from late_hits(ctx)  # `for micro in range(n): loss.backward(); loss /= n`, then the step


@rule(
    "TK102",
    name="accumulation-without-normalisation",
    severity="error",
    summary="gradients accumulated over N micro-batches but the loss is never divided by N",
)
def check_unnormalised_accumulation(ctx: FileContext) -> Iterator[Hit]:
    """Flag an accumulating loop (step under ``% n``) whose loss is never divided."""
    for acc in accumulating_loops(ctx):
        loop, every = acc.loop, acc.every
        for call in acc.backwards:
            name = loss_of(loop, call)
            # A division after backward is TK101's finding: one mistake, one report.
            if normalised_before(loop, call, name) or late_normalisation(loop, call, name) is not None:
                continue
            if _divides_gradients(loop.region):
                continue  # the gradients are divided by hand before the step: the mean all the same
            shown = name or ast.unparse(backward_operand(call) or call)
            head = (f"`{ast.unparse(call)}` accumulates gradients over `{every}` micro-batches "
                    f"(step on line {acc.step.lineno}) but `{shown}` is never divided")
            # With TK103's zero_grad the step sees one micro-batch, so "too large" would be false
            # today and dividing alone would make it too small: the two fixes go together.
            wipe = next(iter(_wiping_zero_grads(ctx, acc)), None)
            if wipe is None:
                late = _wiped_before_step(ctx, acc)
                if late is not None:  # TK113's: the step finds no gradient, too large is false today
                    yield Hit(
                        call,
                        f"{head}: for now `{ast.unparse(late)}` on line {late.lineno} wipes the window "
                        f"before the step (TK113), so the step finds no gradient; once that is fixed, the "
                        f"update is `{every}` times too large",
                        f"fix both together: `{shown} = {shown} / {every}` before backward and "
                        f"`{ast.unparse(late)}` after the step; {_TK_ACCUMULATE}",
                    )
                    continue
                yield Hit(call, f"{head}: the update is `{every}` times too large",
                          f"`{shown} = {shown} / {every}` before backward; {_TK_ACCUMULATE}")
                continue
            under = acc.place("under the step's `if`")
            yield Hit(
                call,
                f"{head}: for now `{ast.unparse(wipe)}` on line {wipe.lineno} wipes the sum (TK103), so the "
                f"update is one micro-batch's; once that is fixed, it is `{every}` times too large",
                f"fix both together: `{shown} = {shown} / {every}` before backward and `{ast.unparse(wipe)}` "
                f"{under} (dividing alone makes the update `{every}` times too small); {_TK_ACCUMULATE}",
            )
    yield from unnormalised_hits(ctx)  # `for micro_step in range(accum): loss.backward()`, then the step


def _reciprocal(node: ast.AST) -> bool:
    """``1 / n`` (``1.0 / n``): a multiplication by it is a division."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            and isinstance(node.left, ast.Constant) and node.left.value == 1)


def _divides_gradients(region: list) -> bool:
    """Whether the loop's iteration divides gradients by hand (``p.grad /= n``,
    ``p.grad.div_(n)``, ``p.grad.mul_(1 / n)``, ``p.grad = p.grad / n``,
    ``torch._foreach_div_(grads, n)``): the step then sees a mean, the loss undivided. A
    multiplication by anything but a reciprocal (a clip coefficient) is no division."""
    for node in region:
        if isinstance(node, ast.AugAssign) and is_grad(node.target):
            if isinstance(node.op, ast.Div) or (isinstance(node.op, ast.Mult) and _reciprocal(node.value)):
                return True
        elif isinstance(node, ast.Assign) and any(is_grad(t) for t in node.targets):
            v = node.value
            if isinstance(v, ast.BinOp) and (isinstance(v.op, ast.Div)
                                             or (isinstance(v.op, ast.Mult) and _reciprocal(v.right))):
                return True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr == "_foreach_div_":
                return True
            if is_grad(node.func.value) and node.args and (
                    attr == "div_" or (attr == "mul_" and _reciprocal(node.args[0]))):
                return True
    return False


def _wiped_before_step(ctx: FileContext, acc: Accumulation) -> Optional[ast.AST]:
    """The zeroing TK113 reports in ``acc``'s loop (between the window's last backward and its
    step, under the step's ``if``), or None."""
    from trainkit.lint.zero_grad import wasted_zeroings

    inside = {id(n) for n in acc.loop.region}
    return next((h.node for h in wasted_zeroings(ctx) if id(h.node) in inside), None)


def _wiping_zero_grads(ctx: FileContext, acc: Accumulation) -> Iterator[ast.AST]:
    """The ``zero_grad()`` calls (and ``p.grad = None`` assignments) that run on every micro-batch of
    ``acc``'s loop, wiping its sum (TK103). Not those that zero only another optimizer's gradients:
    another optimizer's ``zero_grad()``, or that of a model the file hands only to other optimizers
    (the DCGAN tutorial's ``netD.zero_grad()`` while the generator accumulates)."""
    for node in acc.loop.region:
        if not zeroes_gradients(node) or acc.loop.is_conditional(node):
            continue
        if ctx.zeroes_only_others(zeroing_owner(acc.loop, node), acc.optimizer):
            continue  # another optimizer's (or model's) gradients, stepped on every batch
        yield node


@rule(
    "TK103",
    name="zero-grad-every-micro-batch",
    severity="error",
    summary="zero_grad() runs every micro-batch in a loop that accumulates, so only the last micro-batch counts",
)
def check_zero_grad_every_micro_batch(ctx: FileContext) -> Iterator[Hit]:
    """Flag an unconditional ``zero_grad()`` (or ``p.grad = None``) in a loop whose step is under ``% n``.

    ``for p in model.parameters(): p.grad = None`` (the "set gradients to None" speed tip) wipes the
    window as ``zero_grad()`` does. Not flagged: a zeroing of another optimizer, or of a model the file
    builds only other optimizers on (the DCGAN tutorial's ``netD.zero_grad()`` while G accumulates).
    """
    for acc in accumulating_loops(ctx):
        for node in _wiping_zero_grads(ctx, acc):
            shown = ast.unparse(node)
            moved = f"`{shown}`" if isinstance(node, ast.Call) else f"`{shown}` (with its `for` loop)"
            yield Hit(
                node,
                f"`{shown}` runs on every micro-batch but the step (line {acc.step.lineno}) "
                f"runs every `{acc.every}`: the accumulated gradients are wiped, only the last micro-batch is used",
                f"move {moved} {acc.place('under the same `if` as the step')}, right after it; "
                f"{_TK_ACCUMULATE}",
            )
    yield from wipe_hits(ctx)  # `for micro in chunks: zero_grad(); backward()`, then the step


_CLIPS = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_")


@rule(
    "TK107",
    name="clip-every-micro-batch",
    severity="error",
    summary="clip_grad_norm_ on every micro-batch of a loop that accumulates clips partial sums, "
            "not the window's gradient",
)
def check_clip_every_micro_batch(ctx: FileContext) -> Iterator[Hit]:
    """Flag a gradient clip that runs on micro-batches where the accumulating step does not."""
    for acc in accumulating_loops(ctx):
        loop = acc.loop
        guard = acc.guard
        for call in loop.calls:
            if (ctx.qualname(call.func) or "").rsplit(".", 1)[-1] not in _CLIPS:
                continue
            if runs_with(loop, call, guard, acc.step):
                continue  # clipped with the step: the window's whole gradient
            if stepped_by_another(ctx, loop, call, acc.optimizer):
                continue  # another optimizer's gradients, stepped on every batch
            shown = ast.unparse(call).splitlines()[0]
            yield Hit(
                call,
                f"`{shown}` runs on every micro-batch but the step (line {acc.step.lineno}) runs every "
                f"`{acc.every}`: it clips the running, partial gradient sum at each micro-batch (rescaling what "
                "the earlier micro-batches added), not the window's gradient as a big batch would",
                f"move it {acc.place('under the same `if` as the step')}, right before the step (after "
                "`scaler.unscale_(...)` with a GradScaler); or `with tk.accumulate(n, optimizer, "
                "clip_grad_norm=max_norm):`, which clips each window's divided gradient once",
            )


def _zero_based_index(ctx: FileContext, loop: TrainingLoop, name: str) -> Optional[str]:
    """What makes ``name`` count from 0, never rebound in the loop: ``"enumerate(...)"`` for ``for
    name, ... in enumerate(x)``, ``"range(...)"`` for ``for name in range(n)`` (an RL loop over
    environment steps; also ``range(0, n)``, ``trange(n)``, ``tqdm(range(n))``,
    ``itertools.count()``); else None."""
    node = loop.node
    if not isinstance(node, (ast.For, ast.AsyncFor)) or not isinstance(node.iter, ast.Call):
        return None
    call = node.iter
    target = node.target
    if dotted(call.func) == "enumerate":
        if len(call.args) != 1 or call.keywords:
            return None  # `enumerate(x, 1)`, `enumerate(x, start=1)` count from 1
        first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else None
        origin = "enumerate(...)"
    else:
        first = target
        origin = _counts_from_zero(ctx, call)
        if origin is None:
            return None
    if not (isinstance(first, ast.Name) and first.id == name):
        return None
    if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in loop.region):
        return None
    return origin


def _counts_from_zero(ctx: FileContext, call: ast.Call) -> Optional[str]:
    """``"range(...)"`` when ``call`` yields 0, 1, 2, ...: ``range(n)``, ``range(0, n)``,
    ``range(0, n, 1)``, ``trange(n)``, ``tqdm(range(n), ...)``, ``itertools.count()``."""
    name = (ctx.qualname(call.func) or "").split(".")[-1]
    if name == "tqdm" and call.args and isinstance(call.args[0], ast.Call):
        return _counts_from_zero(ctx, call.args[0])
    if name == "count":
        return "count()" if not call.args and not call.keywords else None
    if name not in ("range", "trange") or call.keywords or not call.args:
        return None
    args = call.args
    zero, one = (lambda a: _literal(a, 0)), (lambda a: _literal(a, 1))
    if len(args) == 1 or (len(args) == 2 and zero(args[0])) or (len(args) == 3 and zero(args[0]) and one(args[2])):
        return f"{name}(...)"
    return None


def _literal(node: ast.expr, value: int) -> bool:
    return isinstance(node, ast.Constant) and node.value == value and not isinstance(node.value, bool)


@rule(
    "TK108",
    name="first-window-of-one",
    severity="error",
    summary="step under `i % n == 0` with i counting from 0: the first window holds one micro-batch, "
            "later windows are shifted by one",
)
def check_first_window_of_one(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``if step % n == 0:`` stepping an accumulation where ``step`` comes from ``enumerate(...)``."""
    for acc in accumulating_loops(ctx):
        guard = acc.guard
        side = acc.loop.side_of(acc.step, guard)
        if not isinstance(guard, ast.If) or side is None or acc.loop.stand_in(guard):
            continue  # a nested exit (`if warm: if i % n != 0: continue`) steps on other batches too
        # `if i % n == 0: step`, `if i % n != 0: continue` before it, or a name bound to either
        for test, holds in acc.loop.tests_for(guard, side):
            if not (len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq if holds else ast.NotEq)):
                continue
            sides = [test.left, test.comparators[0]]
            modulo = next((x for x in sides if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mod)), None)
            zero = any(isinstance(x, ast.Constant) and x.value == 0 and not isinstance(x.value, bool) for x in sides)
            if modulo is None or not zero or not isinstance(modulo.left, ast.Name):
                continue
            index = modulo.left.id
            origin = _zero_based_index(ctx, acc.loop, index)
            if origin is None:
                continue
            every = ast.unparse(modulo.right)
            loop = acc.loop
            if all(normalised_before(loop, b, loss_of(loop, b)) for b in acc.backwards):
                first = f"its loss still divided by `{every}`, so that update is `{every}` times too small"
            else:  # TK102 (or TK101) fires too: dividing is still to come
                first = (f"its loss not yet divided before backward; once divided by `{every}`, "
                         f"that update is `{every}` times too small")
            shown = f"`{ast.unparse(test)}`" if holds else f"stepping where `{ast.unparse(test)}` is false,"
            yield Hit(
                test,
                f"{shown} with `{index}` counting from 0 (`{origin}`) steps after the very "
                f"first micro-batch: each pass's first window holds one micro-batch ({first}) and every later "
                "window is shifted by one",
                f"`({index} + 1) % {every} {'==' if holds else '!='} 0` (and step once more after the loop for a "
                f"short last window); {_TK_ACCUMULATE}",
            )
            break
