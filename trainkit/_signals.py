"""SIGTERM and SIGINT around a session.

On SIGTERM the active session is flushed and closed, then the signal is raised again with the
previous handler, so the exit status is the one the process would have had (a handler of the
user's that lets the process live on gets a flush, and the session goes on recording). While a
session closes, both signals are held and act once everything is written. Python sets signal
handlers only in the main thread; elsewhere these do nothing.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import signal
import threading
from typing import Any, Dict, Iterator, List

_prev_sigterm: Any = None
_installed = False


def _session_module() -> Any:
    # ``trainkit.session`` the attribute is the function ``tk.session``: the module by name.
    return importlib.import_module(__package__ + ".session")


def on_sigterm(signum: int, frame: Any) -> None:
    S = _session_module()
    prev = _prev_sigterm
    if callable(prev) or prev == signal.SIG_IGN:
        # The process may live on (a handler that sets a "stop after this epoch" flag, or one
        # that ignores SIGTERM): write what is recorded, and keep recording.
        s = S._active
        if s is not None:
            s.flush()
        if callable(prev):
            prev(signum, frame)
        return
    # Default action: flush and close, then die by the signal, so that the parent sees the same
    # exit status as without trainkit.
    S._close_active()
    release()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def install() -> None:
    """Flush the active session on SIGTERM (from the main thread; elsewhere a no-op)."""
    global _prev_sigterm, _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    _prev_sigterm = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_sigterm)
    _installed = True


def release() -> None:
    """Give SIGTERM back to the handler it had before :func:`install`."""
    global _installed
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is on_sigterm:
        signal.signal(signal.SIGTERM, _prev_sigterm if _prev_sigterm is not None else signal.SIG_DFL)
    _installed = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a session closes, then let them act as they would have:
    a second Ctrl-C during the final write would leave a half-closed session and lose the
    records the write was for. Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: List[int] = []
    saved: Dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[sig] = signal.signal(sig, lambda signum, frame: came.append(signum))
        except (ValueError, OSError):  # not settable here
            pass
    try:
        yield
    finally:
        for sig, prev in saved.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(came):  # each once, in the order they came
            signal.raise_signal(signum)
