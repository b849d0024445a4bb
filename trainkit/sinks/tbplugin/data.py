"""What the tab serves, computed from a logdir and cached until the run's files change."""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from ...profiling.analyze import analyze_run
from ...profiling.runs import EVENTS_MARK, find_runs
from ...profiling.trace import is_trace

#: An ablation result a run may hold (written by the ablation report); shown as a table.
ABLATION_FILE = "ablation.json"
NO_ABLATION = "no ablation recorded"


def _signature(folder: str) -> Tuple[Tuple[str, int, float], ...]:
    out = []
    for name in sorted(os.listdir(folder)):
        if EVENTS_MARK in name or is_trace(name) or name == ABLATION_FILE:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            out.append((name, st.st_size, st.st_mtime))
    return tuple(out)


def _ablation(folder: str) -> Dict[str, Any]:
    path = os.path.join(folder, ABLATION_FILE)
    if not os.path.exists(path):
        return {"rows": [], "message": NO_ABLATION}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"rows": [], "message": f"{ABLATION_FILE} cannot be read: {exc}"}
    rows = data.get("rows") if isinstance(data, dict) else data
    return {"rows": rows if isinstance(rows, list) else [], "message": ""}


class TabData:
    """Runs and reports of one logdir, recomputed only when a run's files change.

    Example::

        data = TabData("runs"); data.runs(); data.report(".")
    """

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self._lock = threading.Lock()
        self._reports: Dict[str, Tuple[Any, Dict[str, Any]]] = {}

    def _folders(self) -> Dict[str, str]:
        if not self.logdir or not os.path.isdir(self.logdir):
            return {}
        return {os.path.relpath(f, self.logdir): f for f in find_runs(self.logdir)}

    def _report(self, name: str, folder: str) -> Dict[str, Any]:
        sig = _signature(folder)
        with self._lock:
            cached = self._reports.get(name)
            if cached is not None and cached[0] == sig:
                return cached[1]
        out = analyze_run(self.logdir, folder).to_dict()
        out["ablation"] = _ablation(folder)
        with self._lock:
            self._reports[name] = (sig, out)
        return out

    def runs(self) -> List[str]:
        """The runs holding trainkit records or traces, by name (``"."`` is the logdir)."""
        return [name for name, folder in sorted(self._folders().items())
                if self._report(name, folder)["trainkit"]]

    def has_runs(self) -> bool:
        """Cheap check for ``is_active``: a trace, or an event file with trainkit scalars."""
        return bool(self.runs())

    def report(self, name: str) -> Optional[Dict[str, Any]]:
        """The tab's JSON for one run, or None when there is no such trainkit run."""
        folder = self._folders().get(name)
        if folder is None:
            return None
        rep = self._report(name, folder)
        return rep if rep["trainkit"] else None

    def trace_path(self, name: str, file: str) -> Optional[str]:
        """The path of a trace listed for the run; None for anything else (no traversal)."""
        rep = self.report(name)
        if rep is None or file not in rep["traces"]:
            return None
        return os.path.join(self._folders()[name], file)
