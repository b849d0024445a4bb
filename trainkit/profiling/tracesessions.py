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

from typing import Collection, Dict, Iterable, Mapping, Sequence

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
