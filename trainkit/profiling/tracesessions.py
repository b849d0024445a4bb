"""Which session of a run folder wrote each trace, by the name the trace records.

A folder may hold several sessions (a rerun, a relaunch resumed with ``steps_done``, one that
crashed), and :mod:`.runs` shows some of them, as TensorBoard does. Their traces lie side by side,
named by the worker and the time they were written. Told apart by that time alone (against each
session's first event's wall time), a trace is misassigned where two sessions write into one
folder at once (two processes launched with the same logdir) or where a relaunch runs on a
machine whose clock differs (a shared filesystem on a cluster). trainkit's traces name the event
file of the session that wrote them (``session_file`` in their top-level ``"trainkit"`` metadata,
:mod:`.trace`): a trace naming a session of the folder is that session's, whatever the clocks
say. A trace naming none (one from before trainkit recorded it, from torch before 2.1, a
profiler's of the user's, or naming a file no longer there) is assigned by clock times.

The name is read from the trace's head alone (:func:`.tracefiles.read_trace_head`: torch writes
the metadata before the events), a few kilobytes per trace, so that a folder's traces are
assigned without parsing them: those left out (an earlier session's) are never parsed at all,
and the analysis parses each of the others once.
"""
from __future__ import annotations

import os
import re
from typing import Collection, Dict, Iterable, Mapping, Optional, Sequence

from .eventfiles import records_in
from .tracefiles import read_trace_head
from .tracestats import recorded_session


def trace_sessions(traces: Iterable[str], sessions: Collection[str]) -> Dict[str, str]:
    """``trace -> session`` for each of ``traces`` (paths) that names, as the session that wrote
    it, one of ``sessions`` (event files' names in the traces' folder); the others are left out.

    Example::

        trace_sessions(["runs/a/h_1.1795000000000000000.pt.trace.json"], run.sessions)
    """
    out: Dict[str, str] = {}
    for trace in traces:
        name = recorded_session(read_trace_head(trace))
        if name is not None and name in sessions:
            out[trace] = name
    return out


def redone_from(shown: Sequence[str], counted: Mapping[str, int]) -> Dict[str, int]:
    """``session -> step`` for each of the sessions ``shown`` (oldest first) after which another
    one counted steps: the first step a later one counted (``counted``: each session's first
    counted step). A trace of the session holding that step or a later one holds steps the later
    session counted again, which are not the run's any more (:meth:`.runs.Run.replaced`).

    Example::

        redone_from(["a", "b"], {"a": 1, "b": 11})  # {"a": 11}: b resumed at step 11
    """
    out: Dict[str, int] = {}
    later = None
    for name in reversed(shown):
        if later is not None:
            out[name] = later
        first = counted.get(name)
        if first is not None:
            later = first if later is None else min(later, first)
    return out


_FILE_TIME = re.compile(r"tfevents\.(\d+)\.")
_TRACE_TIME = re.compile(r"\.(\d{10,})\.pt\.trace\.json(?:\.gz)?$")


def session_start(path: str) -> Optional[float]:
    """When the session writing the event file ``path`` started: its first event's wall time.

    Falls back on the second in the file's name (``events.out.tfevents.<time>.<host>...``).
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    try:
        with open(path, "rb") as fh:
            first = next(records_in(fh.read(4096)), None)  # the file_version event, ~30 bytes
        if first is not None:
            wall = event_pb2.Event.FromString(first).wall_time
            if wall > 0:
                return wall
    except (OSError, DecodeError):
        pass
    m = _FILE_TIME.search(os.path.basename(path))
    return float(m.group(1)) if m else None


def trace_time(path: str) -> float:
    """When a trace was written: the time in torch.profiler's name for it
    (``<worker>.<time_ns>.pt.trace.json``; milliseconds in older torch), else its mtime."""
    m = _TRACE_TIME.search(os.path.basename(path))
    if m:
        return int(m.group(1)) / 10 ** (len(m.group(1)) - 10)  # seconds have 10 digits till 2286
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
