"""trainkit's tags, and the records the hot path puts in a session's buffer (the record format
shared by the recorder, the writer's C pass and everything that records)."""
from __future__ import annotations

PREFIX = "trainkit/"
#: the starts of trainkit's own tags, which s.log refuses (a value logged there would corrupt them)
OWN_TAGS = (PREFIX, "\0")
STEP_TIME = PREFIX + "step_time_ms"
DATA_WAIT = PREFIX + "data_wait_ms"
SAMPLES_PER_S = PREFIX + "samples_per_s"
H2D_MS = PREFIX + "h2d_ms"
H2D_GBPS = PREFIX + "h2d_GBps"
H2D_PINNED_PCT = PREFIX + "h2d_pinned_pct"
CLOSURE_MS = PREFIX + "closure_ms"
UPDATE_MS = PREFIX + "update_ms"
REGION = PREFIX + "region/"
GC_MS = PREFIX + "gc_ms"  # time in Python garbage collections during the step
GC_FULL = PREFIX + "gc_full_collections"  # full (generation 2) collections, e.g. gc.collect()
COMPILE_SECONDS = PREFIX + "compile/seconds"  # wall time of the calls that compiled
COMPILE_RECOMPILES = PREFIX + "compile/recompiles"  # running count
AMP_SCALE = PREFIX + "amp/scale"  # GradScaler's scale after the step
AMP_SKIPPED = PREFIX + "amp/skipped_steps"  # running count of skipped (inf/nan) steps
#: ``trainkit/loader/<i>/passes``: how many passes the ``i``-th loader began, at each pass start.
PASSES = PREFIX + "loader/{}/passes"
# Internal tags (never written as such): inputs of derived rates, and a step's end time. They start
# with a NUL, which no name a user logs does, so s.log("_t", ...) stays the user's own tag.
ITEMS = "\0items"
H2D_BYTES = "\0h2d_bytes"
H2D_PINNED_BYTES = "\0h2d_pinned_bytes"
STEP_END = "\0t"
#: the wait of the ``next()`` that ended a patched loader's pass (StopIteration: a DataLoader
#: without ``persistent_workers`` joins its workers there), in ms, under the step in progress:
#: written as that step's data wait once the step is counted, dropped if it never is (the last
#: pass's end, after the run's last step: no point at N + 1). The writer decides, at the step's
#: write (:func:`trainkit._steps.take_pass_end`), as the step's end comes after the record.
PASS_END_WAIT = "\0pass_end"


# Compound records, one per event on the hot path, taken apart by the writer:
#   (STEP_REC, step, update_start, end, previous_end): update_ms, step_time_ms and the step's end;
#   (BATCH_REC, step, wait_start, wait_end, items or None): data_wait_ms and the items it brought.
# Their tags are NUL-prefixed strs too (s.log refuses such names), and the writer tells them by
# identity. Every record holds atomic values only (str, int, float, None): Python's GC untracks
# such a tuple at its first collection, so the records waiting in the buffer (seconds' worth)
# never reach the older generations. A record holding any other object (an object as its tag)
# stays tracked; promoted by the thousand, the records then brought on full collections that cost
# the training thread ~10 us a step.
STEP_REC = "\0step"
BATCH_REC = "\0batch"
