"""``trainkit demo``: the main job on the built-in workload.

Trains the seed article's MNIST CNN on locally made MNIST-shaped data with a session,
``tk.patch(optimizer)``, ``tk.patch(loader)``, ``tk.to_device`` and regions, shows progress, and
says where the TensorBoard run is and how to open it.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import os
import shlex
import statistics
import sys
import time
from typing import Any, Dict, List, Optional


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
                raise ValueError(f"demo {name}={value!r}: must be a positive int, e.g. --{name.replace('_', '-')} 2")
        if not self.max_seconds > 0:
            raise ValueError(f"demo max_seconds={self.max_seconds!r}: must be > 0, e.g. --max-seconds 50")
        if not self.lr > 0:
            raise ValueError(f"demo lr={self.lr!r}: must be > 0, e.g. 1e-3")


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

    def __str__(self) -> str:
        plural = "" if self.steps == 1 else "s"
        return (f"{self.steps} optimizer step{plural}, median step {self.median_step_ms:.2f} ms, "
                f"{self.samples_per_s:,.0f} samples/s, data wait {100 * self.data_wait_share:.1f}% "
                f"of step time; final loss {self.final_loss:.3f}, validation accuracy "
                f"{100 * self.accuracy:.1f}%")


def default_logdir() -> str:
    return os.path.join("runs", "demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def run(config: DemoConfig) -> DemoResult:
    """Train the built-in workload under a trainkit session and summarise what was recorded.

    Example::

        print(run(DemoConfig(epochs=1)))
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import trainkit as tk

    from .workloads.mnist import simple_cnn, synthetic_mnist

    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = synthetic_mnist(config.train_size + config.val_size, seed=config.seed)
    train = TensorDataset(x[:config.train_size], y[:config.train_size])
    val_x, val_y = x[config.train_size:], y[config.train_size:]
    model = simple_cnn().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    criterion = torch.nn.CrossEntropyLoss()
    logdir = config.logdir or default_logdir()
    loss = None  # no step at all when max_seconds ends the run before the first one
    theirs = _event_files(logdir)  # a rerun into the same folder: earlier sessions' files
    with tk.session(logdir=logdir) as s, _progress(config) as bar:
        tk.patch(optimizer)
        loader = tk.patch(DataLoader(train, batch_size=config.batch_size, shuffle=True,
                                     pin_memory=device.type == "cuda"))
        task = bar.add_task("training", total=config.epochs * len(loader))
        deadline = time.monotonic() + config.max_seconds
        for _epoch in range(config.epochs):
            model.train()
            for xb, yb in loader:
                if time.monotonic() > deadline:
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
            accuracy = _evaluate(model, val_x, val_y, device, config.batch_size)
            s.log("val/accuracy", accuracy)
    step_ms, waits = _read_back(s.logdir, sorted(_event_files(s.logdir) - theirs))
    median = statistics.median(step_ms) if step_ms else float("nan")
    total = sum(step_ms)
    return DemoResult(
        logdir=s.logdir, steps=len(step_ms), median_step_ms=median,
        samples_per_s=config.batch_size / (median / 1e3) if step_ms else float("nan"),
        data_wait_share=(sum(waits) / total) if total else 0.0,
        final_loss=math.nan if loss is None else float(loss.detach()), accuracy=accuracy)


def _evaluate(model: Any, x: Any, y: Any, device: Any, batch_size: int) -> float:
    import torch

    import trainkit as tk

    model.eval()
    correct = 0
    with torch.no_grad(), tk.profile_region("validate"):
        for i in range(0, len(x), batch_size):
            xb, yb = tk.to_device((x[i:i + batch_size], y[i:i + batch_size]), device)
            correct += (model(xb).argmax(dim=1) == yb).sum()
    return float(correct) / len(x)  # one sync per epoch, outside the training step


def _event_files(logdir: str) -> "set[str]":
    try:
        return {f for f in os.listdir(logdir) if "tfevents" in f}
    except OSError:
        return set()


def _read_back(logdir: str, names: List[str]) -> "tuple[List[float], List[float]]":
    """Step times and data waits as TensorBoard will show them: this session's event file, read
    back (a folder used before also holds the earlier sessions', whose steps are not this run's)."""
    from .profiling.runs import read_scalars

    got = read_scalars(logdir, names)

    def values(tag: str) -> List[float]:
        return [v for _, v in got.get(tag, [])]

    return values("trainkit/step_time_ms"), values("trainkit/data_wait_ms")


class _NoBar:
    def add_task(self, *a: Any, **k: Any) -> int:
        return 0

    def advance(self, *a: Any, **k: Any) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _progress(config: DemoConfig) -> Any:
    if not config.progress:
        return _NoBar()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=False)


def summary_lines(result: DemoResult) -> Dict[str, str]:
    parent = os.path.dirname(result.logdir) or "."  # quoted: a path may hold spaces
    return {
        "result": str(result),
        "run": f"TensorBoard run: {result.logdir}",
        "open": f"Open it: tensorboard --logdir {shlex.quote(parent)} "
                f"(then browse http://localhost:6006)",
    }


def main(config: DemoConfig) -> int:
    """Run the demo and print its summary; 1 when no optimizer step finished in time."""
    result = run(config)
    if result.steps == 0:
        print(f"trainkit demo: no optimizer step finished within --max-seconds "
              f"{config.max_seconds:g}, so there is no step time to report (the run is in "
              f"{result.logdir}); give it longer, e.g. --max-seconds 50", file=sys.stderr)
        return 1
    for line in summary_lines(result).values():
        print(line, file=sys.stdout)
    return 0
