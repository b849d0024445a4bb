"""TK104-TK106: mistakes inside a ``with tk.accumulate(...)`` (or accelerate's) block.

The block divides the gradients by the micro-batches in each window, clips once per window and
holds ``zero_grad()`` until the window's step: a loss divided again, a clip on every micro-batch,
or a model's own ``zero_grad()`` that the block does not hold each undo part of that. The rules for
hand-written accumulation are in :mod:`trainkit.lint.accumulation`.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, Optional, Set, Tuple

from trainkit.lint._accumulating import tk_accumulate_with
from trainkit.lint._core import FileContext
from trainkit.lint._nodes import dotted, pos
from trainkit.lint._loss import divisor, loss_of, normalisations_before, through_reciprocal_name
from trainkit.lint._registry import Hit, rule


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
    """The ``...accumulate(...)`` call of the ``with`` block around ``node``, if any: named so as
    written (``accelerator.accumulate(model)``) or through the imports (``from trainkit import
    accumulate as tk_acc``, as TK105, TK106 and TK109 resolve it)."""
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and any(
                        (name or "").split(".")[-1].endswith("accumulate")
                        for name in (dotted(expr.func), ctx.qualname(expr.func))):
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
