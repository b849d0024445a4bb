"""Finding trainkit runs in a logdir, reading their records (event files' framing:
:mod:`.eventfiles`) and listing their traces (which :mod:`.tracefiles` reads).

A run is a folder holding trainkit's TensorBoard events (tags starting with ``trainkit/``) or
torch.profiler traces (``*.pt.trace.json[.gz]``): a session's logdir, or ``<logdir>/rank<N>``.

A script run again with the same logdir puts a second session into the folder: each session
writes its own event file, with steps from 1 again. TensorBoard reads a run's files in name order
(the name starts with the file's creation time); its default loader (the Rust data server) drops,
at each point whose step does not increase, the points of that point's tag from that step on, so
its Scalars tab shows the latest session's steps (``--load_fast=false`` draws them one after the
other). A session resumed from a checkpoint (``tk.session(..., steps_done=N)``) numbers its steps
on from N + 1: TensorBoard shows the sessions before it as one run with it, less their steps
after N. A run is analyzed much the same way. A session that counted no step (wrote no
``trainkit/update_ms`` or ``step_time_ms``), in a folder where another did, is hidden whole and
hides nothing: a relaunch that crashed in setup or in its first step is no run, and its close's
system sample and first data wait at step 1 are not the run's (TensorBoard shows them). Among the
others, each tag a later session wrote again drops the earlier sessions' points of that tag from
the step it wrote it at, and a later session that counted steps drops every tag's from its first
counted step on (the earlier steps from there are another run's); a session with no point left
is hidden (a rerun). Left out with them: the traces of the sessions hidden, and those holding
steps a later session counted again (:meth:`Run.replaced`). A trace is a session's by the event
file it names (trainkit's do: :mod:`.tracesessions`), else by clock times: written before the first
session shown started, it is a hidden one's; before a later one started, an earlier one's. Where
no session counted a step, all of them merge tag by tag, as TensorBoard shows them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from .. import recorder as _recorder
from ..recorder import PREFIX, STEP_TIME, UPDATE_MS
from .eventfiles import Cursor, Damage, chunks_taken, damage_of
from .logdir import EVENTS_MARK, regular_files
from .points import Points, ScalarsParse
from .trace import is_trace
from .tracesessions import redone_from, session_start, trace_sessions, trace_time

if TYPE_CHECKING:
    from .reader import EventReader
    from .series import Series

#: The text summaries a run's reader keeps (:attr:`Run.meta`).
META = PREFIX + "meta/"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: where it is, its scalars per tag, and its trace files.

    Example::

        run = load_run("runs/exp1", "."); run.values("trainkit/step_time_ms")
    """

    name: str
    path: str
    #: the scalars of the sessions shown (a folder with several: see ``sessions``), each tag's
    #: :class:`.points.Points` (read as a list of ``(step, value)``)
    scalars: Dict[str, Points]
    #: the traces of the sessions shown (every trace, when the folder holds one session or none);
    #: the analysis reads each and leaves out those :meth:`replaced` says a later one redid
    traces: Tuple[str, ...]
    #: the event files holding trainkit records, one per session, oldest first
    sessions: Tuple[str, ...] = ()
    #: when the first session shown started (its first event's wall time), read when a session
    #: is hidden
    started: Optional[float] = None
    #: the traces of the sessions hidden, left out of the analysis: those naming a hidden session,
    #: and those naming none written before the first session shown started
    earlier_traces: Tuple[str, ...] = ()
    #: the sessions whose points are neither shown nor analyzed: those later ones hide (they
    #: counted steps again from their first step or before, or wrote again every tag of theirs: a
    #: rerun into the same folder), and, in a folder where a session counted steps, each one that
    #: counted none (a relaunch that crashed in setup or in its first step), hidden whole
    hidden: Tuple[str, ...] = ()
    #: of ``hidden``, the sessions that counted steps (wrote ``trainkit/update_ms`` or
    #: ``trainkit/step_time_ms``): the steps a rerun leaves out of the analysis (TA111)
    hidden_counted: Tuple[str, ...] = ()
    #: ``trainkit/meta/...`` text summaries of the sessions shown (a patched DataLoader's
    #: settings: :mod:`trainkit._loaderinfo`), ``tag -> text``; a later session's win
    meta: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: ``(started, first counted step)`` of each session shown after the first, where sessions
    #: counted steps (:meth:`replaced`)
    restarts: Tuple[Tuple[float, int], ...] = ()
    #: ``trace -> session`` (event file's name) for each trace naming a session of the folder
    #: that is shown or hidden: assigned by that name, not by clock times (read where the folder
    #: holds several sessions)
    trace_sessions: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: ``session -> step``: for each session shown after which another counted steps, the first
    #: step a later one counted (:meth:`replaced`, for the traces naming the session)
    redone: Dict[str, int] = dataclasses.field(default_factory=dict)
    #: the event files of the folder's sessions that are corrupt (a record whose CRC is wrong,
    #: more bytes after it: a crash or a damaged file), read up to there (TA112)
    damaged: Tuple[Damage, ...] = ()
    #: ``(path, what it is)`` of the folder's event files and traces that are no regular file (a
    #: named pipe, whose reading would wait forever for a writer; a broken link) or that the user
    #: may not read (:data:`.logdir.NO_READ`), left out
    skipped: Tuple[Tuple[str, str], ...] = ()

    def values(self, tag: str) -> Dict[int, float]:
        """``step -> value`` of one tag (the last value written for a step wins)."""
        points = self.scalars.get(tag)
        if points is None:
            return {}
        if isinstance(points, Points):  # from its arrays: no tuple made per point
            return dict(zip(points.steps, points.values))
        return dict(points)

    def series(self, tag: str) -> "Series":
        """:meth:`values` as two numpy arrays sorted by step (:class:`.series.Series`), views of
        the points' where their steps increase: what the analysis reads (a dict of a
        1,000,000-step tag takes ~0.1 s and ~100 MB)."""
        from .series import Series

        points = self.scalars.get(tag)
        return Series.of(points if points is None or isinstance(points, Points)
                         else Points.of(points))

    def replaced(self, trace: str, steps: Sequence[int]) -> bool:
        """Whether a later session counted again steps the trace ``trace`` holds (``steps``,
        as ``trainkit/step_time_ms`` numbers them): it is the trace of a session before one
        shown (the session it names, else one written before that one started) and holds a step
        from that one's first counted step on (a session resumed from an earlier checkpoint,
        which TensorBoard shows there), so it is left out of the analysis. A trace without step
        marks (no ``steps``) is kept.

        Example::

            events = read_trace(path); run.replaced(path, summarize(events).run_steps)
        """
        if not steps:
            return False
        own = self.trace_sessions.get(trace)
        if own is not None:
            first = self.redone.get(own)
            return first is not None and max(steps) >= first
        if not self.restarts:
            return False
        written, last = trace_time(trace), max(steps)
        return any(written < started and last >= first for started, first in self.restarts)

    @property
    def is_trainkit(self) -> bool:
        # a session's text summaries count too: one that recorded no scalar of its own (no
        # system metrics, a loop that never stepped) still wrote which optimizers it had
        # a corrupt file holding trainkit/ tags past the damage is one too, reported as such
        return any(tag.startswith(PREFIX) for tag in self.scalars) or bool(self.meta) \
            or bool(self.damaged)


# A summary value whose tag starts with "trainkit/", as protobuf writes it: the tag's field key
# (0x0a), its length as a varint of one or two bytes, then the tag. Found without parsing (a run
# of 200,000 steps is scanned in ~0.1 s and parsed in ~1.5 s).
_TRAINKIT_TAG = re.compile(rb"\x0a(?:[\x09-\x7f]|[\x80-\xff][\x01-\x7f])"
                           + re.escape(PREFIX.encode()))
_OVERLAP = 16  # bytes scanned again from the last end: a tag's start may straddle it
_CHUNK = 1 << 22


def scan_trainkit_tag(path: str, start: int = 0) -> Tuple[int, bool]:
    """Whether the event file ``path`` holds a ``trainkit/`` scalar, scanned from byte ``start``.

    Returns ``(bytes scanned up to, found)``: a file that grew can be scanned again from there.
    ``start`` beyond the file's size (a file written anew) scans it from its start.

    Raises:
        OSError: the file cannot be read.
    """
    found = False
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, start - _OVERLAP) if size >= start else 0)
        tail = b""
        while not found:  # in chunks: a file of images may be gigabytes
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            found = _TRAINKIT_TAG.search(tail + chunk) is not None
            tail = chunk[-_OVERLAP:]
        return max(size, fh.tell()), found


def _holds_trainkit_tag(path: str) -> bool:
    try:
        return scan_trainkit_tag(path)[1]
    except OSError:  # gone meanwhile
        return False


def read_scalars(folder: str, names: Optional[List[str]] = None, *,
                 meta: Optional[Dict[str, str]] = None,
                 damaged: Optional[List[Damage]] = None) -> Dict[str, Points]:
    """Every scalar in the folder's event files (or those ``names``): ``tag -> points``, each
    tag's :class:`.points.Points` (``(step, value)`` pairs in two arrays; read, indexed and
    compared as a list of tuples).

    ``meta``: a dict to fill with the ``trainkit/meta/...`` text summaries read (``tag -> text``).
    ``damaged``: a list to add each corrupt file's :class:`.eventfiles.Damage` to (read up to it).

    What TensorBoard's ``EventAccumulator`` reads (the files in name order, ``simple_value``
    scalars, a ``SessionLog.START`` dropping the steps from its own on), about ten times faster
    in Python and ~18x faster again with trainkit._speedups (a 1,000,000-step run: ~11 s and
    ~0.6 s; EventAccumulator took 15 s for 200,000 steps).
    """
    names = sorted(f for f in os.listdir(folder) if EVENTS_MARK in f) if names is None else names
    if not names:
        return {}
    parse = ScalarsParse(meta=meta, meta_prefix=META)
    for name in names:
        path = os.path.join(folder, name)
        cursor = None if damaged is None else Cursor()
        parse_file(path, parse, cursor)
        damage = None if cursor is None else damage_of(path, cursor)
        if damage is not None:
            damaged.append(damage)
    return parse.result()


def parse_file(path: str, parse: ScalarsParse, cursor: Optional[Cursor] = None) -> bool:
    """Parse the event file ``path``'s records into ``parse`` (from ``cursor.offset``, moved on
    past what was read, where given). Returns False where the file holds no more to read, now
    or later: a record whose CRC is wrong or whose payload is no ``Event`` (``cursor.broken_at``
    says where); what came before is kept. A file gone meanwhile gives what was read.
    """
    fast = _recorder._fast  # C: the framing and the plain scalars (trainkit/_speedups_read.h)
    take = parse.take if fast is None else functools.partial(fast.take_scalars, parse)
    try:
        for _ in chunks_taken(path, take, cursor):
            pass
    except OSError:  # gone meanwhile: keep what was read
        return True
    return cursor is None or not cursor.broken


def load_run(logdir: str, folder: str, *, reader: Optional["EventReader"] = None) -> Run:
    """The run in ``folder`` (a folder :func:`find_runs` returned for ``logdir``).

    With several sessions in the folder, the records and traces of those TensorBoard shows (see
    the module's docstring); the others are named in ``hidden`` and ``earlier_traces``. Each trace
    is assigned by the session it names (its head read, not its events), else by clock times.

    ``reader``: an :class:`.reader.EventReader` that read the folder's event files before (the
    tab's, reading a run again as it grows): only what was appended since is parsed.
    """
    name = os.path.relpath(folder, logdir)
    # TensorBoard's order: by name, which starts with the time
    files, skipped = regular_files(folder, sorted(os.listdir(folder)))
    traces = [os.path.join(folder, f) for f in files if is_trace(f)]
    holds = _holds_trainkit_tag if reader is None else reader.holds_trainkit_tag
    sessions = tuple(f for f in files if EVENTS_MARK in f and holds(os.path.join(folder, f)))

    damaged: List[Damage] = []

    def scalars_of(f: str, texts: Dict[str, str]) -> Dict[str, Points]:
        if reader is None:
            return read_scalars(folder, [f], meta=texts, damaged=damaged)
        got, read_texts = reader.read(os.path.join(folder, f))
        texts.update(read_texts)
        damage = reader.damage(os.path.join(folder, f))
        if damage is not None:
            damaged.append(damage)
        return got

    if len(sessions) < 2:
        got: Dict[str, str] = {}
        scalars = scalars_of(sessions[0], got) if sessions else {}
        return Run(name=name, path=folder, scalars=scalars, traces=tuple(traces),
                   sessions=sessions, meta=got, damaged=tuple(damaged), skipped=skipped)
    meta: Dict[str, Dict[str, str]] = {f: {} for f in sessions}
    read = [(f, scalars_of(f, meta[f])) for f in sessions]
    counted = {f: first for f, first in ((f, _first_counted(got)) for f, got in read)
               if first is not None}
    # A session that counted no step beside one that did is no run: merged, its data wait at
    # step 1 (a crash in its first step) hid the run's, its meta replaced the run's optimizers
    scalars, shown = _merge_sessions([(f, got) for f, got in read if f in counted]
                                     if counted else read, counted)
    # A session that wrote no scalar (killed before its first flush: the versions text alone)
    # hides nothing in TensorBoard, and is no session the analysis leaves out
    empty = {f for f, got in read if not any(got.values())}
    hidden = tuple(f for f in sessions if f not in shown and f not in empty)
    started = session_start(os.path.join(folder, shown[0])) if hidden and shown else None
    named = trace_sessions(traces, set(shown).union(hidden))
    # a hidden session's, by its name; by clock times, one written before the first shown began
    earlier = [t for t in traces if (named[t] in hidden if t in named
                                     else started is not None and trace_time(t) < started)]
    left_out = set(earlier)
    traces = [t for t in traces if t not in left_out]
    starts = [(session_start(os.path.join(folder, f)), counted[f])
              for f in (shown[1:] if counted else [])]
    return Run(name=name, path=folder, scalars=scalars, traces=tuple(traces), sessions=sessions,
               started=started, earlier_traces=tuple(earlier), hidden=hidden,
               hidden_counted=tuple(f for f in hidden if f in counted),
               meta={tag: text for f in shown for tag, text in meta[f].items()},
               restarts=tuple((t, first) for t, first in starts if t is not None),
               trace_sessions=named, redone=redone_from(shown, counted),
               damaged=tuple(damaged), skipped=skipped)


#: What only a counted step writes (its optimizer's update, its time since the step before): a
#: session that wrote one counted steps, from the first step it wrote them at.
_STEP_TAGS = (UPDATE_MS, STEP_TIME)


def _first_counted(got: Dict[str, Points]) -> Optional[int]:
    """The first step a session (its scalars ``got``) counted, or None where it counted none."""
    return min((got[tag].first_step() for tag in _STEP_TAGS if got.get(tag)), default=None)


def _merge_sessions(read: List[Tuple[str, Dict[str, Points]]], counted: Dict[str, int]
                    ) -> Tuple[Dict[str, Points], List[str]]:
    """The sessions' scalars as TensorBoard shows them, and the sessions shown (oldest first).

    A later session drops what the sessions before it recorded of each tag it wrote again, from
    the first step it wrote that tag at, as TensorBoard's default loader does: a relaunch that
    closed before its first step drops only its close's system sample's tags (under step 1, or
    its ``steps_done``), not the earlier run's steps. One that counted steps (a rerun: from 1; a
    resumed one: from its ``steps_done`` + 1) drops every tag from its first counted step on,
    also those it did not write again, which TensorBoard keeps: the earlier run's ``gc_ms`` (a
    ``gc.collect()`` the rerun no longer makes) would be analyzed as the rerun's.
    :func:`load_run` passes only the sessions that counted steps, where one did, and
    ``counted``: each one's first counted step (:func:`_first_counted`, found once there).
    """
    after: List[Tuple[Optional[int], Dict[str, int]]] = []  # what the sessions after each drop
    every: Optional[int] = None  # the first counted step of the sessions after
    firsts: Dict[str, int] = {}  # tag -> the first step the sessions after wrote it at
    for name, got in reversed(read):
        after.append((every, dict(firsts)))
        for tag, points in got.items():
            first = points.first_step()
            firsts[tag] = min(first, firsts.get(tag, first))
        own = counted.get(name)
        if own is not None:
            every = own if every is None else min(every, own)
    after.reverse()
    out: Dict[str, Points] = {}
    shown = []
    for (name, got), (every, tags) in zip(read, after):
        kept = False
        for tag, points in got.items():
            until = min((s for s in (every, tags.get(tag)) if s is not None), default=None)
            points = points if until is None else points.below(until)
            if points:
                was = out.get(tag)  # a tag of one session is kept as read, of several joined
                out[tag] = points if was is None else was.then(points)
                kept = True
        if kept:
            shown.append(name)
    return out, shown
