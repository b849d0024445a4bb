"""What ``tk.accumulate`` (and ``amp.step``'s ``clip_grad_norm``) refuse, before any state changes."""
from __future__ import annotations

import math
import numbers
from typing import Any, Literal, Optional, Tuple

from .._text import brief
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
