"""What the tab serves, computed from a logdir and cached until the run's files change."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ...profiling.analyze import analyze_run
from ...profiling.reader import EventReader
from ...profiling.logdir import EVENTS_MARK, find_runs, left_out, regular_files
from ...profiling.trace import is_trace

#: An ablation result a run may hold (written by the ablation report); shown as a table.
ABLATION_FILE = "ablation.json"
NO_ABLATION = "no ablation recorded"

# A run is listed when one of its event files holds a trainkit/ scalar, found by a byte scan
# (runs.scan_trainkit_tag) rather than by parsing: TensorBoard asks at every page load whether
# the tab has data, and a run of 200,000 steps is scanned in ~0.1 s, parsed in ~1.5 s.


def _signature(folder: str) -> Tuple[Tuple[str, int, float, int], ...]:
    """What a run's report is kept for: its files' names, sizes, times and modes (a file made
    readable by the chmod its report says is read then: chmod changes no size or time)."""
    out = []
    for name in sorted(os.listdir(folder)):
        if EVENTS_MARK in name or is_trace(name) or name == ABLATION_FILE:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            out.append((name, st.st_size, st.st_mtime, st.st_mode))
    return tuple(out)


def _listdir(folder: str) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:  # removed meanwhile
        return []


def _ablation(folder: str) -> Dict[str, Any]:
    path = os.path.join(folder, ABLATION_FILE)
    if not os.path.exists(path):
        return {"rows": [], "message": NO_ABLATION}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError) as exc:  # nested too deep: RecursionError
        return {"rows": [], "message": f"{ABLATION_FILE} cannot be read: {exc}"}
    rows = data.get("rows") if isinstance(data, dict) else data
    rows = rows if isinstance(rows, list) else []
    kept = [row for row in rows if isinstance(row, dict)]  # the tab's table reads each as one
    dropped = len(rows) - len(kept)
    return {"rows": kept, "message": f"{dropped} row(s) of {ABLATION_FILE} are not objects and are "
                                     f"not shown" if dropped else ""}


def _spec_roots(logdir_spec: str) -> List[Tuple[str, Optional[str]]]:
    """``--logdir_spec name:path,path2``'s folders and group names, parsed as TensorBoard does."""
    try:
        from tensorboard.backend.event_processing.data_ingester import _parse_event_files_spec
    except ImportError:  # pragma: no cover - a TensorBoard that moved it: no runs, no crash
        return []
    return sorted(_parse_event_files_spec(logdir_spec).items())


class TabData:
    """Runs and reports of one logdir, recomputed only when a run's files change.

    ``logdir_spec`` (TensorBoard's ``--logdir_spec``, when there is no ``--logdir``) names each
    run as TensorBoard does: ``<group>/<folder under its path>``.

    Example::

        data = TabData("runs"); data.runs(); data.report(".")
    """

    def __init__(self, logdir: str, logdir_spec: str = "") -> None:
        # TensorBoard expands a leading ~ of --logdir for its own tabs; so must this one.
        self.logdir = os.path.expanduser(logdir) if logdir else logdir
        self._roots = ([(self.logdir, None)] if self.logdir
                       else _spec_roots(logdir_spec) if logdir_spec else [])
        self._lock = threading.Lock()
        self._reports: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
        # run -> a lock held while its report is computed: one analysis of a run at a time (a
        # run of 1,000,000 steps takes ~1 s and ~0.2 GB to read and analyze, ~11 s in Python
        # without trainkit._speedups, and ~0.3 s once read and grown by 1,000 steps; a tab
        # reloaded meanwhile started another one, and another, each as large), and the last one
        # computed, as (monotonic time it started, signature it started with, report)
        self._computing: Dict[str, threading.Lock] = {}
        self._latest: Dict[str, Tuple[float, Any, Dict[str, Any]]] = {}
        # each event file's records read so far: a run analyzed again as it grows (every flush)
        # has only its appended records parsed (a 1,000,000-step run takes ~0.6 s to read whole,
        # ~11 s in Python), and its scan for a trainkit tag goes on from where it ended (a file
        # found once stays found, unless replaced)
        self._reader = EventReader()

    def _folders(self, unreadable: Optional[List[Tuple[str, str]]] = None) -> Dict[str, str]:
        """The runs' folders by name; ``unreadable``: a list to add the folders whose runs cannot
        be found to (:func:`.profiling.logdir.find_runs`)."""
        out = {}
        for root, group in self._roots:
            if os.path.isdir(root):
                for f in find_runs(root, unreadable):
                    rel = os.path.relpath(f, root)
                    out[os.path.join(group, rel) if group else rel] = f
        return out

    def _is_trainkit(self, folder: str) -> bool:
        """A trace, or an event file with a ``trainkit/`` scalar (what ``analyze_run`` counts),
        or one left out of the reading: listed, its report saying so (TA110), where it would be
        passed over in silence as no trainkit run."""
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return False
        if any(is_trace(n) for n in names):
            return True
        events = [n for n in names if EVENTS_MARK in n]
        # The tag scan (kept per file) opens regular files alone; only where it finds no tag are
        # the files left out looked for (no permission to read them, a named pipe, a broken
        # link: listed, its report saying them). Opening a named pipe waited for a writer, and
        # the tab's runs list with it; opening every file again on each listing is not needed.
        return (any(self._reader.holds_trainkit_tag(os.path.join(folder, n)) for n in events)
                or bool(regular_files(folder, events)[1]))

    def _report(self, name: str, folder: str) -> Dict[str, Any]:
        asked, sig = time.monotonic(), _signature(folder)
        with self._lock:
            cached = self._reports.get(name)
            if cached is not None and cached[0] == sig:
                return cached[1]
            gate = self._computing.setdefault(name, threading.Lock())
        with gate:  # asked while the run is being analyzed: wait for that analysis
            with self._lock:
                latest, cached = self._latest.get(name), self._reports.get(name)
            # One begun since this request came read the run as it was then, or newer (a trace
            # being written included, whose report is not kept below); one of the same files
            # that was kept says the same
            if latest is not None and latest[0] > asked:
                return latest[2]
            if cached is not None and cached[0] == sig:
                return cached[1]
            started, sig = time.monotonic(), _signature(folder)
            out = analyze_run(folder, folder, name=name,  # named as TensorBoard does
                              reader=self._reader).to_dict()
            out["ablation"] = _ablation(folder)
            with self._lock:
                self._latest[name] = (started, sig, out)
                # Not kept while a trace is being written: asked again, it may be complete, or,
                # left unchanged past the grace period (the same signature), broken for good.
                if not out["writing"]:
                    self._reports[name] = (sig, out)
            return out

    def runs(self) -> List[str]:
        """The runs holding trainkit records or traces, by name (``"."`` is the logdir).

        What the reader kept of event files no longer in the logdir (a run deleted) is dropped.
        """
        folders = self._folders()
        self._reader.forget({os.path.join(folder, n) for folder in folders.values()
                             for n in _listdir(folder) if EVENTS_MARK in n})
        return [name for name, folder in sorted(folders.items()) if self._is_trainkit(folder)]

    def left_out(self) -> List[Dict[str, str]]:
        """The logdir's folders whose runs cannot be found, for want of permission to list them
        or to enter them: ``{"path", "what", "said"}`` each, ``said`` with the fix (as
        ``trainkit analyze`` warns it); a run in one would be missing from :meth:`runs` unsaid.
        """
        unreadable: List[Tuple[str, str]] = []
        self._folders(unreadable)
        return [{"path": path, "what": what, "said": left_out(path, what)}
                for path, what in unreadable]

    def has_runs(self) -> bool:
        """Cheap check for ``is_active``: a trace, or an event file with trainkit scalars."""
        return any(self._is_trainkit(folder) for folder in self._folders().values())

    def report(self, name: str) -> Optional[Dict[str, Any]]:
        """The tab's JSON for one run, or None when there is no such trainkit run."""
        folder = self._folders().get(name)
        if folder is None or not self._is_trainkit(folder):
            return None
        try:
            return self._report(name, folder)
        except OSError:
            if os.path.isdir(folder):
                raise
            return None  # deleted since it was listed (a run cleaned up while the tab is open)

    def trace_path(self, name: str, file: str) -> Optional[str]:
        """The path of a trace listed for the run (its earlier sessions' included); None for
        anything else (no traversal)."""
        rep = self.report(name)
        if rep is None or file not in rep["traces"] + rep["earlier_traces"]:
            return None
        folder = self._folders().get(name)  # None: the run was deleted since its report
        return None if folder is None else os.path.join(folder, file)
