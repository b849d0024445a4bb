"""Optimizers that wrap another one (accelerate's ``AcceleratedOptimizer``): ``tk.patch`` patches
the optimizer inside.

``accelerator.prepare(optimizer)`` returns a torch Optimizer whose ``step()`` steps the optimizer
it wraps only where gradients sync: under ``accelerator.accumulate(model)`` with
``gradient_accumulation_steps=4``, one call in four (and at the loader's end). Patched itself,
every call was a step: micro-batches counted as optimizer steps, and ``step_time_ms`` a
micro-batch's time. The inner optimizer's own ``step`` is called at real steps only.
"""
from __future__ import annotations

from typing import Any, Optional


def inner_optimizer(obj: Any) -> Optional[Any]:
    """The optimizer ``obj`` wraps and delegates to (its ``param_groups`` are the inner one's),
    innermost first when wrappers nest (DeepSpeed's inside accelerate's); None when it wraps none.
    """
    import torch

    inner = obj.__dict__.get("optimizer") if hasattr(obj, "__dict__") else None
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
