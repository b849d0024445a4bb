"""Bad usage under torchrun: said once, and every rank exits 2.

Every rank parses the same command line, so each meets the same usage error. Said by each, it
was printed once per rank. Said by one rank while the others exit at once, it could be lost:
torchrun ends the other ranks (SIGTERM) as soon as one exits, the one meant to say it included,
and a rank it ends exits -15, not 2. So the machine's first rank says it at once, and the ranks
meet in the key-value store torchrun's agent serves them (``MASTER_ADDR:MASTER_PORT``): each
checks in with SIGTERM caught (exit 2), and none exits before all have checked in.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any, Callable, Iterator

from . import _env
from ._signals import set_in_c

#: Seconds a rank waits for the others to meet the same usage error. Past it (a rank with an
#: error of its own, such as its own GPU's memory), a quiet rank says its error itself.
USAGE_WAIT = 30.0


def ranked() -> bool:
    """Whether this process is a rank started by torchrun (or a launcher like it)."""
    try:
        return _env.rank() is not None
    except ValueError:  # a RANK that is no int: the session says so where it matters
        return False


def quiet_rank() -> bool:
    """Under torchrun, whether this rank leaves saying bad usage to its machine's first rank
    (LOCAL_RANK 0: each machine's torchrun prints to a terminal of its own)."""
    if not ranked():
        return False
    local = _env.get(_env.LOCAL_RANK)
    return (local if local is not None else _env.get(_env.RANK)) != "0"


def leave(text: str, out: Any = None) -> int:
    """Say ``text`` (a usage error; empty when argparse said it) on ``out`` (default stderr;
    stdout for the help of ``trainkit`` with no command) unless this is a quiet rank, and return
    2, the exit status of bad usage; under torchrun, first meet the other ranks, then end this
    process with status 2.

    Example::

        return leave("trainkit demo: demo epochs=0: must be a positive int, e.g. --epochs 2\\n")
    """
    out = sys.stderr if out is None else out
    quiet = quiet_rank()
    if not quiet:
        out.write(text)
        out.flush()
    met = _met_every_rank()
    if met is None:
        return 2
    if not met and quiet:
        out.write(text)  # the first rank did not meet this error: say it here
    sys.stdout.flush()
    sys.stderr.flush()
    # Now, not after the interpreter's shutdown: it puts SIGTERM back to its default first, and
    # torchrun ends the ranks left as soon as one has exited.
    os._exit(2)


def _met_every_rank() -> "bool | None":
    """Whether every rank checked in within USAGE_WAIT (None: no torchrun store to meet in)."""
    if not ranked() or _env.get(_env.USE_AGENT_STORE) != "True":
        return None  # no launcher that ends the ranks left when one exits
    import datetime
    import threading

    try:
        from torch.distributed import TCPStore

        # At least a second: torch 2.3/2.4 truncate it to whole seconds (0: no connect at all).
        store = TCPStore(_env.get(_env.MASTER_ADDR) or "", int(_env.get(_env.MASTER_PORT) or 0),
                         is_master=False,
                         timeout=datetime.timedelta(seconds=max(USAGE_WAIT, 1.0)))
    except Exception:  # no store after all: leave as without torchrun
        return None
    # From here on a SIGTERM from torchrun (another rank left first) is this rank's exit 2 too.
    if threading.current_thread() is threading.main_thread():  # where Python takes signals
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(2))
    key = f"trainkit/usage_error/{_env.get(_env.RESTART_COUNT) or 0}"
    world = int(_env.get(_env.WORLD_SIZE) or 1)
    here = store.add(key, 1)
    deadline = time.monotonic() + USAGE_WAIT
    while here < world and time.monotonic() < deadline:
        time.sleep(0.02)
        here = store.add(key, 0)
    return here >= world


def interruptible(command: str, work: Callable[[], int]) -> int:
    """``work()``'s exit status; a Ctrl-C during it is said in one line (``trainkit lint:
    interrupted``), not a KeyboardInterrupt's traceback, and the process still ends by SIGINT
    (:func:`die_by`). For the commands that keep nothing a Ctrl-C could lose (``trainkit
    analyze`` and ``lint``, however they are started: ``trainkit``, ``python -m trainkit.lint``,
    ``python -m trainkit.profiling.cli``).

    Example::

        return interruptible("trainkit lint", lambda: run(parser.parse_args(argv)))
    """
    try:
        return int(work())
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        die_by(signal.SIGINT)  # as Python's own Ctrl-C ends it, without the traceback
        return 130  # where a process cannot end by its own SIGINT


class Terminated(BaseException):
    """A SIGTERM (or a SIGHUP: the terminal closed), raised where the process is, as
    KeyboardInterrupt is a SIGINT: a BaseException, so that no ``except Exception`` of the work
    takes it for an error of its own. ``signum`` is the signal, ``name`` its name."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, a SIGTERM or a SIGHUP raises :class:`Terminated`, so that a command can
    say what it kept (the demo's run folder) before it ends by that signal
    (:func:`die_by`): by default the signal ends the process at once, saying nothing. A session
    begun inside the block flushes first and then calls this handler (trainkit._signals: the
    handler before it).
    Each only where it has its default action (one the caller set, or SIG_IGN: ``nohup``, or
    one set in C: ``faulthandler.register``, is theirs to keep), from the main thread of a POSIX
    process; elsewhere the block runs unchanged.

    Example::

        with sigterm_raises():
            try:
                train()
            except Terminated as stop:
                print(f"terminated ({stop.name}); the run is in runs/x", file=sys.stderr)
                die_by(stop.signum)
    """
    import threading

    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        yield
        return
    # A handler set in C (faulthandler.register) reads as the default: it is the caller's too
    sigs = [sig for sig in (signal.SIGTERM, signal.SIGHUP)
            if signal.getsignal(sig) is signal.SIG_DFL and not set_in_c(sig)]

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    for sig in sigs:
        signal.signal(sig, terminated)
    try:
        yield
    finally:
        for sig in sigs:
            signal.signal(sig, signal.SIG_DFL)


def die_by(signum: int) -> None:
    """End the process by the signal ``signum`` (exit status 128 + its number in a shell), as it
    would have ended without the handling that said it in a line: by SIGINT as Python ends on an
    uncaught KeyboardInterrupt (a shell loop stops on it, where a plain exit 130 reads as a
    command that handled the Ctrl-C itself), by SIGTERM or SIGHUP as without
    :func:`sigterm_raises` (a job scheduler or ``timeout`` reads the status it sent). Only from
    the main thread of a POSIX process; elsewhere it returns.

    Example::

        die_by(signal.SIGINT)
    """
    import threading

    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
