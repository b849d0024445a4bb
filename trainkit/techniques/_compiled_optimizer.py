"""``tk.compiled_step(optimizer)``, the optimizer form of trainkit.techniques.compiled_step: that
optimizer's own step compiled in place, as ``tk.patch(optimizer, compile=True)``.

As ``tk.patch`` does, it looks into a wrapper that steps the optimizer it wraps only at some calls
(accelerate's ``AcceleratedOptimizer``, trainkit._wrapped): the optimizer compiled and patched is
the inner one. The wrapper was patched itself: each of its calls counted as a step (under
accelerate's gradient accumulation, each micro-batch), its step, with its skipped calls,
compiled, and a later ``tk.patch(wrapper)`` patched the inner one besides.
"""
from __future__ import annotations

from typing import Any, Optional

from .._text import brief
from .._wrapped import inner_optimizer, repoint_saved_step


def compile_optimizer(opt: Any, mode: Optional[str], fullgraph: bool) -> Any:
    """``tk.compiled_step(opt, mode=..., fullgraph=...)`` for an optimizer ``opt`` (or a wrapper
    of one): returns ``opt``; asked again with other options, raises ValueError."""
    from ..patch import _patch_optimizer, optimizer_patch

    inner = inner_optimizer(opt)  # accelerate's wrapper: its calls are not all steps
    target = opt if inner is None else inner
    p = optimizer_patch(target)
    if p is not None and p.compiled:
        _check_same_options(opt, getattr(p.core, "trainkit_compiled", None), mode, fullgraph)
        return opt
    # Compiled before the patch changes anything, as tk.patch(opt, compile=True): a torch
    # that cannot compile raises with the optimizer as it was.
    _patch_optimizer(target, compile=True, mode=mode, fullgraph=fullgraph)
    if inner is not None:
        repoint_saved_step(opt, inner)
    return opt


def _check_same_options(opt: Any, compiled: Any, mode: Optional[str], fullgraph: bool) -> None:
    """Refuse other options for a step compiled already (``compiled``, its ``_Compiled``): it
    ran on with its old mode silently."""
    if compiled is None or (compiled.mode or "default", compiled.fullgraph) \
            == (mode or "default", fullgraph):  # (None: the compile technique is off)
        return
    again = "optimizer" + (f", mode={mode!r}" if mode else "")
    again += ", fullgraph=True" if fullgraph else ""
    raise ValueError(f"compiled_step({brief(opt)}, mode={mode!r}, fullgraph={fullgraph!r}): its "
                     f"step is compiled already, with mode={compiled.mode!r}, fullgraph="
                     f"{compiled.fullgraph!r}; to compile it with other options, undo it first: "
                     f"tk.unpatch(optimizer); tk.compiled_step({again})")
