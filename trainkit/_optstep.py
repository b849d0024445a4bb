"""A patched optimizer's ``step``: the per-step fast path (trainkit/patch.py holds the rest of
the pipeline, :meth:`trainkit.patch.OptimizerPatch.step`, which this calls for every other case).
"""
from __future__ import annotations

import importlib
from typing import Any

from . import recorder as _recorder, timing
from ._optcalls import gone, scheduler_marked, step_signature
from .profiling import regions
from .recorder import STEP_REC

# The session module itself (``trainkit.session`` the attribute is the function ``tk.session``).
_S = importlib.import_module(__package__ + ".session")


def step_function(p: Any) -> Any:
    """The ``step`` of one patched optimizer: its own function, for two reasons.

    It carries the marker that an LR scheduler created before the patch left on the step it
    wrapped (without it the scheduler warns at its first step() that "optimizer.step() has been
    overridden after learning rate scheduler initialization"); and it holds its patch, so the
    common case (a CPU step, no closure, no gate, no profiler) runs in this one frame and leaves
    one record: its start, its end and the previous step's end. With ``trainkit._speedups``
    built, that block runs in C (``FastStep``, trainkit/_speedups_step.h), which calls this
    closure for every other case.
    """
    regions.load_flags()
    tap = regions._TAP
    now = timing.now
    ref = p._opt
    own, bound = p._orig_step

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and p.gate is None and p._cuda is False and p.live:
            s = _S._active
            if s is not None and s._primary is p and not tap._is_profiler_enabled:
                core = p._core
                t0 = now()
                out = (core() if core is not None else own() if not bound
                       else own(opt) if (opt := ref()) is not None else gone(own))
                t1 = now()
                n = s.step
                s._buf.append((STEP_REC, n, t0, t1, s._last_step_end))
                s._last_step_end = t1
                s.step = n + 1  # the rest as Session.step_done, inlined: one frame per step
                if n % s._log_every == 0:
                    s._wake()
                if s._profiler is not None:
                    s.profiler_step()
                return out
        if not p.live:
            # A stale step: its patch was undone, but a wrapper made meanwhile (an LR scheduler's)
            # still calls it, maybe as the core of a newer patch: the step it patched, as taken
            # then (a step the user or a library set on the instance runs, as unpatched).
            opt = ref()
            if opt is None:
                return gone(own)
            return own(opt, *args, **kwargs) if bound else own(*args, **kwargs)
        return p.step(*args, **kwargs)

    step.__wrapped_step__ = True  # type: ignore[attr-defined]
    step.__signature__ = step_signature(p._orig_step)  # type: ignore[attr-defined]
    fast = _recorder._fast
    if fast is not None:
        # The same step with its first block in C (trainkit/_speedups_step.h): it calls this
        # closure for every other case. It carries the markers as the closure would.
        fast_step = fast.FastStep(p, step, ref, own, bound, now, tap, vars(_S), STEP_REC)
        vars(fast_step).update(vars(step))  # __wrapped_step__, __signature__
        return scheduler_marked(fast_step, p.orig_step)
    return scheduler_marked(step, p.orig_step)
