"""SIGTERM, SIGHUP and SIGINT around a session.

On SIGTERM, and on SIGHUP (the terminal closed, ``kill -HUP``: by default it too ends the process
at once, and lost every record since the last write), the active session is flushed and closed,
then the signal is raised again with the previous handler, so the exit status is the one the
process would have had (a handler of the user's that lets the process live on gets a flush, and the
session goes on recording). While a session closes, these signals are held and act once everything
is written, and so is SIGCHLD: a DataLoader's handler for it (torch's) raises when one of its
workers died, as they do when a SIGTERM goes to the whole process group (a job scheduler's,
``kill -- -PGID``), and raised inside the final write it lost the run's last records. Python sets signal
handlers only in the main thread; elsewhere these do nothing. A signal whose handler was set in C
(``faulthandler.register``) is left alone (:func:`set_in_c`). The process's other ends are here
too: its exit closes the active session (atexit, and multiprocessing's finalizers in a child that
ends by ``os._exit``), and a forked child (a DataLoader worker) records nothing.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import Any, Dict, Iterator, List

#: The signals that end a process by default, and that flush and close the session first:
#: SIGHUP where there is one (not on Windows).
_ENDING = (signal.SIGTERM,) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
#: The signals held while a session writes: SIGCHLD where there is one.
_HELD = (signal.SIGINT,) + _ENDING + ((signal.SIGCHLD,) if hasattr(signal, "SIGCHLD") else ())
_prev: Dict[int, Any] = {}  # signal -> its handler before install()
_installed = False
_exit_hooks_pid = 0  # the process whose exit closes the active session
_sigaction: Any = None  # the C library's sigaction(), found at the first use


def _session_module() -> Any:
    # ``trainkit.session`` the attribute is the function ``tk.session``: the module by name.
    return importlib.import_module(__package__ + ".session")


def on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM's and SIGHUP's handler while a session records."""
    S = _session_module()
    prev = _prev.get(signum)
    if callable(prev) or prev == signal.SIG_IGN:
        # The process may live on (a handler that sets a "stop after this epoch" flag, or one
        # that ignores SIGTERM): write what is recorded, and keep recording.
        s = S._active
        with held(replay=False) as came:
            if s is not None:
                s.flush()
        try:
            if callable(prev):
                prev(signum, frame)
        finally:
            _replay(came)  # after the user's handler, as they would have come without trainkit
        return
    # Default action: flush and close, then die by the signal, so that the parent sees the same
    # exit status as without trainkit (a shell's 143 or 129). A DataLoader's workers killed by
    # the same SIGTERM (sent to the process group) would have torch raise its "worker killed"
    # error here, after the close, in place of the exit by SIGTERM: the process is ending, so
    # SIGCHLD is let be.
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        S._close_active()
    finally:
        release()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _close_active() -> None:
    _session_module()._close_active()


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) records nothing: no writer drains its copy of the
    # buffer, which a region timed in a Dataset's __getitem__ grew for the whole run.
    S = sys.modules.get(__package__ + ".session")
    s = None if S is None else S._active
    if s is not None:
        S._active = None
        s._buf = collections.deque(maxlen=0)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def set_in_c(sig: int) -> bool:
    """Whether ``sig`` has a handler set outside Python's ``signal`` module (``faulthandler.
    register(signal.SIGTERM)``, a C library's ``sigaction``), which ``signal.getsignal`` does not
    see (it says the default, or None). Setting a handler of trainkit's over it, then giving
    "the default" back at close, took it away for the rest of the process: such a signal is left
    alone. Read with the C library's ``sigaction`` (its handler is the struct's first field on
    glibc, musl and macOS); False where that cannot be read (Windows)."""
    prev = signal.getsignal(sig)
    if prev is None:  # set in C, and Python knows it is not its own
        return True
    if prev != signal.SIG_DFL or os.name != "posix":
        return False
    global _sigaction
    try:
        import ctypes

        if _sigaction is None:
            _sigaction = ctypes.CDLL(None).sigaction
        action = ctypes.create_string_buffer(512)  # larger than any platform's struct sigaction
        if _sigaction(int(sig), None, action) != 0:
            return False
        handler = ctypes.c_void_p.from_buffer(action).value
    except Exception:  # no C library to ask: as Python says
        return False
    return handler not in (None, 0, 1)  # neither SIG_DFL nor SIG_IGN


def install() -> None:
    """Close the active session at exit, and flush it on SIGTERM and SIGHUP (set from the main
    thread; elsewhere they are left alone)."""
    global _installed, _exit_hooks_pid
    if _exit_hooks_pid != os.getpid():  # once per process (closing twice is a no-op)
        _exit_hooks_pid = os.getpid()
        atexit.register(_close_active)
        mp = sys.modules.get("multiprocessing.util")
        if mp is not None:  # a multiprocessing child started by fork or forkserver ends by
            # os._exit, which runs no atexit (its unclosed session lost all), only these
            mp.Finalize(None, _close_active, exitpriority=100)
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    for sig in _ENDING:
        prev = signal.getsignal(sig)
        if sig != signal.SIGTERM and prev == signal.SIG_IGN:
            # nohup: SIGHUP ends nothing, and a handler here would end its ignoring in every
            # program the script runs (exec resets a handled signal, keeps an ignored one)
            continue
        if set_in_c(sig):  # faulthandler's: no flush on it, but the user's handler is kept
            continue
        _prev[sig] = prev
        signal.signal(sig, on_sigterm)
    _installed = True


def release() -> None:
    """Give SIGTERM and SIGHUP back to the handlers they had before :func:`install`."""
    global _installed
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in _ENDING:
        if signal.getsignal(sig) is on_sigterm:
            prev = _prev.get(sig)
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
    _installed = False


@contextlib.contextmanager
def held(replay: bool = True) -> Iterator[List[int]]:
    """Hold SIGINT, SIGTERM, SIGHUP and SIGCHLD while a session writes, then let them act as they
    would have: a second Ctrl-C (or torch's error for a DataLoader worker that died) during the final
    write would leave a half-closed session and lose the records the write was for. Yields the
    signals that came, in order; with ``replay=False`` the caller replays them
    (:func:`_replay`). Only the main thread can set handlers; elsewhere a no-op."""
    came: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    saved: Dict[int, Any] = {}
    for sig in _HELD:
        if sig not in (signal.SIGINT,) + _ENDING and not callable(signal.getsignal(sig)):
            continue  # SIGCHLD: only a Python handler (a DataLoader's) can raise; others left be
        if set_in_c(sig):  # held, it would be given back as the default: the C handler lost
            continue
        try:
            saved[sig] = signal.signal(sig, lambda signum, frame: came.append(signum))
        except (ValueError, OSError):  # not settable here
            pass
    try:
        yield came
    finally:
        for sig, prev in saved.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        if replay:
            _replay(came)


def _replay(came: List[int]) -> None:
    for signum in dict.fromkeys(came):  # each once, in the order they came
        signal.raise_signal(signum)
