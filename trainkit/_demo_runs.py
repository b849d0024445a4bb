"""``trainkit demo``'s run folder: the runs already in it, and this run's event files read back.

A demo given a ``--logdir`` that holds an earlier run writes its session beside that one, as any
session does: TensorBoard shows the two as one run, and ``trainkit analyze`` reports TA111. The
demo says so when it starts; its summary counts only the steps of the event files it wrote.
"""
from __future__ import annotations

import datetime
import os
import shlex
import sys
from typing import List


def event_files(folder: str) -> "set[str]":
    """The names of the TensorBoard event files in ``folder``; none when it is not a folder yet
    (or cannot be one: the session says why when it starts)."""
    from .profiling.runs import EVENTS_MARK

    try:
        return {f for f in os.listdir(folder) if EVENTS_MARK in f}
    except OSError:
        return set()


def own(names: "set[str]") -> List[str]:
    """Of ``names``, the event files this process wrote, in name order: TensorBoard's file names,
    ``events.out.tfevents.<time>.<host>.<pid>.<n>``, say the host and process that wrote them,
    so a run another process writes into the same folder at the same time (a second ``trainkit
    demo --logdir`` of that folder) is not counted as this one's steps."""
    import socket

    mine = f".{socket.gethostname()}.{os.getpid()}."
    return sorted(name for name in names if mine in name)


def read_back(folder: str, names: List[str]) -> "tuple[List[float], List[float], List[float]]":
    """Step times, data waits and samples per second as TensorBoard will show them: the event
    files ``names`` in ``folder``, read back (the folder may also hold earlier runs' files,
    whose steps are not this run's)."""
    from .profiling.runs import read_scalars

    got = read_scalars(folder, names)

    def values(tag: str) -> List[float]:
        return [v for _, v in got.get(tag, [])]

    return (values("trainkit/step_time_ms"), values("trainkit/data_wait_ms"),
            values("trainkit/samples_per_s"))


def say_earlier_runs(folder: str, logdir: str) -> None:
    """One line on stderr where ``folder`` (the run's: ``logdir``, or ``logdir/rank<N>`` under
    torchrun) already holds event files: when the latest of those runs began, that this one is
    added beside it and what that does, and a ``--logdir`` that would be a run of its own.
    Nothing where the folder holds none (the default folder is a new one each run)."""
    earlier = sorted(event_files(folder))
    if not earlier:
        return
    when = max(_started(os.path.join(folder, name)) for name in earlier)
    runs = "a run (from" if len(earlier) == 1 else f"{len(earlier)} runs (the latest from"
    print(f"trainkit demo: {logdir} already holds {runs} {when:%Y-%m-%d %H:%M}); this one is "
          f"added beside it: TensorBoard shows them as one run, and trainkit analyze reports "
          f"TA111 (several sessions in one run folder); use --logdir "
          f"{shlex.quote(_unused(logdir))} for a run of its own", file=sys.stderr)


def _started(path: str) -> datetime.datetime:
    """When the session that wrote the event file ``path`` began: the time TensorBoard puts in
    its name (``events.out.tfevents.<time>.<host>...``), else the file's last change."""
    from .profiling.runs import EVENTS_MARK

    stamp = os.path.basename(path).partition(EVENTS_MARK)[2].lstrip(".").split(".")[0]
    try:
        return datetime.datetime.fromtimestamp(int(stamp))
    except (ValueError, OverflowError, OSError):
        try:
            return datetime.datetime.fromtimestamp(os.path.getmtime(path))
        except OSError:
            return datetime.datetime.now()


def _unused(logdir: str) -> str:
    """``logdir-2``, ``logdir-3``...: the first that does not exist (not made here)."""
    base = logdir.rstrip(os.sep) or logdir
    return next((f"{base}-{i}" for i in range(2, 10_000) if not os.path.exists(f"{base}-{i}")),
                f"{base}-new")
