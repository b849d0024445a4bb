"""``trainkit demo``: the main job on the built-in workload.

Trains the seed article's MNIST CNN on locally made MNIST-shaped data with a session,
``tk.patch(optimizer)``, ``tk.patch(loader)``, ``tk.to_device`` and regions, shows progress, and
says where the TensorBoard run is and how to open it.

Under torchrun (``torchrun --nproc_per_node 2 -m trainkit demo``) it trains data-parallel: one DDP
replica per rank, each on its share of the data, and each rank's session writes its own run,
``<logdir>/rank<N>``; rank 0 prints every rank's numbers.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shlex
import signal
import statistics
import sys
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import _env, _usage
from ._demo_runs import event_files, own, read_back, say_earlier_runs
from ._text import write_out

#: Bytes an image of the batch takes in one training step of the demo CNN on a CPU: activations
#: kept for the backward pass, their gradients and the batch (measured: ~330 KB), with room.
STEP_BYTES_PER_IMAGE = 400_000
#: Bytes an image of a validation batch takes (no gradients: measured ~200 KB), with room.
EVAL_BYTES_PER_IMAGE = 250_000
#: Validation ends at --max-seconds like training, but not before this many images (the default
#: val_size, well under a second): an accuracy over fewer would be noise.
VAL_AT_LEAST = 2048


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What the demo trains. Example:: DemoConfig(epochs=1, train_size=1280)"""

    logdir: Optional[str] = None
    epochs: int = 2
    train_size: int = 6400
    val_size: int = 2048
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    progress: bool = True
    #: stop training after this many seconds (the demo promises to finish in under a minute)
    max_seconds: float = 50.0

    def __post_init__(self) -> None:
        for name in ("epochs", "train_size", "val_size", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                # the example is the default: "--batch-size 2", any positive int, was a poor fix
                defaults = {f.name: f.default for f in dataclasses.fields(self)}
                fix = (f"DemoConfig(val_size={defaults[name]})" if name == "val_size" else
                       f"--{name.replace('_', '-')} {defaults[name]}")
                raise ValueError(f"{_said(name, value)}: must be a positive int, e.g. {fix}")
        if not self.max_seconds > 0:
            raise ValueError(f"{_said('max_seconds', self.max_seconds)}: must be > 0, "
                             f"e.g. --max-seconds 50")
        if not self.lr > 0:
            raise ValueError(f"demo lr={self.lr!r}: must be > 0, e.g. 1e-3")
        from .workloads.mnist import MAX_IMAGES

        if self.train_size + self.val_size > MAX_IMAGES:
            name, value, fix = (("val_size", self.val_size, "DemoConfig(val_size=2048)")
                                if self.val_size > self.train_size else
                                ("train_size", self.train_size, "--train-size 6400"))
            raise ValueError(f"{_said(name, value)}: at most 2**62 images, training and "
                             f"validation ones together, e.g. {fix}")


def _said(name: str, value: Any) -> str:
    """A setting as ``trainkit demo`` takes it (``--epochs 0``), or, where it is no option of the
    command's, as the config's field (``demo val_size=0``)."""
    if name in ("val_size", "lr"):
        return f"demo {name}={value!r}"
    text = repr(value)
    if isinstance(value, float) and text.endswith(".0"):
        text = text[:-2]  # --max-seconds -1 as typed, not as argparse's float (-1.0)
    return f"--{name.replace('_', '-')} {text}"


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What the demo measured; ``str()`` is the summary it prints."""

    logdir: str
    steps: int
    median_step_ms: float
    samples_per_s: float
    data_wait_share: float
    final_loss: float
    accuracy: float
    #: under torchrun: this process's rank, every rank's result (rank order) and the device
    rank: Optional[int] = None
    ranks: Tuple["DemoResult", ...] = ()
    device: str = ""
    #: the images the accuracy is over: fewer than ``val_size`` when --max-seconds ended it
    val_images: int = 0
    val_size: int = 0

    def __str__(self) -> str:
        plural = "" if self.steps == 1 else "s"
        return (f"{self.steps} optimizer step{plural}, median step {self.median_step_ms:.2f} ms, "
                f"{self.samples_per_s:,.0f} samples/s, data wait {100 * self.data_wait_share:.1f}% "
                f"of step time; final loss {self.final_loss:.3f}, validation accuracy "
                f"{100 * self.accuracy:.1f}%" + (
                    f" (the first {self.val_images:,} of {self.val_size:,} validation images: "
                    f"--max-seconds)" if 0 < self.val_images < self.val_size else ""))


def default_logdir() -> str:
    """``runs/demo-<date>-<time>``, made here (``-2``... for a demo started in the same second:
    see ``_logdir.fresh_folder``); under torchrun the launcher's start time, one folder for all
    the ranks of a machine (each rank's own clock may cross a second between them)."""
    from ._logdir import fresh_folder, run_start_time

    return fresh_folder(os.path.join("runs", "demo-" + run_start_time().strftime("%Y%m%d-%H%M%S")))


def check_memory(config: DemoConfig) -> None:
    """A ValueError naming --batch-size when one training step, or one validation batch, plainly
    cannot fit in memory.

    Called before anything is made or written; the data itself never is the problem (a big
    train_size or val_size is made a block at a time). Example::

        check_memory(DemoConfig(batch_size=64))
    """
    import torch

    world = int(_env.get(_env.WORLD_SIZE) or 1) if _env.rank() is not None else 1
    batch = min(config.batch_size, -(-config.train_size // world))
    val_batch = min(config.batch_size, config.val_size)  # each rank validates on all of them
    need = max(batch * STEP_BYTES_PER_IMAGE, val_batch * EVAL_BYTES_PER_IMAGE)
    if need < 2 ** 30:  # nothing to ask
        return
    if torch.cuda.is_available():
        index = int(_env.get(_env.LOCAL_RANK) or 0) if _env.rank() is not None else 0
        index = index if index < torch.cuda.device_count() else 0
        free, where = torch.cuda.get_device_properties(index).total_memory, f"of GPU {index}"
    else:
        import psutil

        free, where = psutil.virtual_memory().available, "free on this machine"
    if need <= free:
        return
    fits = 1
    while fits * 2 * STEP_BYTES_PER_IMAGE * 2 <= free:  # a power of two, half the memory
        fits *= 2
    what, images, each = ("one training step", batch, STEP_BYTES_PER_IMAGE)
    if val_batch * EVAL_BYTES_PER_IMAGE > batch * STEP_BYTES_PER_IMAGE:
        what, images, each = (f"one validation batch (val_size={config.val_size:,})", val_batch,
                              EVAL_BYTES_PER_IMAGE)
    raise ValueError(
        f"--batch-size {config.batch_size}: {what} of the demo CNN on {images:,} images needs "
        f"about {need / 1e9:,.1f} GB ({each // 1000} KB an image), more than the "
        f"{free / 1e9:,.1f} GB {where}; use a smaller batch, e.g. --batch-size {fits}")


def run(config: DemoConfig) -> DemoResult:
    """Train the built-in workload under a trainkit session and summarise what was recorded.

    Under torchrun every rank calls it (the CLI does): data-parallel training, one run per rank,
    and each rank's result has every rank's in ``ranks``.

    Example::

        print(run(DemoConfig(epochs=1)))
    """
    import torch
    from torch.utils.data import DataLoader

    import trainkit as tk

    from .workloads.demo_data import demo_data
    from .workloads.mnist import simple_cnn
    from .workloads.ranks import Ranks

    check_memory(config)
    torch.manual_seed(config.seed)
    ranks = Ranks.start() if _env.rank() is not None else None
    done = False
    try:
        device = ranks.device if ranks is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        rank, world = (ranks.rank, ranks.world) if ranks is not None else (0, 1)
        data = demo_data(config.train_size, config.val_size, config.batch_size, seed=config.seed,
                         rank=rank, world=world, distributed=ranks is not None)
        model = simple_cnn().to(device)
        net = model  # what is evaluated: the model itself, not its DDP wrapper
        if ranks is not None:
            model = ranks.wrap(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        criterion = torch.nn.CrossEntropyLoss()
        logdir = config.logdir or default_logdir()
        # The session writes <logdir>, or <logdir>/rank<N> under torchrun; the event files there
        # now are earlier runs', and the files new after the session that this process wrote
        # are this run's (another run may write into the same folder meanwhile).
        earlier = event_files(logdir if ranks is None else os.path.join(logdir, f"rank{rank}"))
        loss = None  # no step at all when max_seconds ends the run before the first one
        stopped = False
        with tk.session(logdir=logdir) as s, _progress(config, rank) as bar:
            tk.patch(optimizer)
            loader = tk.patch(DataLoader(data.train, pin_memory=device.type == "cuda",
                                          **data.batching))
            task = bar.add_task("training", total=config.epochs * len(loader))
            deadline = time.monotonic() + config.max_seconds

            def val_over(seen: int) -> bool:  # at the deadline, once VAL_AT_LEAST are seen
                if seen < min(VAL_AT_LEAST, config.val_size):  # the same on every rank
                    return False
                over = time.monotonic() > deadline
                return ranks.any(over) if ranks is not None else over

            for epoch in range(config.epochs):
                if data.sampler is not None:
                    data.sampler.set_epoch(epoch)
                model.train()
                for xb, yb in loader:
                    stopped = time.monotonic() > deadline
                    if ranks is not None:  # every rank stops at the same step
                        stopped = ranks.any(stopped)
                    if stopped:
                        break
                    with tk.profile_region("h2d"):
                        xb, yb = tk.to_device((xb, yb), device)
                    with tk.profile_region("forward"):
                        loss = criterion(model(xb), yb)
                    with tk.profile_region("backward"):
                        loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    s.log("loss", loss)
                    bar.advance(task)
                accuracy, val_images = _evaluate(net, data.val_batches(), device, val_over)
                s.log("val/accuracy", accuracy)
                stopped = stopped or val_images < config.val_size
                if not stopped and epoch + 1 < config.epochs:  # the deadline came in validation
                    stopped = time.monotonic() > deadline
                    if ranks is not None:
                        stopped = ranks.any(stopped)
                if stopped:  # the epochs left would each evaluate the same model again
                    break
        step_ms, waits, samples = read_back(s.logdir, own(event_files(s.logdir) - earlier))
        median = statistics.median(step_ms) if step_ms else float("nan")
        total = sum(step_ms)
        result = DemoResult(
            logdir=s.logdir, steps=len(step_ms), median_step_ms=median,
            # as TensorBoard shows it: the items a step really had (a short last batch, a
            # batch size above the data's), not --batch-size
            samples_per_s=statistics.median(samples) if samples else float("nan"),
            data_wait_share=(sum(waits) / total) if total else 0.0,
            final_loss=math.nan if loss is None else float(loss.detach()), accuracy=accuracy,
            val_images=val_images, val_size=config.val_size,
            device=str(device))
        if ranks is not None:
            result = ranks.gather(result, s.root)
        done = True
        return result
    finally:
        if ranks is not None:
            model = None  # the DDP wrapper: Ranks.close frees it before the group ends
            ranks.close(wait=done)


def _evaluate(model: Any, batches: Any, device: Any,
              over: Callable[[int], bool]) -> Tuple[float, int]:
    """The accuracy over the validation batches and the images it is over: ``over(images so
    far)`` ends it early (at --max-seconds, like training: a huge val_size is no longer run)."""
    import torch

    import trainkit as tk

    model.eval()
    correct = seen = 0
    with torch.no_grad(), tk.profile_region("validate"):
        for x, y in batches:
            if over(seen):
                break
            xb, yb = tk.to_device((x, y), device)
            correct += (model(xb).argmax(dim=1) == yb).sum()
            seen += len(y)
    return float(correct) / seen, seen  # one sync per epoch, outside the training step


def _progress(config: DemoConfig, rank: int = 0) -> Any:
    from ._demo_progress import progress

    # under torchrun, one bar: rank 0's
    return progress(config.progress and rank == 0, config.epochs)


def _to_open(logdir: str) -> str:
    """The folder the printed ``tensorboard --logdir`` opens: the default ``runs`` beside the
    run (every demo side by side), else the run itself: TensorBoard reads every folder under
    its logdir, again every few seconds, and the parent of ``--logdir /tmp/demo`` is all of
    /tmp (of ``--logdir ~/demo``, the home folder)."""
    parent = os.path.dirname(logdir)
    return parent if os.path.normpath(parent) == "runs" else logdir


def summary_lines(result: DemoResult) -> Dict[str, str]:
    if not result.ranks:  # paths quoted: they may hold spaces
        return {
            "result": str(result),
            "run": f"TensorBoard run: {result.logdir}",
            "open": f"Open it: tensorboard --logdir {shlex.quote(_to_open(result.logdir))} "
                    f"(then browse http://localhost:6006)",
        }
    runs = [r.logdir for r in result.ranks]
    parent = os.path.dirname(result.logdir) or "."  # the --logdir the ranks' runs are under
    return {
        "result": "\n".join([f"{len(runs)} ranks, data-parallel (DDP) on "
                             + ("a GPU each" if result.device.startswith("cuda") else "the CPU")
                             + ", each on its share of the data:"]
                            + [f"  rank {r.rank}: {r}" for r in result.ranks]),
        "run": "TensorBoard runs, one per rank: " + (
            ", ".join(runs) if len(runs) <= 4 else f"{runs[0]} ... {runs[-1]}"),
        "open": f"Open them: tensorboard --logdir {shlex.quote(parent)} "
                f"(then browse http://localhost:6006)",
    }


def _say_stopped(how: str, logdir: str) -> None:
    """One line on stderr (rank 0's, under torchrun): the run stopped, and where its steps are."""
    if (_env.rank() or 0) == 0:
        print(f"trainkit demo: {how}; the steps recorded so far are in {logdir} "
              f"(open it: tensorboard --logdir {shlex.quote(_to_open(logdir))})", file=sys.stderr)


def main(config: DemoConfig) -> int:
    """Run the demo and print its summary; 1 when no optimizer step finished in time.

    Under torchrun rank 0 prints every rank's summary and the other ranks print nothing.
    Ctrl-C says where the steps recorded so far are (the session has written them), then ends
    the process by SIGINT, as an uncaught KeyboardInterrupt does (a shell's loop stops on it),
    without the traceback. A SIGTERM (``timeout``, ``kill``, a job scheduler) or a SIGHUP (the
    terminal closed) says the same and ends it by that signal, as it would have ended silently.
    """
    config = dataclasses.replace(config, logdir=config.logdir or default_logdir())
    if (_env.rank() or 0) == 0:  # rank 0's own run folder stands for every rank's
        say_earlier_runs(config.logdir if _env.rank() is None else
                         os.path.join(config.logdir, "rank0"), config.logdir)
    try:
        with _usage.sigterm_raises():
            result = run(config)
    except KeyboardInterrupt:
        _say_stopped("interrupted", config.logdir)
        _usage.die_by(signal.SIGINT)
        return 130  # where a process cannot end by its own SIGINT
    except _usage.Terminated as stop:
        _say_stopped(f"terminated ({stop.name})", config.logdir)
        _usage.die_by(stop.signum)
        return 128 + stop.signum  # where a process cannot end by its own signal
    if result.rank not in (None, 0):
        return 1 if any(r.steps == 0 for r in result.ranks) else 0
    if result.steps == 0:
        print(f"trainkit demo: no optimizer step finished within --max-seconds "
              f"{config.max_seconds:g}, so there is no step time to report (the run is in "
              f"{result.logdir}); give it longer, e.g. --max-seconds 50", file=sys.stderr)
        return 1
    # `trainkit demo | head -1`: the reader may go away first; the run is done all the same
    write_out(sys.stdout, "".join(line + "\n" for line in summary_lines(result).values()))
    return 0
