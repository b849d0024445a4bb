"""``tk.analyze(logdir)``: findings read from a session's records and torch.profiler traces.

Each run under the logdir (the logdir itself, or ``rank<N>`` folders under torchrun) is read
once: its ``trainkit/*`` scalars go through :mod:`.analyzers.records`, its traces through
:mod:`.analyzers.traces`. A trace that cannot be read becomes a finding naming the file, unless
torch.profiler may still be writing it (it changed within the last minute): such a trace is left
out until it is complete, and said to be still being written. A folder holding several sessions
(a script run again with the same logdir, a run resumed from a checkpoint) is analyzed as one
run (:mod:`.runs`): a rerun alone (TA111 names the sessions it hides), a resumed run up to its
checkpoint and the resumed session from there. A relaunch that counted no step (it crashed in
setup or in its first step) is left out, and so are the traces of steps a later session counted
again. A trace is the session's whose event file it names (trainkit's traces record it; read from
the trace's head, so that traces left out are never parsed), else by clock times
(:mod:`.tracesessions`).
Each run's report says which steps its traces hold (:class:`Profiled`): the trace findings are
of those steps alone, a few of the run's, which a user looks up in TensorBoard's step times.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .analyzers import records as record_rules
from .analyzers import traces as trace_rules
from .finding import Finding, sort_key
from .eventfiles import Damage
from .reader import EventReader
from .logdir import EVENTS_MARK, NO_READ, find_runs, left_out
from .runs import Run, load_run
from .trace import is_trace
from .tracefiles import WRITING_GRACE_S, TraceError, being_written, read_trace
from .tracestats import TraceStats, summarize


@dataclasses.dataclass(frozen=True)
class Profiled:
    """The steps a run's analyzed traces hold, in trainkit's numbering (torch's
    ``ProfilerStep#N`` is step ``N + step_offset``, the offset each trace records: a session
    resumed with ``steps_done`` profiles from step ``steps_done + 1``, as
    ``trainkit/step_time_ms`` numbers it).

    The trace findings (TA103, TA107, TA108, TA109, a trace's TA102) are of these steps alone:
    a schedule profiles a few steps per cycle, which may not be typical of the run (a cycle
    during an evaluation, or in the first epoch's warm-up), so a report names them.

    Example::

        # a run under profile=tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=2)
        rep = analyze_run("runs/exp1", "runs/exp1"); rep.profiled.ranges()  # [(3, 5), (8, 10)]
    """

    #: traces analyzed: read, and holding a training step
    traces: int = 0
    #: the steps they hold, sorted
    steps: Tuple[int, ...] = ()
    #: of those traces, the ones without ``ProfilerStep`` marks (not written under a profiler
    #: schedule), whose whole activity is taken as one step with no number
    unnumbered: int = 0

    @classmethod
    def of(cls, stats: List[TraceStats]) -> "Profiled":
        """What the traces summarised in ``stats`` (those holding a step) hold."""
        return cls(traces=len(stats),
                   steps=tuple(sorted({n for s in stats for n in s.run_steps})),
                   unnumbered=sum(1 for s in stats if not s.step_numbers))

    def ranges(self) -> List[Tuple[int, int]]:
        """The steps as ``(first, last)`` runs of consecutive steps."""
        out: List[Tuple[int, int]] = []
        for step in self.steps:
            if out and step == out[-1][1] + 1:
                out[-1] = (out[-1][0], step)
            else:
                out.append((step, step))
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"traces": self.traces, "steps": [list(r) for r in self.ranges()],
                "unnumbered": self.unnumbered}


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What the TensorBoard tab shows for one run: the step breakdown and the findings.

    Example::

        rep = analyze_run("runs/exp1", "runs/exp1"); rep.breakdown["data_wait"]
    """

    run: str
    breakdown: Dict[str, float]
    findings: Tuple[Finding, ...]
    traces: Tuple[str, ...]
    steps: int
    #: False for a folder of event files that trainkit did not write (and no traces)
    is_trainkit: bool = True
    #: traces torch.profiler may still be writing: left out of the findings until complete
    writing: Tuple[str, ...] = ()
    #: traces of the folder's earlier sessions, left out of the findings: of a session hidden (the
    #: one it names, else written before the first session shown: see TA111), or of steps a later
    #: session counted again (:meth:`.runs.Run.replaced`)
    earlier_traces: Tuple[str, ...] = ()
    #: the steps the traces analyzed hold
    profiled: Profiled = Profiled()
    #: the steps with a step time; ``steps`` is those less the ones ``left_out`` names
    timed: int = 0
    #: ``(path, what it is)`` of the event files and traces left out as no regular file (a
    #: named pipe, a broken link) or not readable: :attr:`.runs.Run.skipped`
    skipped: Tuple[Tuple[str, str], ...] = ()
    #: the timed steps the breakdown leaves out: ``{"first": 0 or 1, "compiled": n}`` (the
    #: first pays for warm-up, a compiling one holds seconds of torch.compile)
    left_out: Dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        def names(paths: Tuple[str, ...]) -> List[str]:
            return [os.path.basename(t) for t in paths]

        return {"run": self.run, "breakdown": self.breakdown, "steps": self.steps,
                "timed_steps": self.timed, "left_out": dict(self.left_out),
                "skipped": [[os.path.basename(p), what] for p, what in self.skipped],
                "trainkit": self.is_trainkit,
                "findings": [f.to_dict() for f in self.findings],
                "traces": names(self.traces), "writing": names(self.writing),
                "earlier_traces": names(self.earlier_traces),
                "profiled": self.profiled.to_dict()}


def _trace_findings(run: Run, now: float
                    ) -> Tuple[List[TraceStats], List[Finding], List[str], List[str]]:
    """The stats of the run's traces, TA100 for the unreadable ones, the traces being written,
    and those of steps a later session counted again (read once: their steps say it)."""
    stats, bad, writing, replaced = [], [], [], []
    for path in run.traces:
        try:
            before = os.stat(path)
        except OSError:  # deleted since the folder was listed
            continue
        try:
            events = read_trace(path)
            st = summarize(events, meta=events.meta)
            if run.replaced(path, st.run_steps):
                replaced.append(path)
            else:
                stats.append(st)
        except TraceError as exc:
            if being_written(path, before, now=now):  # half-written: not a broken file (yet)
                writing.append(path)
                continue
            bad.append(Finding(
                code="TA100", title="unreadable trace",
                evidence=f"{os.path.basename(path)} in run {run.name!r} cannot be read: "
                         f"{str(exc).split(': ', 1)[-1]}",
                share=None, count=1,
                fix=f"delete {path} and profile again (a trace is written when a profiling "
                    f"cycle ends, or when the session closes during one)",
                severity="low", run=run.name))
    return stats, bad, writing, replaced


def analyze_run(logdir: str, folder: str, *, clock: Callable[[], float] = time.time,
                name: Optional[str] = None, reader: Optional[EventReader] = None) -> RunReport:
    """Findings and step breakdown of the run in ``folder`` (named relative to ``logdir``, or
    ``name``: as TensorBoard names it, for the tab, which finds the folder on its own).

    ``clock`` (wall time, as file mtimes are) tells a trace still being written from a broken one.
    ``reader``: the :class:`.reader.EventReader` of a caller analyzing the run again as it grows
    (the tab), which parses only the records appended since its last read.
    """
    run = load_run(logdir, folder, reader=reader)
    if name is not None:  # the findings' texts say it too
        run = dataclasses.replace(run, name=name)
    st = record_rules.Steps(run)  # the one selection of steps the findings and breakdown share
    found = [dataclasses.replace(f, run=run.name) for f in record_rules.findings(st)]
    stats, bad, writing, replaced = _trace_findings(run, clock())
    if replaced:  # left out as an earlier session's are, in the report and in TA111 alike
        run = dataclasses.replace(
            run, traces=tuple(t for t in run.traces if t not in replaced),
            earlier_traces=tuple(sorted(run.earlier_traces + tuple(replaced))))
    t = trace_rules.Traces(stats)
    if t.steps:
        codes = {f.code for f in found}
        for rule in trace_rules.RULES:
            f = rule(t)
            if f is not None and f.code not in codes:  # records say it with a share already
                found.append(dataclasses.replace(f, run=run.name))
        f = trace_rules.small_batches(t, record_rules.items_per_step(run))
        if f is not None:
            found.append(dataclasses.replace(f, run=run.name))
    found.extend(bad)
    steps = len(st)
    found.extend(_corrupt(run, d, steps) for d in run.damaged)
    if not steps and not t.steps and not bad:
        # Say so, rather than "no findings": a run with nothing to analyze is not a clean run.
        if writing:
            found.append(_nothing_yet(run, writing))
        elif run.damaged:  # TA112 says why: asking whether the optimizer is patched misleads
            pass
        elif run.is_trainkit:
            found.append(record_rules.no_steps(run))
        elif run.traces:
            found.append(_no_step_in_traces(run))
        elif run.skipped:  # every file left out, unread: the tab lists such a run (data.py)
            found.append(_nothing_read(run))
    sessions = record_rules.several_sessions(run)
    if sessions is not None:
        found.append(sessions)
    found.sort(key=sort_key)
    return RunReport(run=run.name, breakdown=record_rules.breakdown(st), findings=tuple(found),
                     traces=tuple(t for t in run.traces if t not in writing), steps=steps,
                     is_trainkit=run.is_trainkit or bool(run.traces or run.earlier_traces),
                     writing=tuple(writing), earlier_traces=run.earlier_traces,
                     profiled=Profiled.of(t.stats), timed=st.timed, left_out=st.left_out,
                     skipped=run.skipped)


def _names(paths: Any) -> str:
    return ", ".join(os.path.basename(p) for p in paths)


def _nothing_yet(run: Run, writing: List[str]) -> Finding:
    """TA110 for a run whose only traces are still being written (or were cut short moments ago,
    a crash) and whose records count no step: nothing was analyzed yet."""
    return _nothing_analyzed(
        run, f"no step counted in its records, and its trace(s) {_names(writing)} are still "
             f"being written (unreadable, changed within the last {WRITING_GRACE_S:.0f} s), so "
             f"they are left out",
        "analyze again once the run has ended (a profiling cycle's trace is written as the "
        "cycle ends); a trace left cut short by a crash stays unreadable and is reported as "
        "TA100 a minute after its last change")


def _no_step_in_traces(run: Run) -> Finding:
    """TA110 for a run of traces only, none holding a profiled step."""
    return _nothing_analyzed(
        run, f"no trainkit records, and no trace holds a training step ({_names(run.traces)}: "
             f"empty, or only what ran after the session's last step, trainkit/after_last_step)",
        "profile steps of the training: tk.session(logdir=..., profile=tk.ProfileSchedule("
        "wait=5, warmup=1, active=3)) around the loop, with tk.patch(optimizer) so that the "
        "session counts the steps, and a loop longer than wait + warmup steps")


def _nothing_read(run: Run) -> Finding:
    """TA110 for a run none of whose event files and traces could be read (no permission to
    read them, named pipes, broken links): not a run without findings."""
    locked = [p for p, what in run.skipped if what == NO_READ]
    fix = "; ".join(([f"make them readable: chmod u+r {' '.join(locked)}"] if locked else [])
                    + ([] if len(locked) == len(run.skipped) else
                       ["replace each file that is no regular file by the file it stands for"]))
    return _nothing_analyzed(
        run, "each of its event files and traces was left out, unread: "
             + "; ".join(left_out(p, what) for p, what in run.skipped),
        f"{fix}, then analyze again")


def _corrupt(run: Run, damage: Damage, steps: int) -> Finding:
    """TA112 for an event file read up to a record whose CRC is wrong, or whose payload protobuf
    refuses as an ``Event`` (more data after it lost)."""
    lost = damage.size - damage.offset
    what = ("a record there, its checksum right, holds no TensorBoard event: protobuf refuses it"
            if damage.refused else "a record's checksum (CRC) is wrong there")
    read = ("only the file's first record (its version) before it was read"
            if damage.records <= 1 else f"the {damage.records:,} records before it were read")
    analyzed = (f"; the analysis covers the {steps:,} step(s) read" if steps
                else ", so no step could be analyzed")
    return Finding(
        code="TA112", title="corrupt event file",
        evidence=f"{damage.path!r} is corrupt at byte {damage.offset:,} of {damage.size:,}: "
                 f"{what}; {read}, and the {lost:,} bytes from there on are not{analyzed}",
        share=None, count=1,
        fix="the run was cut by a crash or the file was damaged (a full disk, a copy cut short): "
            "the records from that byte on are lost and cannot be read back; run again for a "
            "whole record, or move the file out of the folder to analyze the rest alone",
        severity="medium" if steps else "high", run=run.name)


def _nothing_analyzed(run: Run, why: str, fix: str) -> Finding:
    return Finding(code="TA110", title="nothing analyzed",
                   evidence=f"nothing was analyzed in {run.path!r}: {why}", share=None, count=0,
                   fix=fix, severity="high", run=run.name)


def _check_logdir(logdir: Any) -> str:
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"analyze({logdir!r}): logdir must be a path (str or os.PathLike), "
                        f"e.g. tk.analyze('runs/exp1')")
    # "~/runs" as tk.session reads it (and the shell, unquoted): the folder the session wrote
    path = os.path.expanduser(os.fspath(logdir))
    if not os.path.isdir(path):
        what = "a file, not a folder" if os.path.exists(path) else "no such folder"
        name = os.path.basename(path)
        if what.startswith("a file") and (EVENTS_MARK in name or is_trace(name)):
            # a run's own file (`trainkit analyze runs/exp1/events.out.tfevents...`, as a shell's
            # completion gives it): its folder is the run, so the fix names that folder
            run = os.path.dirname(path) or "."
            raise ValueError(f"analyze({path!r}): a file of the run in {run!r}, not a folder; "
                             f"pass the folder, e.g. tk.analyze({run!r}) or trainkit analyze "
                             f"{shlex.quote(run)}")
        raise ValueError(f"analyze({path!r}): {what}; pass the logdir a session wrote, "
                         f"e.g. tk.analyze('runs/exp1') or trainkit analyze runs/exp1")
    return path


def analyze(logdir: Union[str, "os.PathLike[str]"]) -> List[Finding]:
    """Findings for every trainkit run under ``logdir``, most costly first.

    Reads the session's TensorBoard records (data wait, copies, update time, recompiles, garbage
    collections) and its torch.profiler traces (host syncs, ``empty_cache``, idle GPU,
    pageable copies). Each finding has its evidence, its share of step time and a fix. A run
    folder holding several sessions is analyzed as one run: a rerun alone (TA111 names the
    sessions it hides), a resumed run up to its checkpoint and the resumed session from there;
    a relaunch that counted no step (it crashed in setup or in its first step) is left out. A
    trace torch.profiler is still writing is left out, with a ``UserWarning`` naming it.

    Raises:
        ValueError: ``logdir`` is not a folder, or holds no trainkit run.

    Example::

        with tk.session(logdir="runs/exp1", profile=tk.ProfileSchedule(wait=5, warmup=1, active=3)):
            train()
        for f in tk.analyze("runs/exp1"):
            print(f)
    """
    found = [f for r in _reports(logdir) for f in r.findings]
    found.sort(key=sort_key)
    return found


def analyze_runs(logdir: Union[str, "os.PathLike[str]"]) -> List[RunReport]:
    """:func:`analyze`, run by run: each run's findings with what they were read from (its
    steps, the traces analyzed and the steps those hold), as ``trainkit analyze`` prints them.

    Raises:
        ValueError: ``logdir`` is not a folder, or holds no trainkit run.

    Example::

        for rep in analyze_runs("runs"):
            print(rep.run, rep.profiled.ranges(), [f.code for f in rep.findings])
    """
    return _reports(logdir)


def _reports(logdir: Any) -> List[RunReport]:
    """The reports of the trainkit runs under ``logdir``, warning about each trace left out
    because it is still being written (at the line that called :func:`analyze` or
    :func:`analyze_runs`)."""
    path = _check_logdir(logdir)
    unlisted: List[Tuple[str, str]] = []
    every = [analyze_run(path, f) for f in find_runs(path, unlisted)]
    skipped = [left_out(file, what) for file, what in unlisted]
    skipped += [left_out(file, what) for r in every for file, what in r.skipped]
    reports = [r for r in every if r.is_trainkit]
    if not reports:
        left = f" ({'; '.join(skipped)})" if skipped else ""
        raise ValueError(
            f"analyze({path!r}): no trainkit run in {path!r}: no TensorBoard event file with "
            f"trainkit/ scalars and no *.pt.trace.json trace under it{left}; record one with "
            f"tk.session(logdir={path!r}) around the training loop")
    for said in skipped:
        warnings.warn(f"analyze({path!r}): {said}", UserWarning, stacklevel=3)
    for r in reports:
        for trace in r.writing:
            warnings.warn(
                f"analyze({path!r}): trace {os.path.basename(trace)!r} of run {r.run!r} is still "
                f"being written (torch.profiler writes one as a profiling cycle ends): it is left "
                f"out of the findings until it is complete; analyze again in a moment",
                UserWarning,
                stacklevel=3)
    return reports
