"""What ``tk.accumulate`` (and ``amp.step``'s ``clip_grad_norm``) refuse, before any state changes,
and what an accumulate block warns of, once each (:func:`warn_once`)."""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, List, Literal, NoReturn, Optional, Tuple

from .._text import brief, user_stacklevel
from .._wrapped import inner_optimizer
from . import data_parallel as dp

Normalize = Literal["mean", "items"]
_NORMALIZE = ("mean", "items")


def check_args(n: Any, optimizer: Any, model: Any, normalize: Any,
           clip_grad_norm: Any) -> Tuple[int, Optional[float]]:
    """Refuse bad arguments before any state changes; n as an int, the max norm as a float."""
    import torch

    if isinstance(n, torch.optim.Optimizer) and isinstance(optimizer, numbers.Integral):
        raise TypeError(f"accumulate({brief(n)}, {optimizer!r}): the arguments are swapped; "
                        f"the count comes first, e.g. accumulate({optimizer!r}, optimizer)")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"accumulate(n={brief(n)}): n must be a positive int (micro-batches per "
                         f"optimizer step), e.g. accumulate(4, optimizer)")
    n = int(n)  # a numpy integer too
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"accumulate({n}, optimizer={brief(optimizer)}): expected a "
                        f"torch.optim.Optimizer, got {type(optimizer).__name__}; e.g. "
                        f"accumulate({n}, torch.optim.SGD(model.parameters(), lr=0.1))")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"accumulate({n}, optimizer, model={brief(model)}): model must be the "
                        f"nn.Module (e.g. the DistributedDataParallel wrapper) or None")
    if normalize not in _NORMALIZE:
        raise ValueError(f"accumulate({n}, optimizer, normalize={normalize!r}): normalize must be "
                         f"one of {', '.join(map(repr, _NORMALIZE))}; use 'items' with "
                         f"acc.add_items(k) to divide by tokens, e.g. normalize='items'")
    max_norm = check_clip(clip_grad_norm, f"accumulate({n}, optimizer, ...)")
    dp.check_model(n, dp.unwrap_compiled(model), normalize)
    inner = inner_optimizer(optimizer)  # accelerate's prepared optimizer: the gate goes there
    if inner is not None:
        _check_wrapper(n, optimizer)
    if isinstance(inner or optimizer, torch.optim.LBFGS):
        raise TypeError(f"accumulate({n}, {type(optimizer).__name__}): LBFGS evaluates its closure "
                        f"several times per step, at new parameters each time, so its steps cannot "
                        f"be split into micro-batches; use a larger batch in the closure instead")
    return n, max_norm


def _check_wrapper(n: int, optimizer: Any) -> None:
    """A wrapping optimizer (accelerate's ``AcceleratedOptimizer``) that accumulates itself, or
    steps through a GradScaler, cannot be the gate's: refused."""
    name = type(optimizer).__name__
    steps = getattr(getattr(optimizer, "gradient_state", None), "num_steps", 1)
    if isinstance(steps, numbers.Integral) and steps > 1:
        # Its step() reaches the inner optimizer once in `steps` calls: windows of n * steps
        # micro-batches, each divided by `steps` (accelerate's backward) and n (the gate), and a
        # partial last window by neither rightly.
        raise ValueError(
            f"accumulate({n}, {name}): this optimizer accumulates gradients itself "
            f"(accelerate's gradient_accumulation_steps={steps}); accumulating twice makes "
            f"windows of {n}x{steps} micro-batches, divided wrongly. Accumulate once: "
            f"Accelerator(gradient_accumulation_steps=1) with tk.accumulate({n}, optimizer), or "
            f"accelerate's gradient_accumulation_steps={n} with accelerator.accumulate(model) "
            f"and no tk.accumulate")
    scaler = getattr(optimizer, "scaler", None)
    if scaler is not None and getattr(scaler, "is_enabled", lambda: True)():
        raise ValueError(
            f"accumulate({n}, {name}): this optimizer steps through accelerate's GradScaler "
            f"(mixed_precision='fp16'), which unscales the gradients at every micro-batch and "
            f"so corrupts the accumulated sum; use mixed_precision='bf16' (no scaler) or 'no', "
            f"or accelerate's own gradient_accumulation_steps={n} without tk.accumulate")


def check_clip(max_norm: Any, call: str) -> Optional[float]:
    """``max_norm`` as a float, refusing what is not a finite number > 0 (a negative one flips the
    gradients, a NaN makes them NaN); None stays None (no clipping)."""
    if max_norm is None:
        return None
    value = math.nan
    if isinstance(max_norm, numbers.Real) and not isinstance(max_norm, bool):
        try:
            value = float(max_norm)
        except OverflowError:  # an int past float's range
            value = math.inf
    elif type(max_norm).__name__ == "Tensor" and max_norm.numel() == 1 \
            and max_norm.dtype.is_floating_point:
        value = float(max_norm)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{call}: clip_grad_norm={brief(max_norm)} is not a max norm; pass a "
                         f"finite number > 0 (or None: no clipping), e.g. clip_grad_norm=1.0")
    return value


def items_value(acc: Any, k: Any) -> float:
    """``acc.add_items(k)``'s ``k`` as a float, refusing what is no count of items, and any count
    where the window is divided by its micro-batches (``normalize="mean"``): there the items were
    dropped without a word, and losses summed over a micro-batch (``reduction="sum"``, as one
    writes for "items") were divided by the micro-batches alone: an update k times too large."""
    if isinstance(k, (bool, str, bytes)):
        raise TypeError(f"add_items({k!r}): k must be a number of items, e.g. acc.add_items(len(y))")
    try:
        v = float(k)  # a 0-d tensor too (y.numel() is an int; a mask's .sum() a tensor)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"add_items({brief(k)}): k must be a number of items, "
                        f"e.g. acc.add_items(len(y))") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"add_items({k!r}): k must be a finite number >= 0 of items in this "
                         f"micro-batch, e.g. acc.add_items(len(y))")
    if acc.normalize != "items":
        raise ValueError(f"add_items({k!r}) in tk.accumulate({acc.n}, optimizer) (normalize="
                         f"{acc.normalize!r}): its windows are divided by their micro-batches, "
                         f"and items counted are not used; to divide by them (losses with "
                         f"reduction='sum'), use tk.accumulate({acc.n}, optimizer, "
                         f"normalize='items')")
    return v


def check_item_calls(acc: Any, micro_batches: int) -> None:
    """Warn (once a block) where a window ends with fewer ``add_items`` calls than micro-batches:
    called after ``optimizer.step()``, each window's last micro-batch's items went to the next
    window, and the first window was divided by too few (5 items for 10, a 2x update)."""
    if acc.normalize != "items" or not 0 < acc._adds < micro_batches:
        return  # none at all: prepare() refuses the window, saying how
    warn_once(acc, "add_items",
        f"tk.accumulate({acc.n}, normalize='items'): acc.add_items was called {acc._adds} "
        f"time(s) in a window of {micro_batches} micro-batches. Called after optimizer.step(), "
        f"a window's last micro-batch's items count in the next window, and the first one is "
        f"divided by too few (its update too large). Call acc.add_items(k) once per "
        f"micro-batch, before its optimizer.step(), e.g. right after the loss: "
        f"acc.add_items(y.numel())")


def grad_marks(optimizer: Any) -> List[Tuple[Any, int]]:
    """Each gradient of ``optimizer``'s parameters with its version (bumped by every in-place
    change: a backward adding to it, a division), for :func:`check_added_grads`."""
    return [(p.grad, p.grad._version) for g in optimizer.param_groups for p in g["params"]
            if p.grad is not None]


def check_added_grads(acc: Any) -> None:
    """Warn (once a block) of a ``zero_grad()`` held inside a window where gradients were added
    to the optimizer's parameters after its last ``step()`` call: another loss's backward reached
    them (a GAN's generator loss through the discriminator, which the tutorials' next
    ``netD.zero_grad()`` clears), or a backward failed halfway (out of memory) and the
    ``zero_grad()`` was meant to drop its batch; holding it keeps them in the window's sum."""
    now = grad_marks(acc.optimizer)
    if len(now) == len(acc._marks) and all(
            t is u and v == w for (t, v), (u, w) in zip(acc._marks, now)):
        return
    warn_once(acc, "added grads",
        f"zero_grad() inside a tk.accumulate({acc.n}, {type(acc.optimizer).__name__}) window is "
        f"held, but gradients were added to its parameters since its last optimizer.step() "
        f"call: they stay in the window's sum, which a big batch would not have. If another "
        f"loss's backward reached them (a GAN's generator loss through the discriminator), keep "
        f"it off these parameters: discriminator.requires_grad_(False) around the generator's "
        f"backward (and requires_grad_(True) after). If a backward failed halfway (out of "
        f"memory) and this zero_grad() was to drop its batch, it cannot inside a window: let "
        f"the error leave the tk.accumulate block, which drops the window in progress, and open "
        f"a new block on the remaining batches (README, tk.accumulate)")


def refuse_user_scaler_step(n: int, *, boundary: bool) -> NoReturn:
    """Refuse a ``scaler.step(optimizer)`` of the user's inside ``tk.accumulate``: inside a
    window, and at its end too, where it is still wrong: a step GradScaler skips (inf/nan) never
    reaches the gate, so the window would stay open with the inf in it for good, and a partial
    last window, stepped on exit, would step on scaled gradients."""
    if not boundary:
        raise RuntimeError(
            "scaler.step(optimizer) inside tk.accumulate: GradScaler unscales the "
            "gradients at every micro-batch, which corrupts the accumulated sum (and its "
            "update() changes the scale mid-window). Use amp.step(optimizer) from "
            "`with tk.autocast_scaled(scaler) as amp`, which unscales only at the "
            "window's last micro-batch")
    raise RuntimeError(
        f"scaler.step(optimizer) inside tk.accumulate({n}, ...), even at a window's "
        f"end: a step GradScaler skips (inf/nan gradients) is one trainkit cannot see, so "
        f"the window would never close, and the exit's step of a partial last window "
        f"would use scaled gradients. Use amp.step(optimizer) from "
        f"`with tk.autocast_scaled(scaler) as amp` at every micro-batch")


def warn_scaled_step(acc: Any) -> None:
    """Warn (once a block) of a plain ``optimizer.step()`` ending a window in which
    ``amp.backward`` scaled a loss: unless that loss was another optimizer's, the step uses
    gradients scale times too large (65536 by default) and never skips an inf/nan."""
    warn_once(acc, "scaled step",
        f"optimizer.step() ends a tk.accumulate({acc.n}, ...) window in which amp.backward "
        f"scaled a loss by the GradScaler: if that loss trained this optimizer, the step uses "
        f"gradients scale times too large (and never skips an inf/nan). Use amp.step(optimizer), "
        f"which unscales, skips bad steps and updates the scale")


def warn_once(acc: Any, what: str, message: str, category: type = RuntimeWarning) -> None:
    """Warn of ``what`` once per accumulate block ``acc``, pointing at the user's line."""
    if what in acc._said:
        return
    acc._said.add(what)
    warnings.warn(message, category, stacklevel=user_stacklevel())
