"""The session's run folder: the default one, and checks made before anything is recorded."""
from __future__ import annotations

import datetime
import os
import shlex
import socket
import sys
from typing import Any, Optional, Tuple

from . import _env


def process_rank() -> Optional[int]:
    """This process's global rank: torchrun's ``RANK``, else that of an initialized process group
    of more than one process (``torch.multiprocessing.spawn``, as in PyTorch's DDP tutorial, sets
    no ``RANK``: its ranks wrote into one folder, their steps mixed in one TensorBoard run)."""
    rank = _env.rank()
    if rank is not None:
        return rank
    dist = sys.modules.get("torch.distributed")  # not imported: no process group either
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:  # a group torn down meanwhile, or a backend that cannot say
        pass
    return None


def ranks_mixed(root: str) -> Optional[str]:
    """What to say where a process group of several ranks began after a session that writes into
    ``root`` (every rank writes there: ``mp.spawn`` sets no RANK to tell them by), or None."""
    rank = process_rank()
    if rank is None:
        return None
    return (f"trainkit: tk.session began before torch.distributed.init_process_group, and no RANK "
            f"was set (torch.multiprocessing.spawn sets none), so this rank ({rank}) and the "
            f"others write into one folder, {root!r}, their steps mixed in one TensorBoard run; "
            f"open tk.session after init_process_group (each rank then writes <logdir>/rank<N>), "
            f"or launch with torchrun")


def warn_ranks_mixed(root: str) -> None:
    """Say :func:`ranks_mixed`, from the writer thread (at its first wake after a step): shown,
    never raised, where warnings are errors (raised there, the writer's check ate it unsaid)."""
    from ._text import say

    said = ranks_mixed(root)
    if said is not None:
        say(said, RuntimeWarning)


def run_start_time() -> datetime.datetime:
    """The time a default run folder is named after: now, or under torchrun the launcher's start.

    Under torchrun (or ``mp.spawn``) every rank must pick the same folder (its own rank<N>
    inside): the launcher's start time is one value for all the ranks of a machine, where each
    rank's own clock may cross a second between them.
    """
    when = datetime.datetime.now()
    if process_rank() is not None:
        try:
            import psutil

            when = datetime.datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
        except Exception:  # no parent to ask (an orphan): the rank's own time
            pass
    return when


def default_logdir() -> str:
    """Where a session without ``logdir`` writes: ``runs/<time>_<host>`` (made here, see
    :func:`fresh_folder`), ``runs/<time>_<host>-restart<K>`` in torchrun's K-th restart."""
    # The layout torch.utils.tensorboard.SummaryWriter uses, so runs sort by time.
    when = run_start_time()
    name = f"{when.strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}"
    restart = _restart_count()
    if restart:
        # A restarted attempt has the same launcher start as the failed one, whose ranks may
        # not all have claimed their folder (one failed before its session): claiming by rank,
        # the new attempt's ranks split over that folder and the next. A folder of its own,
        # named after the restart, keeps each attempt's ranks together.
        name += f"-restart{restart}"
    return fresh_folder(os.path.join("runs", name))


def _restart_count() -> int:
    """torchrun's ``TORCHELASTIC_RESTART_COUNT`` in a rank (0 in the first attempt, and outside
    torchrun)."""
    if _env.rank() is None:
        return 0
    try:
        return max(int(_env.get(_env.RESTART_COUNT) or 0), 0)
    except ValueError:
        return 0


def fresh_folder(path: str) -> str:
    """A default run folder of its own: ``path``, else ``path-2``, ``path-3``..., the first that
    did not exist, made here (``mkdir`` is atomic: two runs started in the same second, which
    shared one folder and showed as one run, get one each).

    Under torchrun (or ``mp.spawn``) the ranks of a machine share the folder, each writing its
    ``rank<N>`` inside, and a rank cannot tell another rank's folder from an earlier run's: each
    rank claims ``path/rank<N>`` (made here), or where a session of its rank wrote into that
    already, ``path-2/rank<N>``, and so on. A second phase (fine-tuning after pre-training: a
    second session in the process, or a second ``mp.spawn`` of fresh processes, whose launcher
    started at the same time) takes the next folder, as every rank does: ranks that open the
    same sessions pick the same folders (both phases shared one, the second's steps from 1
    hiding the first's as a rerun does). Where the folder cannot be made, ``path``:
    :func:`check_logdir` then says why.
    """
    rank = process_rank()
    try:
        if rank is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for i in range(1, 10_000):
            candidate = path if i == 1 else f"{path}-{i}"
            try:
                if rank is None:
                    os.mkdir(candidate)
                else:
                    os.makedirs(os.path.join(candidate, f"rank{rank}"))
                return candidate
            except FileExistsError:
                continue
    except OSError:
        pass
    return path


def check_logdir(logdir: Any, *, option: Optional[str] = None) -> str:
    """``logdir`` as a path to a writable folder (made if missing; ``~`` expanded), or a clear
    error: in the words of ``tk.session(logdir=...)``, or of a command's ``option``
    (``--logdir DIR``) where that is how the user gave it."""
    def said(p: str) -> str:  # how a folder is given: the keyword, or the option
        return f"{option} {shlex.quote(p)}" if option else f"logdir={p!r}"

    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"session(logdir={logdir!r}): logdir must be a path (str or os.PathLike), "
                        f"e.g. tk.session(logdir='runs/exp1')")
    # "~/runs" as a shell would read it: os.makedirs would make a folder named "~" here (which a
    # later `rm -rf ~` to clean it up would turn into a disaster).
    path = os.path.expanduser(os.fsdecode(os.fspath(logdir)))
    lead = said(path) if option else f"session({said(path)})"
    if not path:
        example = said("runs/exp1") if option else "tk.session(logdir='runs/exp1')"
        raise ValueError(f"{lead}: logdir must not be empty, e.g. {example}")
    if path.startswith("~"):  # expanduser left it: no such user (or no home folder known)
        head, _, rest = path.partition("/")
        whose = f"no user {head[1:]!r}" if len(head) > 1 else "no home folder (HOME is unset)"
        full = os.path.join("/home", head[1:] or "me", rest) if rest else f"/home/{head[1:]}"
        raise ValueError(f"{lead}: there is {whose} for {head!r} to stand for, and a folder named "
                         f"{head!r} would be made here; give the folder in full, e.g. "
                         f"{said(full)}, or {said('./' + path)} for a folder of that name here")
    if "\0" in path:
        raise ValueError(f"{lead}: a path cannot hold a NUL character ('\\0'); "
                         f"pass a folder name without one, e.g. {said('runs/exp1')}")
    everything = _everything(path, "exp1")
    if everything is not None:  # tk.session(logdir="~"): what --logdir ~ is refused for
        raise ValueError(f"{lead}: is {everything[0]}, {_WHY}, e.g. {said(everything[1])}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{lead}: {path!r} is a file, not a folder; "
                         f"pass a folder (created if missing), e.g. {said(path + '_runs')}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{lead}: cannot create the folder ({exc.strerror}); "
                         f"pass a folder you can write to, e.g. {said('runs/exp1')}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{lead}: the folder is not writable; "
                         f"pass a folder you can write to, e.g. {said('runs/exp1')}")
    return path


def check_not_everything(logdir: str, *, option: str) -> None:
    """A ValueError where a command's run folder is the filesystem root or the home folder
    itself (``--logdir /``, ``--logdir ~``, ``--logdir .`` there): the event file would land
    straight in it, and the ``tensorboard --logdir`` printed to open it reads every folder
    under it, again every few seconds. Checked before anything is made or written.

    Example::

        check_not_everything("runs/demo", option="--logdir")  # fine: a folder of its own
    """
    said = _everything(logdir, "demo")
    if said is not None:
        what, fix = said
        raise ValueError(f"{option} {shlex.quote(logdir)}: is {what}, {_WHY}, e.g. {option} {fix}")


_WHY = ("so the run would be written straight into it and TensorBoard, opened there, would read "
        "every folder under it; give the run a folder of its own")


def _everything(logdir: str, run: str) -> Optional[Tuple[str, str]]:
    """(what ``logdir`` is, a folder to give instead, ``runs/<run>``) where it is the root or
    the home folder."""
    path = os.path.realpath(os.path.expanduser(logdir))
    home = os.path.realpath(os.path.expanduser("~"))
    if path == os.path.realpath(os.sep):
        return "the filesystem root", f"runs/{run}"
    if path == home:
        return f"your home folder ({home})", os.path.join("~", "runs", run)
    return None
