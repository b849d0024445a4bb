"""What a path that is no regular file is, in words: for the commands that read files they were
given or found (``trainkit lint``, ``trainkit analyze``, the tab) and refuse the others.

A named pipe (FIFO) is opened and read as a file is, and waits for a writer forever; a device
such as ``/dev/zero`` never ends; a broken link has nothing to read, and Python's error for it
("[Errno 2] No such file or directory") names a path that ``ls`` lists.
"""
from __future__ import annotations

import os
import stat


def not_regular(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is when it is no regular file ("" for a regular file).

    Example::

        what = not_regular(os.stat(path).st_mode)  # "a named pipe (FIFO)" for a FIFO
    """
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a folder" if stat.S_ISDIR(mode) else "a special file"


def broken_link(path: str) -> str:
    """``path`` in words when it is a link whose target does not exist, else "".

    Example::

        broken_link("b.py")  # "a broken symbolic link (to 'missing.py', which does not exist)"
    """
    if not os.path.islink(path) or os.path.exists(path):
        return ""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"a broken symbolic link (to {target!r}, which does not exist)"
