"""Reading torch.profiler's trace files: their events and metadata, or why they cannot be read.

A trace is a Chrome-trace JSON file (``*.pt.trace.json``, or gzip-compressed ``.gz``) whose
``traceEvents`` :mod:`.tracestats` summarises; its other top-level entries (torch's
``deviceProperties``, trainkit's ``"trainkit"``) come with them, read in the same pass. A file
that cannot be read is a :class:`TraceError`, which the analysis reports as a broken trace
(TA100), unless torch.profiler may still be writing it: Kineto writes the JSON as it goes, so a
trace of a run in progress is unreadable until its cycle ends. One that changed while it was read,
or within :data:`WRITING_GRACE_S` of now, is left out until it is complete
(:func:`being_written`), not reported as broken.
"""
from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any, Dict, List, Optional


class TraceError(ValueError):
    """A trace file that cannot be read (truncated, not JSON, not a Chrome trace)."""


class TraceEvents(List[Dict[str, Any]]):
    """A trace's ``traceEvents``, and in ``meta`` its other top-level entries (torch's
    ``deviceProperties``; trainkit's ``"trainkit"``, which says which steps of the run its step
    marks are): read with the events, as parsing a GPU trace again would double its cost.

    Example::

        events = read_trace(path); summarize(events, meta=events.meta)
    """

    def __init__(self, events: List[Dict[str, Any]], meta: Dict[str, Any]) -> None:
        super().__init__(events)
        self.meta = meta


def read_trace(path: str) -> TraceEvents:
    """The ``traceEvents`` of a Chrome-trace JSON file (gzip-compressed when it ends in .gz),
    with its top-level metadata in their ``meta``.

    Raises:
        TraceError: naming the file and what is wrong with it.
    """
    opener: Any = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:  # zlib: a corrupt .gz
        raise TraceError(f"{path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} "
                         f"(truncated? the process may have died while writing it)") from None
    events: Optional[Any] = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no 'traceEvents' list: not a torch.profiler Chrome trace")
    meta = {k: v for k, v in data.items() if k != "traceEvents"} if isinstance(data, dict) else {}
    return TraceEvents([e for e in events if isinstance(e, dict)], meta)


#: How long after its last change an unreadable trace may be one torch.profiler is still writing.
#: Kineto writes the JSON as it goes (gzip too, after a temporary file), so the mtime moves until
#: it ends; a large GPU trace takes seconds. Unreadable and unchanged for longer: broken for good.
WRITING_GRACE_S = 60.0


def being_written(path: str, before: os.stat_result, *, now: float) -> bool:
    """Whether an unreadable trace may be one still being written, rather than a broken one.

    ``before``: its ``os.stat`` from before it was read. True when it changed while it was read,
    or last changed less than :data:`WRITING_GRACE_S` from ``now`` (this machine's clock; a
    writer whose clock is further off than that is told by the growth alone).
    """
    try:
        after = os.stat(path)
    except OSError:  # deleted meanwhile: in flux, not broken
        return True
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        return True  # still growing
    return abs(now - after.st_mtime) < WRITING_GRACE_S
