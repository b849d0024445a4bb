"""Tiny models and loops shared by the tests."""
from __future__ import annotations

import collections.abc
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)


def loader(n: int = 64, batch_size: int = 8, seed: int = 1) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    ds = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))
    return DataLoader(ds, batch_size=batch_size, shuffle=False)


def train(model, opt, batches, *, log=None) -> None:
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if log is not None:
            log("loss", loss)


class SlowSGD(torch.optim.SGD):
    """SGD whose step takes at least 5 ms: an update time that stands out of a test's noise."""

    def step(self, closure=None):
        time.sleep(0.005)
        return super().step(closure)


def fail_on_runtime_warnings() -> None:
    """Inside ``warnings.catch_warnings()``: a RuntimeWarning (torch's recompile warning) fails.

    All but torch's notice that its guards are slower on Python 3.13.0 (a CPython bug fixed in
    3.13.1), given at the first compile: it says nothing about the code under test.
    """
    import warnings

    warnings.simplefilter("error", RuntimeWarning)
    warnings.filterwarnings("ignore", "Guards may run slower on Python 3.13.0", RuntimeWarning)


def step_function(opt):
    """The function of a patched optimizer's ``step``: past the counter trainkit wraps it in
    where torch's LR schedulers count ``optimizer._step_count`` through ``with_counter`` (torch
    < 2.4; trainkit/_optcalls.py ``scheduler_marked``), the patch's own (``FastStep`` with
    ``trainkit._speedups`` built)."""
    f = getattr(opt.step, "__func__", opt.step)
    code = getattr(f, "__code__", None)
    if code is not None and code.co_name == "counted" and code.co_filename.endswith("_optcalls.py"):
        return f.__wrapped__
    return f


def compiled(opt, form: str):
    """A compiled step of ``opt``, in one of trainkit's two forms: ``"patch"``
    (``tk.patch(opt, compile=True)``, its ``opt.step``) or ``"decorator"`` (a
    ``@tk.compiled_step`` function calling ``opt.step()``)."""
    import trainkit as tk

    if form == "patch":
        tk.patch(opt, compile=True)
        return opt.step

    @tk.compiled_step
    def step() -> None:
        opt.step()

    return step


def items_per_step(logdir, batches) -> dict:
    """``step -> items`` a patched loader counted over ``batches`` (each batch a step, no
    optimizer), read back from the run's samples/s and step time."""
    import trainkit as tk
    from tests.conftest import scalars

    with tk.session(logdir=logdir, system_metrics=False):
        for _ in tk.patch(batches):
            time.sleep(0.002)
    got = scalars(logdir)
    steps = dict(got["trainkit/step_time_ms"])
    return {st: round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]}


class DictStore(collections.abc.MutableMapping):
    """A mapping over a dict of its own (as a PyTorch Geometric graph's storage), which a shallow
    copy would share."""

    def __init__(self, data=None, **kw):
        self._store = dict(data or (), **kw)

    def __getitem__(self, k):
        return self._store[k]

    def __setitem__(self, k, v):
        self._store[k] = v

    def __delitem__(self, k):
        del self._store[k]

    def __iter__(self):
        return iter(self._store)

    def __len__(self):
        return len(self._store)
