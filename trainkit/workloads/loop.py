"""The reference instrumented loop: what a user's loop looks like with trainkit, as a function.

Benchmarks, the docs' screenshot and tests run the same loop, so a change to what a
"normal" trainkit loop does is made once.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional


def train_steps(model: Any, optimizer: Any, loader: Iterable[Any], *,
                loss_fn: Optional[Callable[[Any, Any], Any]] = None,
                each_step: Optional[Callable[[], None]] = None) -> List[float]:
    """One pass over ``loader`` with the regions forward/backward; returns each step's seconds.

    Runs inside the caller's session (``tk.session``), patching ``optimizer`` and ``loader``;
    ``each_step`` runs after ``zero_grad`` (tests plant a cause there). The returned wall times
    are the caller's own stopwatch per batch, independent of what trainkit records.

    Example::

        with tk.session(logdir="runs/x"):
            times = train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batches)
    """
    import time

    import torch

    import trainkit as tk

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    s = tk.active()
    tk.patch(optimizer)
    times = []
    t0 = time.perf_counter()
    for x, y in tk.patch(loader):
        with tk.profile_region("forward"):
            loss = loss_fn(model(x), y)
        with tk.profile_region("backward"):
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if each_step is not None:
            each_step()
        if s is not None:
            s.log("loss", loss)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times
