"""TK1xx: gradient accumulation mistakes (wrong gradients, silently).

Gradient accumulation runs ``backward()`` on N micro-batches and steps once.
The gradients of the N backwards add up, so each loss must be divided by N
*before* its backward, and the gradients must survive until the step.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, Optional, Set, Tuple

from trainkit.lint._accumulating import (Accumulation, accumulating_loops, runs_with, stepped_by_another,
                                         tk_accumulate_with)
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._micro_loops import late_hits, unnormalised_hits, wipe_hits
from trainkit.lint._nodes import dotted, method_name, pos, receiver
from trainkit.lint._loss import (backward_operand, divisor, late_normalisation, loss_of, normalisations_before,
                                 normalised_before, through_reciprocal_name)
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


def _is_grad(node: ast.AST) -> bool:
    """``x.grad`` or ``x.grad.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"


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
        if isinstance(node, ast.AugAssign) and _is_grad(node.target):
            if isinstance(node.op, ast.Div) or (isinstance(node.op, ast.Mult) and _reciprocal(node.value)):
                return True
        elif isinstance(node, ast.Assign) and any(_is_grad(t) for t in node.targets):
            v = node.value
            if isinstance(v, ast.BinOp) and (isinstance(v.op, ast.Div)
                                             or (isinstance(v.op, ast.Mult) and _reciprocal(v.right))):
                return True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr == "_foreach_div_":
                return True
            if _is_grad(node.func.value) and node.args and (
                    attr == "div_" or (attr == "mul_" and _reciprocal(node.args[0]))):
                return True
    return False


def _wiping_zero_grads(ctx: FileContext, acc: Accumulation) -> Iterator[ast.Call]:
    """The ``zero_grad()`` calls that run on every micro-batch of ``acc``'s loop, wiping its sum (TK103)."""
    for call in acc.loop.calls:
        if method_name(call) != "zero_grad" or acc.loop.is_conditional(call):
            continue
        owner = receiver(call)
        if ctx.is_optimizer(owner) and acc.optimizer is not None and owner != acc.optimizer:
            continue  # another optimizer, stepped on every batch, zeroes its own gradients
        yield call


@rule(
    "TK103",
    name="zero-grad-every-micro-batch",
    severity="error",
    summary="zero_grad() runs every micro-batch in a loop that accumulates, so only the last micro-batch counts",
)
def check_zero_grad_every_micro_batch(ctx: FileContext) -> Iterator[Hit]:
    """Flag an unconditional ``zero_grad()`` in a loop whose step is under ``% n``."""
    for acc in accumulating_loops(ctx):
        for call in _wiping_zero_grads(ctx, acc):
            yield Hit(
                call,
                f"`{ast.unparse(call)}` runs on every micro-batch but the step (line {acc.step.lineno}) "
                f"runs every `{acc.every}`: the accumulated gradients are wiped, only the last micro-batch is used",
                f"move `{ast.unparse(call)}` {acc.place('under the same `if` as the step')}, right after it; "
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


@rule(
    "TK104",
    name="loss-normalised-twice",
    severity="error",
    summary="the loss is divided inside an accumulate block that already divides the gradients",
)
def check_double_normalisation(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss / n`` before backward inside ``with tk.accumulate(...)`` (or accelerate's).

    Only a division by the accumulation count is reported: ``n`` as passed to
    ``tk.accumulate(n, ...)``, an integer literal, or a name that says so
    (``accum_steps``, ``gradient_accumulation_steps``). A per-micro-batch mean such as
    ``(tok * mask).sum() / mask.sum()`` is the plain loss the block expects.
    """
    for loop in ctx.training_loops:
        found = []  # (backward, block, the division by the count before it, or None)
        for call in loop.backward_calls:
            block = _accumulate_call(ctx, call)
            if block is None:
                continue
            name = loss_of(loop, call)
            hit = None
            for node in normalisations_before(loop, call, name):
                by = divisor(node, ctx.reciprocal_names)
                by = through_reciprocal_name(ctx, by) if by is not None else None
                if by is not None and _is_count(by, block):
                    hit = (node, by)
                    break
            found.append((call, block, hit))
        # Several losses, each its own backward (ce.backward(retain_graph=True); aux.backward()):
        # one of them scaled by 1/k is that loss's weight, not the window's count. Only when
        # every backward's loss in the loop is divided is the loss divided.
        if any(hit is None for _, _, hit in found):
            continue
        for _, block, (node, by) in found:
            shown = ast.unparse(node).splitlines()[0]
            count = _shown_count(by)
            yield Hit(
                node,
                f"`{shown}` divides the loss by `{count}` inside `{ast.unparse(block.func)}(...)` (line "
                f"{block.lineno}), which already divides the gradients by the micro-batches in each window: "
                f"the update is `{count}` times too small",
                "pass the plain per-micro-batch mean loss (drop the division); "
                "with `normalize=\"items\"`, count items with `acc.add_items(k)` instead",
            )


_COUNT_RE = re.compile(r"accum|grad_?acc|micro", re.IGNORECASE)


def _literal_count(by: ast.Constant) -> Optional[int]:
    """The count a literal divides by: ``4`` for ``/ 4``, ``4`` for ``* 0.25``; None for a
    factor that is no 1 / k (``0.3``), or a fractional divisor."""
    value = by.value
    if isinstance(value, float) and 0 < value < 1:  # a multiplier: loss * 0.25
        value = 1 / value
    if not isinstance(value, (int, float)) or value < 1 or abs(value - round(value)) > 1e-9:
        return None
    return int(round(value))


def _shown_count(by: ast.expr) -> str:
    """``by`` as the message shows it: the count a multiplier literal stands for (``4`` for 0.25)."""
    if isinstance(by, ast.Constant) and isinstance(by.value, float) and 0 < by.value < 1:
        count = _literal_count(by)
        if count is not None:
            return str(count)
    return ast.unparse(by)


def _accumulate_call(ctx: FileContext, node: ast.AST) -> Optional[ast.Call]:
    """The ``...accumulate(...)`` call of the ``with`` block around ``node``, if any."""
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and (dotted(expr.func) or "").split(".")[-1].endswith("accumulate"):
                    return expr
    return None


def _is_count(by: ast.expr, block: ast.Call) -> bool:
    """Whether ``by`` is the accumulation count of ``block``: its ``n``, a literal (the very
    count when the block's is a literal: ``/ 2`` under ``accumulate(4, ...)`` is a loss's weight;
    a multiplier such as ``0.25``, only as ``1 / n`` of a literal ``n``), or so named."""
    given = block.args[0] if block.args else next((k.value for k in block.keywords if k.arg == "n"), None)
    if given is not None and ast.dump(given) == ast.dump(by):
        return True
    if isinstance(by, ast.Constant) and isinstance(by.value, (int, float)) and not isinstance(by.value, bool):
        n = given.value if isinstance(given, ast.Constant) and isinstance(given.value, int) \
            and not isinstance(given.value, bool) else None
        count = _literal_count(by)
        if count is None:  # a weight such as 0.1 or 0.3: no count divides by it
            return False
        return count == n if n is not None else not (isinstance(by.value, float) and by.value < 1)
    name = dotted(by)
    return name is not None and bool(_COUNT_RE.search(name.split(".")[-1]))


def _tk_accumulate_block(ctx: FileContext, node: ast.AST) -> Optional[ast.Call]:
    """The ``tk.accumulate(...)`` call of trainkit's own accumulate block around ``node``, if any."""
    found = tk_accumulate_with(ctx, node)
    return found[1] if found is not None else None


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


_LOOP_NODES = (ast.For, ast.AsyncFor, ast.While)


def _runs_in_a_window(ctx: FileContext, call: ast.Call, block: ast.AST) -> bool:
    """Whether ``call`` runs while a window of the accumulate ``block`` holds gradients.

    In a loop inside the block it runs at every micro-batch, after the previous one's
    backward. In a block inside a loop (one block per epoch, or per batch), a call placed
    before the block's first backward finds the window empty (the previous block's exit
    stepped and zeroed), so there only a call after a backward of the block counts.
    """
    if any(isinstance(p, _LOOP_NODES) for p in ctx.ancestors(call, stop=block)):
        return True
    if not any(isinstance(p, _LOOP_NODES) for p in ctx.ancestors(block)):
        return False
    here = pos(call)
    return any(isinstance(n, ast.Call) and ctx.is_backward(n) and pos(n) < here for n in ast.walk(block))


def _held_by(acc: ast.Call) -> Tuple[Optional[ast.expr], Optional[ast.expr]]:
    """The optimizer and the ``model=`` of a ``tk.accumulate(n, optimizer, model=...)`` call."""
    optimizer = acc.args[1] if len(acc.args) > 1 else next(
        (k.value for k in acc.keywords if k.arg == "optimizer"), None)
    model = next((k.value for k in acc.keywords if k.arg == "model"), None)
    return optimizer, model


def _held_by_outer_blocks(ctx: FileContext, node: ast.AST) -> Set[Optional[str]]:
    """The optimizers and models whose ``zero_grad()`` every ``tk.accumulate`` block around
    ``node`` holds: a GAN's ``with tk.accumulate(n, opt_d), tk.accumulate(n, opt_g):`` holds both
    (the innermost block alone holds only one)."""
    out: Set[Optional[str]] = set()
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and (ctx.qualname(expr.func) or "").startswith("trainkit.") \
                        and (ctx.qualname(expr.func) or "").endswith(".accumulate"):
                    out.update(dotted(given) for given in _held_by(expr) if given is not None)
    return out


@rule(
    "TK106",
    name="zero-grad-not-held-inside-accumulate",
    severity="error",
    summary="zero_grad() on the model (or anything but the block's optimizer) inside a tk.accumulate block "
            "wipes the window's running sum",
)
def check_zero_grad_not_held_inside_accumulate(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``model.zero_grad()`` inside ``with tk.accumulate(n, optimizer):`` not given ``model=model``.

    trainkit makes the block's ``optimizer.zero_grad()`` a no-op while a window is open,
    and the model's own ``zero_grad()`` too when the block is given ``model=``; any other
    ``zero_grad()`` really zeroes. Another optimizer's ``zero_grad()`` (a GAN's
    discriminator, stepped on every batch) zeroes only its own parameters and is not
    reported, as in TK103.
    """
    for call in ctx.calls:
        if not isinstance(call.func, ast.Attribute) or call.func.attr != "zero_grad":
            continue
        found = tk_accumulate_with(ctx, call)
        if found is None:
            continue
        block, acc = found
        if any(k.arg is None for k in acc.keywords) or any(isinstance(a, ast.Starred) for a in acc.args):
            continue  # `**kwargs`: the optimizer or model= cannot be seen
        owner = dotted(call.func.value)
        if owner is None or (ctx.qualname(call.func.value) or "").startswith("torch."):
            continue  # `opts[i].zero_grad()`, `get_model().zero_grad()`, `nn.Module.zero_grad(m)`: unknown
        optimizer, model = _held_by(acc)
        held = [dotted(given) for given in (optimizer, model) if given is not None]
        if owner in held or ctx.is_optimizer(owner) or owner in _held_by_outer_blocks(ctx, call):
            continue  # held by the block, or another optimizer zeroing only its own parameters
        if not _runs_in_a_window(ctx, call, block):
            continue
        shown = ast.unparse(call).splitlines()[0]
        opt_name = (dotted(optimizer) if optimizer is not None else None) or "optimizer"
        func = ast.unparse(acc.func)
        holds = f"`{opt_name}.zero_grad()`"
        fix = f"call `{opt_name}.zero_grad()` instead: inside the block it is held until each real step"
        if model is not None:
            holds += f" and `{ast.unparse(model)}.zero_grad()`"
        else:
            fix += f"; or pass `model={owner}` to `{func}(...)`, which then holds `{owner}.zero_grad()` inside a window too"
        yield Hit(
            call,
            f"`{shown}` runs inside `{func}(...)` (line {acc.lineno}), which holds only {holds} inside a "
            "window: this one really zeroes, wiping the window's running gradient sum at every micro-batch, "
            "so the real step never sees the window's summed gradient (at most the last micro-batch's)",
            fix,
        )
