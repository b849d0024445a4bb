"""The session's gc.callbacks hook: full collections and their time, per step; removed on close."""
from __future__ import annotations

import gc

import trainkit as tk
from trainkit.recorder import GC_FULL, GC_MS

from ..conftest import scalars


def test_collections_are_recorded_per_step_and_the_hook_removed_on_close(tmp_path):
    before = list(gc.callbacks)
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        assert len(gc.callbacks) == len(before) + 1
        s.log("x", 1.0)
        gc.collect()
        gc.collect()
    assert gc.callbacks == before
    got = scalars(str(tmp_path))
    (step, full), = got[GC_FULL]  # summed into the one step
    assert step == 1 and full >= 2.0  # an automatic full collection may add one
    assert got[GC_MS][0][1] > 0


def test_no_collection_no_record(tmp_path):
    gc.disable()
    try:
        with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
            s.log("x", 1.0)
    finally:
        gc.enable()
    assert GC_FULL not in scalars(str(tmp_path))
