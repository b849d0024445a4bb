"""Finding trainkit runs in a logdir and reading their records and traces.

A run is a folder holding trainkit's TensorBoard events (tags starting with ``trainkit/``) or
torch.profiler traces (``*.pt.trace.json[.gz]``): a session's logdir, or ``<logdir>/rank<N>``.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ..recorder import PREFIX
from .trace import is_trace

EVENTS_MARK = "tfevents"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: where it is, its scalars per tag, and its trace files.

    Example::

        run = load_run("runs/exp1", "."); run.values("trainkit/step_time_ms")
    """

    name: str
    path: str
    scalars: Dict[str, List[Tuple[int, float]]]
    traces: Tuple[str, ...]

    def values(self, tag: str) -> Dict[int, float]:
        """``step -> value`` of one tag (the last value written for a step wins)."""
        return dict(self.scalars.get(tag, ()))

    @property
    def is_trainkit(self) -> bool:
        return any(tag.startswith(PREFIX) for tag in self.scalars)


def find_runs(logdir: str) -> List[str]:
    """Folders under ``logdir`` (itself included) holding event files or traces, sorted."""
    found = []
    for folder, dirs, files in os.walk(logdir):
        dirs.sort()
        if any(EVENTS_MARK in f or is_trace(f) for f in files):
            found.append(folder)
    return found


def read_scalars(folder: str) -> Dict[str, List[Tuple[int, float]]]:
    """Every scalar in the folder's event files, ``tag -> [(step, value), ...]``."""
    if not any(EVENTS_MARK in f for f in os.listdir(folder)):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 1, "histograms": 1,
                                                  "images": 1, "audio": 1,
                                                  "compressedHistograms": 1})
    acc.Reload()
    return {tag: [(e.step, float(e.value)) for e in acc.Scalars(tag)]
            for tag in acc.Tags().get("scalars", [])}


def load_run(logdir: str, folder: str) -> Run:
    """The run in ``folder`` (a folder :func:`find_runs` returned for ``logdir``)."""
    name = os.path.relpath(folder, logdir)
    traces = tuple(sorted(os.path.join(folder, f) for f in os.listdir(folder) if is_trace(f)))
    return Run(name=name, path=folder, scalars=read_scalars(folder), traces=traces)


class TraceError(ValueError):
    """A trace file that cannot be read (truncated, not JSON, not a Chrome trace)."""


def read_trace(path: str) -> List[Dict[str, Any]]:
    """The ``traceEvents`` of a Chrome-trace JSON file (gzip-compressed when it ends in .gz).

    Raises:
        TraceError: naming the file and what is wrong with it.
    """
    opener: Any = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} "
                         f"(truncated? the process may have died while writing it)") from None
    events: Optional[Any] = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no 'traceEvents' list: not a torch.profiler Chrome trace")
    return [e for e in events if isinstance(e, dict)]
