"""Reading torch.profiler's trace files: their events and metadata, or why they cannot be read.

A trace is a Chrome-trace JSON file (``*.pt.trace.json``, or gzip-compressed ``.gz``) whose
``traceEvents`` :mod:`.tracestats` summarises; its other top-level entries (torch's
``deviceProperties``, trainkit's ``"trainkit"``) come with them, read in the same pass. A file
that cannot be read is a :class:`TraceError`, which the analysis reports as a broken trace
(TA100), unless torch.profiler may still be writing it: Kineto writes the JSON as it goes, so a
trace of a run in progress is unreadable until its cycle ends. One that changed while it was read,
or within :data:`WRITING_GRACE_S` of now, is left out until it is complete
(:func:`being_written`), not reported as broken.

torch.profiler (Kineto's Chrome-trace writer) writes a trace's top-level metadata before its
events: ``schemaVersion``, ``deviceProperties``, the entries given with ``preset_metadata_json``
(trainkit's ``"trainkit"``), ``displayTimeUnit`` and ``baseTimeNanoseconds``, then
``"traceEvents": [``; trainkit's rewrite of a trace (:mod:`.trace`) keeps that order.
:func:`read_trace_head` reads those entries from the file's first kilobytes alone, without the
events, where only they are asked for (which session wrote each trace of a folder: :mod:`.runs`).
"""
from __future__ import annotations

import gzip
import json
import os
import re
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


#: How far into a trace (decompressed) its top-level metadata is looked for: torch's takes a few
#: kilobytes (a GPU's deviceProperties ~0.5 kB each); past this, the trace is taken to have none.
HEAD_LIMIT = 1 << 20
_HEAD_CHUNK = 1 << 14
# The events' key as a top-level key: in a string value it would be escaped (\"traceEvents\")
_EVENTS_KEY = re.compile(r'"traceEvents"\s*:')


def read_trace_head(path: str) -> Dict[str, Any]:
    """The top-level entries a trace holds before its ``traceEvents`` (its metadata, where torch
    writes them), read from the file's start alone: what :attr:`TraceEvents.meta` holds of them,
    at the cost of a few kilobytes, not of the events. ``{}`` for a trace that cannot be read
    there (missing, unreadable, its events first, its head past :data:`HEAD_LIMIT`); never
    raises.

    Example::

        read_trace_head(path).get("trainkit")  # {"step_offset": 1, "session_file": ..., ...}
    """
    opener: Any = gzip.open if path.endswith(".gz") else open
    text = ""
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            while len(text) < HEAD_LIMIT:
                chunk = fh.read(_HEAD_CHUNK)
                if not chunk or (text + chunk).lstrip()[:1] not in ("{", ""):
                    return {}  # ended, or a JSON array of events: no top-level entries
                # from a little before the new chunk: the key may straddle two reads
                found = _EVENTS_KEY.search(text + chunk, max(0, len(text) - 32))
                text += chunk
                if found is not None:
                    head = json.loads(text[:found.start()].rstrip().rstrip(",") + "}")
                    return head if isinstance(head, dict) else {}
    except (OSError, EOFError, ValueError, zlib.error):  # ValueError: JSON, or not gzip
        return {}
    return {}


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
