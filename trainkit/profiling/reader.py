"""Reading a growing run's event files again: only what was appended since the last read.

The tab analyzes a live run again each time its files change (every flush, ~2 s); a run of
1,000,000 steps takes ~0.6 s to read whole (~11 s in Python, without trainkit._speedups:
benchmarks/results/analyze_long-cpu.txt). Event files only grow: records are appended, the last
one possibly partly written. :class:`EventReader` keeps, per event file, the offset after the last
complete record parsed and what the records before it held (each tag's points, the meta texts,
with ``SessionLog.START``'s rule applied: a START at step N drops the file's earlier points from
step N on), and parses only the bytes after that offset when the same file grew. A file that
shrank, or was replaced (another inode, or other first bytes), is read again whole.

What it reads equals :func:`.runs.read_scalars` of the file alone, read afresh. The one-shot
``trainkit analyze`` does not use it: it would keep every file's points for nothing.
"""
from __future__ import annotations

import dataclasses
import os
import stat
import threading
from typing import Dict, Optional, Tuple

from . import runs
from .eventfiles import Cursor, Damage, damage_of
from .points import Points, ScalarsParse

_HEAD = 64  # first bytes kept to tell a file rewritten in place (same inode) from one grown


@dataclasses.dataclass
class _FileState:
    """What one event file held up to ``cursor.offset``."""

    dev: int
    ino: int
    head: bytes
    cursor: Cursor
    #: False once nothing more will be read from the file (a wrong CRC, or no event file)
    more: bool
    points: Dict[str, Points]  # the tags holding any
    meta: Dict[str, str]
    #: where a wrong CRC stopped the reading (None: none did)
    damage: Optional[Damage] = None


class EventReader:
    """Event files read once and then only their appended bytes; for a reader that reads the
    same run again and again (the tab: :class:`trainkit.sinks.tbplugin.data.TabData`).

    Thread-safe: each file is read by one thread at a time.

    Example::

        reader = EventReader(); run = load_run(logdir, folder, reader=reader)
        ...  # the run grew
        run = load_run(logdir, folder, reader=reader)  # parses the new records only
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: Dict[str, _FileState] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._scanned: Dict[str, Tuple[int, int, int, bool]] = {}
        #: bytes parsed, over all reads (what a test asks: only the new ones)
        self.parsed_bytes = 0

    def read(self, path: str) -> Tuple[Dict[str, Points], Dict[str, str]]:
        """The event file's scalars (``tag -> points``, the tags holding any) and ``trainkit/
        meta/...`` texts, as :func:`.runs.read_scalars` reads the file alone. Do not change
        either: they are kept for the next read.
        """
        with self._lock:
            gate = self._locks.setdefault(path, threading.Lock())
        with gate:
            state = self._update(path)
        if state is None:
            return {}, {}
        return state.points, state.meta

    def _update(self, path: str) -> Optional[_FileState]:
        try:
            st = os.stat(path)
        except OSError:  # gone
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):  # a named pipe: reading it would wait
            with self._lock:
                self._files.pop(path, None)
            return None
        with self._lock:
            state = self._files.get(path)
        if state is not None and not self._same_file(path, state, st):
            state = None
        if state is None:
            state = _FileState(dev=st.st_dev, ino=st.st_ino, head=b"", cursor=Cursor(),
                               more=True, points={}, meta={})
        if state.more and st.st_size > state.cursor.offset:
            before = state.cursor.offset
            parse = ScalarsParse(state.points, dict(state.meta), meta_prefix=runs.META)
            more = runs.parse_file(path, parse, state.cursor)
            self.parsed_bytes += state.cursor.offset - before
            # a new state, not the old one changed: the points handed out before stay as they were
            state = dataclasses.replace(state, more=more, points=parse.result(), meta=parse.meta,
                                        head=state.head or self._head(path, state.cursor.offset),
                                        damage=damage_of(path, state.cursor))
        with self._lock:
            self._files[path] = state
        return state

    @staticmethod
    def _head(path: str, upto: int) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read(min(_HEAD, upto))
        except OSError:
            return b""

    def _same_file(self, path: str, state: _FileState, st: os.stat_result) -> bool:
        """The file read before, grown or not: same device and inode, not shorter than what was
        read, and the same first bytes (a file written anew in place has another first event)."""
        if (st.st_dev, st.st_ino) != (state.dev, state.ino) or st.st_size < state.cursor.offset:
            return False
        return not state.head or self._head(path, len(state.head)) == state.head

    def damage(self, path: str) -> Optional[Damage]:
        """Where the last :meth:`read` of ``path`` found it corrupt (None: it did not)."""
        with self._lock:
            state = self._files.get(path)
        return None if state is None else state.damage

    def holds_trainkit_tag(self, path: str) -> bool:
        """:func:`.runs.scan_trainkit_tag`, scanning a grown file from where it stopped (once
        found, found for the same file)."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):  # a named pipe: its reading would wait for a writer
            return False
        with self._lock:
            dev, ino, done, found = self._scanned.get(path, (st.st_dev, st.st_ino, 0, False))
        if (dev, ino) != (st.st_dev, st.st_ino) or st.st_size < done:
            done, found = 0, False
        if found:
            return True
        try:
            done, found = runs.scan_trainkit_tag(path, done)
        except OSError:
            return False
        with self._lock:
            self._scanned[path] = (st.st_dev, st.st_ino, done, found)
        return found

    def forget(self, keep: "set[str]") -> None:
        """Drop what was kept of the files not in ``keep`` (paths): deleted runs' files."""
        with self._lock:
            for path in [p for p in self._files if p not in keep]:
                del self._files[path]
                self._locks.pop(path, None)
            for path in [p for p in self._scanned if p not in keep]:
                del self._scanned[path]
