"""TA106 on a loop that never calls ``gc.collect()``: the interpreter's own collections."""
from __future__ import annotations

import trainkit as tk

from .conftest import train


def test_collections_the_loop_never_asked_for_are_not_blamed_on_gc_collect(logdir):
    """A loop making many Python objects a step (per-sample records, kept until the next step)
    has the interpreter collect on its own, often in full; TA106 asked "(gc.collect() every few
    steps?)" and its fix began "remove gc.collect()", which that loop does not call."""
    held = []

    def records():
        held[:] = [{"i": i, "tags": [i]} for i in range(20000)]

    train(logdir, steps=20, each_step=records)
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA106"]
    assert "gc.collect() every few steps?" not in f.evidence, f.evidence
    assert "the interpreter's own" in f.evidence, f.evidence
    assert "many Python objects" in f.fix and "gc.freeze()" in f.fix, f.fix
