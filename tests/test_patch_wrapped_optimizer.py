"""tk.patch on an optimizer that wraps another one and steps it only at some calls (accelerate's
AcceleratedOptimizer under gradient accumulation): the real steps are counted, not the calls."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp


class SyncingOptimizer(torch.optim.Optimizer):
    """What ``accelerator.prepare(optimizer)`` returns, reduced to what matters here: a torch
    Optimizer that shares its inner optimizer's ``param_groups`` and steps (and zeroes) it only
    on every ``every``-th call, the calls where accelerate's gradients sync."""

    def __init__(self, optimizer, every):
        self.optimizer = optimizer
        self.gradient_state = None  # accelerate's: a wrapper trainkit looks into (_wrapped.py)
        self.every = every
        self.calls = 0

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def step(self, closure=None):
        self.calls += 1
        if self.calls % self.every == 0:
            self.optimizer.step(closure)

    def zero_grad(self, set_to_none=None):
        if self.calls % self.every == 0:
            self.optimizer.zero_grad()


def _run(opt, model, batches, s):
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)


@pytest.mark.parametrize("every", [1, 4])
def test_a_wrapping_optimizer_patched_counts_its_inner_optimizers_real_steps(tmp_path, every):
    # Patched itself, the wrapper's every call was a step: under accumulation (every=4) 16 steps
    # of 8 items for 4 real ones of 32, and step_time_ms a micro-batch's time.
    model = mlp()
    wrapped = SyncingOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), every)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        assert tk.patch(wrapped) is wrapped
        _run(wrapped, model, tk.patch(loader(n=128, batch_size=8)), s)
    got = scalars(tmp_path)
    real = 16 // every
    assert [st for st, _ in got["trainkit/step_time_ms"]] == list(range(1, real + 1))
    assert [st for st, _ in got["trainkit/update_ms"]] == list(range(1, real + 1))
    for (st, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps * ms / 1e3 == pytest.approx(8 * every, rel=1e-4)
        if st > 1:  # a window's micro-batches, each sleeping 2 ms after its step() call
            assert ms >= 2 * every
    tk.unpatch(wrapped)
    assert "step" not in wrapped.optimizer.__dict__


def test_accelerate_prepared_optimizer_under_its_gradient_accumulation(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    model = mlp()
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, opt, dl = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 loader(n=80, batch_size=8))  # 10 batches: 4, 4 and the last 2
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for x, y in tk.patch(dl):
            with acc.accumulate(model):
                acc.backward(torch.nn.functional.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3]
    items = [sps * ms / 1e3 for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"],
                                                         got["trainkit/step_time_ms"])]
    assert items == pytest.approx([32, 32, 16], rel=1e-4)


@pytest.mark.parametrize("when", ["before", "after"])
def test_accelerate_optimizer_with_a_grad_scaler_keeps_the_patch(tmp_path, when):
    # With a GradScaler, accelerate keeps the inner step as it was when it wrapped it and puts it
    # back after each step: patched after the wrap, the first step undid the patch.
    accelerate = pytest.importorskip("accelerate")
    from accelerate.optimizer import AcceleratedOptimizer

    accelerate.Accelerator(cpu=True)
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    if when == "before":
        tk.patch(inner)
    opt = AcceleratedOptimizer(inner, scaler=torch.amp.GradScaler("cpu"))
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for x, y in tk.patch(loader(n=32)):
            opt.scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
            opt.step()
            opt.zero_grad()
            assert not opt.step_was_skipped
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2, 3, 4]
    tk.unpatch(opt)
    assert "_trainkit_patch" not in inner.__dict__
    assert opt._optimizer_original_step_method == inner.step


def test_a_held_zero_grad_says_it_takes_set_to_none(tmp_path):
    # accelerate's zero_grad(set_to_none=...) reads the inner zero_grad's signature: trainkit's
    # (*args, **kwargs) made it raise "`set_to_none` ... is not supported by this optimizer".
    import inspect

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped = SyncingOptimizer(opt, 1)
    with tk.accumulate(2, opt):
        assert "set_to_none" in inspect.signature(opt.zero_grad).parameters
        accelerate = pytest.importorskip("accelerate")
        from accelerate.optimizer import AcceleratedOptimizer

        accelerate.Accelerator(cpu=True)
        x, y = next(iter(loader()))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()  # the window's first micro-batch: no real step
        AcceleratedOptimizer(opt, device_placement=False).zero_grad(set_to_none=True)
        assert all(p.grad is not None for p in model.parameters())  # held inside the window
    assert wrapped.optimizer is opt
