"""Small training loops that plant one cause of lost step time each, recorded by a session."""
from __future__ import annotations

import os
import shutil
import time
from typing import Any, Callable, Optional

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def train(logdir: str, *, steps: int = 12, profile: Any = None,
          model: Any = None, optimizer: Optional[Callable[[Any], Any]] = None,
          each_step: Optional[Callable[[], None]] = None, loader: Any = None,
          steps_done: int = 0) -> None:
    """A tiny regression loop under a session; the keyword hooks plant the causes."""
    import torch

    import trainkit as tk
    from trainkit.workloads.loop import train_steps

    torch.manual_seed(0)
    model = model or torch.nn.Linear(16, 1)
    opt = (optimizer or (lambda p: torch.optim.SGD(p, lr=0.01)))(model.parameters())
    if loader is None:
        loader = [(torch.randn(8, model.in_features), torch.randn(8, 1)) for _ in range(steps)]
    with tk.session(logdir=logdir, profile=profile, system_metrics=False, steps_done=steps_done):
        train_steps(model, opt, loader, loss_fn=torch.nn.functional.mse_loss, each_step=each_step)


class SleepyDataset:
    """A map-style dataset whose items take ``sleep_s`` to load: a data-loader-bound loop."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s
        #: how long each item really slept (a loaded machine oversleeps), by index
        self.slept: dict = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        self.slept[i] = time.perf_counter() - t0
        return torch.randn(16), torch.randn(1)


def fixture_run(tmp_path: Any, *names: str) -> str:
    """A run folder holding copies of the named trace fixtures."""
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(os.path.join(FIXTURES, name), run / name)
    return str(run)


@pytest.fixture
def logdir(tmp_path: Any) -> str:
    return str(tmp_path / "logs")
