"""Paths given to the API, file discovery and reading: which files to lint and their text."""
from __future__ import annotations

import errno
import io
import os
import tokenize
from typing import Collection, Iterator, List, Optional, Set, Tuple, Union

from trainkit._filekinds import broken_link, not_regular
from trainkit.lint._registry import LintError

PathArg = Union[str, "os.PathLike[str]"]

# Folders that hold someone else's code or build output, never the user's training script.
_SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules", "venv"})


def as_path(value: object, *, call: str) -> str:
    """``value`` as a ``str`` path: a ``str`` as it is, an ``os.PathLike`` (``pathlib.Path``) through
    :func:`os.fspath`.

    Raises:
        TypeError: Anything else (bytes paths included), naming ``value`` and the fix.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise TypeError(f"{call}({value!r}): a path must be a str or os.PathLike (such as pathlib.Path), "
                    f"got {type(value).__name__}; e.g. {call}('train.py')")


def as_paths(value: object) -> List[str]:
    """The paths given to ``lint_paths``: one path, or a collection of them, as ``str``.

    Raises:
        TypeError: Neither a path nor an iterable of paths, or an item that is no path.
    """
    fix = "pass a path or a list of paths (str or os.PathLike), e.g. lint_paths(['train.py'])"
    if isinstance(value, (str, os.PathLike)):
        return [as_path(value, call="lint_paths")]
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise TypeError(f"lint_paths({value!r}): paths must be a str or os.PathLike path or a collection "
                        f"of them, got {type(value).__name__}; {fix}")
    out = []
    for item in value:  # type: ignore[attr-defined]
        if not isinstance(item, (str, os.PathLike)) or not isinstance(os.fspath(item), str):
            raise TypeError(f"lint_paths(...): each path must be a str or os.PathLike, got {item!r} "
                            f"({type(item).__name__}); {fix}")
        out.append(os.fspath(item))
    return out


def iter_python_files(paths: Collection[PathArg], seen: Optional[Set[str]] = None,
                      errors: Optional[List[LintError]] = None) -> Iterator[str]:
    """Yield the files to lint: given files as they are, ``*.py`` under given folders.

    Hidden folders, ``__pycache__``, virtual environments (any folder with a
    ``pyvenv.cfg``) and ``site-packages`` are skipped; links to folders are followed, each real
    folder once. With ``seen`` (a set of real paths, added
    to), a file already in it is skipped: one file named twice (a folder and a file in it) is
    linted once. A folder that cannot be listed (no permission) is never passed over in
    silence: one given raises; one found inside a given folder is added to ``errors`` (the walk
    goes on), or raises without it.

    Raises:
        LintError: A path that does not exist, or a folder that cannot be listed.

    Example::

        >>> list(iter_python_files(["train.py"]))  # doctest: +SKIP
        ['train.py']
    """
    for path in as_paths(paths):
        if os.path.isdir(path):
            # Links to folders are followed, each real folder walked once: a link back to a folder
            # above (or to itself) would otherwise walk forever.
            walked = {os.path.realpath(path)}

            def unlisted(exc: OSError, top: str = path) -> None:
                error = LintError(exc.filename or top, 0, f"cannot read: {_unlisted(exc)}")
                if errors is None or (exc.filename or top) == top:  # os.walk lists top as given
                    raise error from exc
                errors.append(error)

            for root, dirs, files in os.walk(path, onerror=unlisted, followlinks=True):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith(".")
                    and d not in _SKIP_DIRS
                    and not os.path.exists(os.path.join(root, d, "pyvenv.cfg"))
                    and _first(os.path.join(root, d), walked)
                )
                for name in sorted(files):
                    if name.endswith(".py") and _first(os.path.join(root, name), seen):
                        yield os.path.join(root, name)
        elif os.path.exists(path):
            if _first(path, seen):
                yield path
        else:
            raise LintError(path, 0, "no such file or directory")


def _first(path: str, seen: Optional[Set[str]]) -> bool:
    """Whether ``path`` is not in ``seen`` (by its real path), which it joins; always without."""
    if seen is None:
        return True
    key = os.path.realpath(path)
    if key in seen:
        return False
    seen.add(key)
    return True


def read_source(path: str) -> str:
    """Read a file honouring its ``# coding:`` cookie, as Python would.

    Only a regular file is read: a named pipe (FIFO) would wait for a writer forever, a device
    (``/dev/zero``) never end; a broken link is said to be one.

    Raises:
        LintError: The file cannot be read or decoded, or is no regular file.
    """
    try:
        # Opened without waiting (a FIFO's open waits for a writer), then checked: the file
        # read is the one checked, whatever replaced the path meanwhile.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise LintError(path, 0, f"cannot read: {_why_not_opened(path, exc)}") from exc
    try:
        with open(fd, "rb") as raw:
            what = not_regular(os.fstat(raw.fileno()).st_mode)
            if what:
                raise LintError(path, 0, f"cannot read: {what}, not a regular file: not linted "
                                         f"(reading it could wait or run forever); lint the .py file itself")
            encoding, _ = tokenize.detect_encoding(raw.readline)
            raw.seek(0)
            with io.TextIOWrapper(raw, encoding, line_buffering=True) as handle:
                return handle.read()
    except (UnicodeDecodeError, SyntaxError) as exc:
        undecodable = _undecodable(path)  # a bad byte on line 1 or 2 is a SyntaxError in detect_encoding
        if undecodable is None:
            raise LintError(path, 0, f"cannot read: {exc}") from exc
        line, reason = undecodable
        raise LintError(path, line, f"cannot read: {reason}") from exc
    except OSError as exc:
        raise LintError(path, 0, f"cannot read: {exc}") from exc


def _unlisted(exc: OSError) -> str:
    """Why a folder could not be listed, in words, with the fix."""
    if isinstance(exc, PermissionError):
        return (f"a folder you have no permission to list: its files are not linted; make it "
                f"readable (chmod u+rx {exc.filename}) or lint as a user who can read it")
    return f"a folder that cannot be listed ({exc.strerror or exc}): its files are not linted"


def _why_not_opened(path: str, exc: OSError) -> str:
    """Why ``path`` could not be opened, in words: a broken link says where it points."""
    link = broken_link(path) if isinstance(exc, FileNotFoundError) else ""
    if link:
        return f"{link}: not linted; remove the link or point it at the file"
    if isinstance(exc, PermissionError):
        return (f"no permission to read it: not linted; make it readable (chmod u+r {path}) or "
                f"lint as a user who can read it")
    if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
        return "a socket, not a regular file: not linted; lint the .py file itself"
    return str(exc)


def _undecodable(path: str) -> Optional[Tuple[int, str]]:
    """The line of the first byte that does not decode in the file's encoding (its coding
    comment's, else UTF-8), and what to do about it; None when every byte decodes (or the file
    cannot be read again)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        except SyntaxError:
            encoding = "utf-8"  # no usable declaration: Python reads the file as UTF-8
        data.decode(encoding)
    except (OSError, LookupError):
        return None
    except UnicodeDecodeError as exc:
        head = data[:exc.start]
        line = head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1
        start = max(head.rfind(b"\n"), head.rfind(b"\r")) + 1
        column = len(head[start:].decode(encoding, errors="replace")) + 1  # characters, as `col` counts
        shown = "UTF-8" if encoding.replace("_", "-").lower() in ("utf-8", "utf-8-sig") else encoding
        return line, (f"byte {data[exc.start]:#04x} (column {column}) is not valid {shown}; fix: save the file as "
                      f"UTF-8, or declare its encoding on line 1 or 2, e.g. `# -*- coding: latin-1 -*-`")
    return None
