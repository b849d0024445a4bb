"""Python garbage collections per step, from a ``gc.callbacks`` hook the session installs.

A ``gc.collect()`` in the training loop (often next to ``torch.cuda.empty_cache()``) costs a full
collection per step; ``tk.analyze`` reports it from these records. The hook wraps nothing in the
user's code: the interpreter calls it at the start and end of every collection, automatic or
explicit, so a step without collections costs nothing.
"""
from __future__ import annotations

import gc
from typing import Any, Callable, Dict

from .. import timing
from ..recorder import GC_FULL, GC_MS


def install(session: Any) -> Callable[[], None]:
    """Record ``trainkit/gc_ms`` and full (generation 2) collections per step; returns the undo.

    Example::

        undo = install(s); ...; undo()
    """
    started: Dict[str, float] = {}
    now = timing.now

    def on_gc(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            started["t"] = now()
            return
        t0 = started.pop("t", None)
        if t0 is None or session.closed:  # a collection in another thread, ending after close
            return
        try:
            session.record(GC_MS, (now() - t0) * 1e3)
            if info.get("generation") == 2:
                session.record(GC_FULL, 1.0)
        except RuntimeError:  # closed meanwhile: nothing to record into
            pass

    gc.callbacks.append(on_gc)

    def undo() -> None:
        try:
            gc.callbacks.remove(on_gc)
        except ValueError:  # someone cleared gc.callbacks meanwhile
            pass

    return undo
