"""The ``fused`` technique: the optimizer's single-kernel update, switched at ``tk.patch``.

``tk.patch(optimizer)`` asks ``tk.technique("fused", <current value>)``; only when the answer
differs (an ablation override) does it change ``param_groups[i]["fused"]`` and
``defaults["fused"]``, and only where fused is valid: the optimizer has a ``fused`` option
(Adam, AdamW, SGD, Adagrad...), every parameter is a floating tensor on a device with fused
kernels (CUDA; the CPU too since torch 2.4), and the group is not ``differentiable``. Turning it
on also turns ``foreach`` off (the two cannot both be True). ``tk.unpatch`` restores the values.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional


def _supported_devices() -> List[str]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except ImportError:  # older torch: CUDA only
        return ["cuda"]


def _valid(opt: Any) -> bool:
    import torch

    if "fused" not in opt.defaults:
        return False
    devices = _supported_devices()
    for g in opt.param_groups:
        if g.get("differentiable"):
            return False
        for p in g["params"]:
            if p.device.type not in devices or not torch.is_floating_point(p):
                return False
    return True


def apply(opt: Any) -> Optional[Callable[[], None]]:
    """Apply the ``fused`` technique to ``opt``; returns the undo, or None when nothing changed.

    Example::

        with tk.switches.overrides({"fused": True}):
            tk.patch(optimizer)      # Adam(..., fused=True) from here on
    """
    from .. import switches

    current = opt.defaults.get("fused") if hasattr(opt, "defaults") else None
    want = switches.technique("fused", current)
    if bool(want) == bool(current) or not _valid(opt):
        return None
    want = bool(want)
    saved = [(g, g.get("fused"), g.get("foreach")) for g in opt.param_groups]
    saved_defaults = (opt.defaults.get("fused"), opt.defaults.get("foreach"))
    had = opt.__dict__.get("_step_supports_amp_scaling", None)
    for g in opt.param_groups:
        g["fused"] = want
        if want and g.get("foreach"):
            g["foreach"] = False
    opt.defaults["fused"] = want
    if want and opt.defaults.get("foreach"):
        opt.defaults["foreach"] = False
    # What the constructor sets with fused=True: GradScaler then leaves unscaling to the kernel.
    opt._step_supports_amp_scaling = want

    ref = weakref.ref(opt)  # the undo is kept in the optimizer's patch: no cycle through it

    def undo() -> None:
        opt = ref()
        if opt is None:
            return
        for g, fused, foreach in saved:
            g["fused"], g["foreach"] = fused, foreach
        opt.defaults["fused"], opt.defaults["foreach"] = saved_defaults
        if had is None:
            opt.__dict__.pop("_step_supports_amp_scaling", None)
        else:
            opt._step_supports_amp_scaling = had

    return undo
