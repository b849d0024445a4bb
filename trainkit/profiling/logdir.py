"""A logdir's run folders, and the files of each to read: what cannot be read is left out and
said (with its path, what it is and the fix), never passed over in silence.

Left out: an event file or a trace that is no regular file (a named pipe would keep the reading
waiting for a writer forever, a device never end it, a broken link has nothing to read), one the
user has no permission to read, a folder the user has no permission to list, and one the user
may list but not enter (``chmod u-x``: its names are read, but none of its files or folders can be
opened), with the runs in either.
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
#: What a folder that can be listed but not entered is (read permission without execute), in
#: :func:`find_runs`'s ``unreadable``.
NO_ENTER = "a folder you have permission to list but not to enter (no x permission)"
#: What a file that cannot be read is, in :func:`regular_files`'s left out.
NO_READ = "a file you have no permission to read"


def find_runs(logdir: str, unreadable: Optional[List[Tuple[str, str]]] = None) -> List[str]:
    """Folders under ``logdir`` (itself included) holding event files or traces, sorted.

    Symlinked folders are followed, as TensorBoard follows them (runs linked into one logdir to
    compare them), each real folder once, so a link back up the tree ends.

    ``unreadable``: a list to add ``(path, NO_LIST)`` to for each folder that cannot be listed
    for want of permission (``chmod 000``), and ``(path, NO_ENTER)`` for each that can be listed
    but not entered (``chmod u-x``): its runs are not found. The folders under one not entered
    are not said apart: their fix is the one folder's.
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
        if (dirs or files) and not _enterable(folder, (dirs or files)[0]):
            # Its event files could not be opened, nor its folders listed (each would be said as
            # a folder of its own to fix): said once, here, and passed by.
            if unreadable is not None:
                unreadable.append((folder, NO_ENTER))
            dirs[:] = []
            continue
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
        if not what and (EVENTS_MARK in n or is_trace(n)) and no_permission(path):
            what = NO_READ
        if not what:
            kept.append(n)
        elif EVENTS_MARK in n or is_trace(n):
            skipped.append((path, what))
    return kept, tuple(skipped)


def no_permission(path: str) -> bool:
    """Whether opening the regular file ``path`` is refused for want of permission (the open
    itself asked: it is what the reading does, for root without CAP_DAC_OVERRIDE too)."""
    try:
        with open(path, "rb"):
            return False
    except PermissionError:
        return True
    except OSError:  # gone meanwhile: the reading says nothing of it either
        return False


def _enterable(folder: str, name: str) -> bool:
    """Whether an entry ``name`` of ``folder`` (one listed) can be looked up: False where the
    folder may be listed but not entered (no x permission), whatever the entry."""
    try:
        os.lstat(os.path.join(folder, name))
    except PermissionError:
        return False
    except OSError:  # gone meanwhile
        pass
    return True


def left_out(path: str, what: str) -> str:
    """A file left out (no regular file, or not readable) or a folder whose runs are not found,
    in words, with the fix (what ``tk.analyze`` warns and the tab shows)."""
    if what == NO_READ:
        return f"{path!r} is {what}: left out; make it readable (chmod u+r {path})"
    if what == NO_LIST:
        return (f"{path!r} is {what}: the runs in it are not analyzed; make it readable "
                f"(chmod u+rx {path})")
    if what == NO_ENTER:
        return (f"{path!r} is {what}: the runs in it are not analyzed; make it searchable "
                f"(chmod u+x {path})")
    why = " (reading a named pipe waits for a writer forever)" if "FIFO" in what else ""
    return (f"{path!r} is {what}, not a regular file: left out{why}; remove it, or put the file "
            f"it stands for in its place")
