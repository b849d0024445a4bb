"""A logdir's run folders, and the files of each to read: what cannot be read is left out and
said (with its path, what it is and the fix), never passed over in silence.

Left out: an event file or a trace that is no regular file (a named pipe would keep the reading
waiting for a writer forever, a device never end it, a broken link has nothing to read), one the
user has no permission to read, and a folder the user has no permission to list (its runs).
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .._filekinds import broken_link, not_regular
from .trace import is_trace

#: What names a TensorBoard event file (``events.out.tfevents.<time>.<host>...``).
EVENTS_MARK = "tfevents"
#: What a folder that cannot be listed is, in :func:`find_runs`'s ``unreadable``.
NO_LIST = "a folder you have no permission to list"
#: What a file that cannot be read is, in :func:`regular_files`'s left out.
NO_READ = "a file you have no permission to read"


def find_runs(logdir: str, unreadable: Optional[List[Tuple[str, str]]] = None) -> List[str]:
    """Folders under ``logdir`` (itself included) holding event files or traces, sorted.

    Symlinked folders are followed, as TensorBoard follows them (runs linked into one logdir to
    compare them), each real folder once, so a link back up the tree ends.

    ``unreadable``: a list to add ``(path, NO_LIST)`` to for each folder that cannot be listed
    for want of permission (``chmod 000``): its runs are not found.
    """
    def said(exc: OSError) -> None:
        if unreadable is not None and isinstance(exc, PermissionError) and exc.filename:
            unreadable.append((os.fspath(exc.filename), NO_LIST))

    found = []
    seen = set()
    for folder, dirs, files in os.walk(logdir, onerror=said, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        if any(EVENTS_MARK in f or is_trace(f) for f in files):
            found.append(folder)
    return found


def regular_files(folder: str, names: List[str]
                  ) -> Tuple[List[str], Tuple[Tuple[str, str], ...]]:
    """Of ``names`` (in ``folder``), those to read, and ``(path, what it is)`` of the event files
    and traces left out: no regular file (:func:`.._filekinds.not_regular`, a broken link), or
    one the user may not read (:data:`NO_READ`), which the reading would pass over in silence."""
    kept, skipped = [], []
    for n in names:
        path = os.path.join(folder, n)
        try:
            what = not_regular(os.stat(path).st_mode)
        except OSError:
            what = broken_link(path)
            if not what:  # gone meanwhile
                continue
        if not what and (EVENTS_MARK in n or is_trace(n)) and _no_permission(path):
            what = NO_READ
        if not what:
            kept.append(n)
        elif EVENTS_MARK in n or is_trace(n):
            skipped.append((path, what))
    return kept, tuple(skipped)


def _no_permission(path: str) -> bool:
    """Whether opening the regular file ``path`` is refused for want of permission (the open
    itself asked: it is what the reading does, for root without CAP_DAC_OVERRIDE too)."""
    try:
        with open(path, "rb"):
            return False
    except PermissionError:
        return True
    except OSError:  # gone meanwhile: the reading says nothing of it either
        return False
