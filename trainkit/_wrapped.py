"""Optimizers that wrap another one (accelerate's ``AcceleratedOptimizer``): ``tk.patch`` patches
the optimizer inside.

``accelerator.prepare(optimizer)`` returns a torch Optimizer whose ``step()`` steps the optimizer
it wraps only where gradients sync: under ``accelerator.accumulate(model)`` with
``gradient_accumulation_steps=4``, one call in four (and at the loader's end). Patched itself,
every call was a step: micro-batches counted as optimizer steps, and ``step_time_ms`` a
micro-batch's time. The inner optimizer's own ``step`` is called at real steps only.

Only accelerate's wrappers are looked into (they keep a ``gradient_state``). Another wrapper that
shares its inner optimizer's ``param_groups`` steps it at each of its own steps, and does work of
its own there: a Lookahead (torch-optimizer's) pulls its slow weights every k steps, by a counter
of its steps. Patched through to the inner one, ``tk.accumulate`` held the inner steps back but
not the wrapper's, whose counter then ran n times too fast (slow weights pulled every k
micro-batches), and ``update_ms`` left the wrapper's work out. Such a wrapper is patched itself.
"""
from __future__ import annotations

from typing import Any, Optional


def inner_optimizer(obj: Any) -> Optional[Any]:
    """The optimizer that ``obj``, accelerate's wrapper, wraps and delegates to (its
    ``param_groups`` are the inner one's), innermost first when wrappers nest; None when ``obj``
    is no such wrapper.
    """
    import torch

    d = getattr(obj, "__dict__", None)
    if d is None or "gradient_state" not in d:  # not accelerate's: patched itself (see above)
        return None
    inner = d.get("optimizer")
    if not isinstance(inner, torch.optim.Optimizer) or inner is obj:
        return None
    try:
        delegates = obj.param_groups is inner.param_groups
    except AttributeError:
        return None
    if not delegates:
        return None
    return inner_optimizer(inner) or inner


def repoint_saved_step(obj: Any, inner: Any) -> None:
    """accelerate with a GradScaler (fp16) keeps the inner optimizer's ``step`` as it was at
    ``prepare`` and puts it back after each step: point that copy at the (un)patched step now in
    force, else the first step would undo the patch."""
    if obj.__dict__.get("_optimizer_original_step_method") is None:
        return
    step = obj._optimizer_original_step_method = inner.step
    saved = obj.__dict__.get("_optimizer_patched_step_method")
    if saved is not None:
        def flagged_step(*args: Any, **kwargs: Any) -> Any:  # accelerate's patch_optimizer_step
            obj._accelerate_step_called = True
            return step(*args, **kwargs)  # not inner.step: this function, during the step

        obj._optimizer_patched_step_method = flagged_step
