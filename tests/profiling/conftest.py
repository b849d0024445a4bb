"""Small training loops that plant one cause of lost step time each, recorded by a session."""
from __future__ import annotations

import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional

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


def dominated_run(logdir: str, make: Callable[[Any], Any], *, device: str = "cpu",
                   override: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """10 steps of a small layer beside 4M parameters whose gradient is kept across steps (only
    the layer's is zeroed): the backward writes no 4M values each step, so the update dominates
    the step even fused (~0.8 of it on a 2-core CPU; with the gradient made again each step a
    fused update held ~0.35, too near TA104's 0.3). Returns the optimizer's recorded entry."""
    import json

    import torch

    import trainkit as tk
    from trainkit import switches
    from trainkit._optinfo import META_OPTIMIZERS
    from trainkit.profiling.runs import load_run

    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 1).to(device)
    big = torch.nn.Parameter(torch.zeros(2000, 2000, device=device))
    big.grad = torch.randn_like(big)
    opt = make([*lin.parameters(), big])
    with switches.overrides(override or {}):
        tk.patch(opt)
    batches = [(torch.randn(8, 16, device=device), torch.randn(8, 1, device=device))
               for _ in range(10)]
    try:
        with tk.session(logdir=logdir, system_metrics=False):
            for x, y in batches:
                torch.nn.functional.mse_loss(lin(x), y).backward()
                opt.step()
                lin.zero_grad()
    finally:
        tk.unpatch(opt)
    (entry,) = json.loads(load_run(logdir, logdir).meta[META_OPTIMIZERS])
    return entry


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


def gan_run(logdir: str, *, critic_dtype: Any = None, fused: Optional[bool] = None) -> List[Any]:
    """A GAN's two optimizers, a generator's Adam and a critic's SGD with momentum, both patched,
    10 steps where their updates dominate (4M kept gradients, as :func:`dominated_run`);
    ``critic_dtype`` the critic's parameters' dtype, ``fused`` both optimizers'. Returns the
    optimizers' entries recorded in ``trainkit/meta/optimizers``."""
    import json

    import torch

    import trainkit as tk
    from trainkit._optinfo import META_OPTIMIZERS
    from trainkit.profiling.runs import load_run

    torch.manual_seed(0)
    g = torch.nn.Parameter(torch.zeros(2000, 1000))
    d = torch.nn.Parameter(torch.zeros(2000, 1000, dtype=critic_dtype))
    g.grad, d.grad = torch.randn_like(g), torch.randn_like(d)  # kept: the updates dominate
    lin = torch.nn.Linear(16, 1)
    opts = [torch.optim.Adam([g, *lin.parameters()], lr=1e-3, fused=fused),
            torch.optim.SGD([d], lr=1e-3, momentum=0.9, fused=fused)]
    for opt in opts:
        tk.patch(opt)
    try:
        with tk.session(logdir=logdir, system_metrics=False):
            for _ in range(10):
                torch.nn.functional.mse_loss(lin(torch.randn(8, 16)), torch.randn(8, 1)).backward()
                for opt in opts:
                    opt.step()
                lin.zero_grad()
    finally:
        for opt in opts:
            tk.unpatch(opt)
    return json.loads(load_run(logdir, logdir).meta[META_OPTIMIZERS])


def next_second() -> None:
    """Event files are named by the second they start in (then host, pid and a per-process
    count, compared as text): two sessions of one process in one second may sort either way."""
    time.sleep(1.01 - time.time() % 1)


def event_files(folder: Any) -> List[str]:
    """The event files' names in ``folder``, in TensorBoard's order (by name)."""
    return sorted(f for f in os.listdir(folder) if "tfevents" in f)


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
