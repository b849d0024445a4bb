"""The session's run folder: the default one, and checks made before anything is recorded."""
from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from . import _env


def run_start_time() -> datetime.datetime:
    """The time a default run folder is named after: now, or under torchrun the launcher's start.

    Under torchrun every rank must pick the same folder (its own rank<N> inside): the launcher's
    start time is one value for all the ranks of a machine, where each rank's own clock may cross
    a second between them.
    """
    when = datetime.datetime.now()
    if _env.rank() is not None:
        try:
            import psutil

            when = datetime.datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
        except Exception:  # no parent to ask (an orphan): the rank's own time
            pass
    return when


def default_logdir() -> str:
    """Where a session without ``logdir`` writes: ``runs/<time>_<host>``."""
    # The layout torch.utils.tensorboard.SummaryWriter uses, so runs sort by time.
    when = run_start_time()
    return os.path.join("runs", f"{when.strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}")


def check_logdir(logdir: Any) -> str:
    """``logdir`` as a path to a writable folder (made if missing), or a clear error."""
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"session(logdir={logdir!r}): logdir must be a path (str or os.PathLike), "
                        f"e.g. tk.session(logdir='runs/exp1')")
    path = os.fsdecode(os.fspath(logdir))
    if not path:
        raise ValueError("session(logdir=''): logdir must not be empty, e.g. tk.session(logdir='runs/exp1')")
    if "\0" in path:
        raise ValueError(f"session(logdir={path!r}): a path cannot hold a NUL character ('\\0'); "
                         f"pass a folder name without one, e.g. logdir='runs/exp1'")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"session(logdir={path!r}): {path!r} is a file, not a folder; "
                         f"pass a folder (created if missing), e.g. logdir={path + '_runs'!r}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"session(logdir={path!r}): cannot create the folder ({exc.strerror}); "
                         f"pass a folder you can write to, e.g. logdir='runs/exp1'") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"session(logdir={path!r}): the folder is not writable; "
                         f"pass a folder you can write to, e.g. logdir='runs/exp1'")
    return path
