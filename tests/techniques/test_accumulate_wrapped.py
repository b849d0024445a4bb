"""tk.accumulate on an optimizer that wraps another one (accelerate's AcceleratedOptimizer from
``accelerator.prepare``): the gate sits on the inner optimizer, where ``tk.patch`` puts its patch,
and the wrapper's ``step()`` / ``zero_grad()`` reach it. Before, ``tk.accumulate(4, prepared)``
raised AttributeError ('NoneType' object has no attribute 'gate') after patching the inner one.
Accumulating twice (accelerate's ``gradient_accumulation_steps`` > 1 too) or through accelerate's
GradScaler is refused before anything changes."""
from __future__ import annotations

import copy
import types

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from trainkit.patch import optimizer_patch

from ._oracle import batches, big_batch_oracle, max_rel_err, model64

OPTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


class Prepared(torch.optim.Optimizer):
    """What ``accelerator.prepare(optimizer)`` returns, reduced to what matters here: it shares
    the inner optimizer's ``param_groups``, and its ``step`` / ``zero_grad`` reach the inner
    one's where accelerate's gradients sync (every call with gradient_accumulation_steps=1)."""

    def __init__(self, optimizer, num_steps=1, scaler=None):
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = types.SimpleNamespace(num_steps=num_steps, sync_gradients=True)

    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.optimizer.defaults)

    def state_dict(self):
        return self.optimizer.state_dict()

    def step(self, closure=None):
        if self.gradient_state.sync_gradients:
            self.optimizer.step(closure)

    def zero_grad(self, set_to_none=None):
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)


class Lookahead(torch.optim.Optimizer):
    """torch-optimizer's Lookahead, reduced: it wraps an optimizer (sharing its ``param_groups``,
    as accelerate's does), steps it at each of its own steps, and every ``k`` of its steps pulls
    its slow weights ``alpha`` of the way to the fast ones and sets the fast ones there."""

    def __init__(self, optimizer, k=2, alpha=0.5):
        self.optimizer, self.k, self.alpha = optimizer, k, alpha
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = {}
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self.counter = 0

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.counter += 1
        if self.counter % self.k == 0:
            for group in self.param_groups:
                for p in group["params"]:
                    slow = self.state.setdefault(p, {}).setdefault("slow", p.detach().clone())
                    slow += self.alpha * (p.detach() - slow)
                    p.data.copy_(slow)
        return loss

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


def _train(m, opt, data, n=4):
    held = []  # after each zero_grad(): whether the gradients are still there
    with tk.accumulate(n, opt) as acc:
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            held.append(all(p.grad is not None for p in m.parameters()))
    return acc, held


@pytest.mark.parametrize("name", sorted(OPTS))
def test_accumulate_through_a_wrapping_optimizer_equals_the_big_batch(name, tmp_path):
    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, OPTS[name], data, 4)
    m = copy.deepcopy(base)
    inner = OPTS[name](m.parameters())
    opt = Prepared(inner)
    with tk.session(logdir=tmp_path, system_metrics=False):
        acc, held = _train(m, opt, data)
    assert acc.steps == 3  # windows 4, 4, 2
    assert max_rel_err(m, oracle) < 1e-10
    # zero_grad() is held inside a window, done after its real step (and after the exit's step)
    assert held == [True, True, True, False] * 2 + [True, True]
    assert all(p.grad is None for p in m.parameters())
    assert optimizer_patch(inner).gate is None and "_trainkit_patch" not in opt.__dict__
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2, 3]


def test_accumulate_over_a_lookahead_equals_the_big_batch(tmp_path):
    # Gated on the optimizer inside, the Lookahead's own step ran at every micro-batch: its
    # counter ran 4x too fast, the slow weights pulled every 2 micro-batches, not every 2 steps.
    def make(ps):
        return Lookahead(torch.optim.SGD(ps, lr=0.1, momentum=0.9), k=2)

    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, make, data, 4)
    m = copy.deepcopy(base)
    opt = make(m.parameters())
    with tk.session(logdir=tmp_path, system_metrics=False):
        acc, _ = _train(m, opt, data)
    assert acc.steps == 3 and opt.counter == 3
    assert max_rel_err(m, oracle) < 1e-10
    assert optimizer_patch(opt) is not None and optimizer_patch(opt.optimizer) is None
    # its update_ms is the whole Lookahead step's, one a real step
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2, 3]


def test_accumulate_through_accelerates_prepared_optimizer_equals_the_big_batch(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, OPTS["adam"], data, 4)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=1)
    m = copy.deepcopy(base)
    m, opt = accelerator.prepare(m, OPTS["adam"](m.parameters()))
    assert type(opt).__name__ == "AcceleratedOptimizer"
    with tk.session(logdir=tmp_path, system_metrics=False):
        acc, held = _train(m, opt, data)
    assert acc.steps == 3
    assert max_rel_err(m, oracle) < 1e-10
    assert held == [True, True, True, False] * 2 + [True, True]
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2, 3]


def test_double_accumulation_and_accelerates_grad_scaler_are_refused_before_any_change():
    m = model64()
    inner = OPTS["sgd"](m.parameters())
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=4.*gradient_accumulation_steps=1"):
        with tk.accumulate(4, Prepared(inner, num_steps=4)):
            pass
    with pytest.raises(ValueError, match=r"GradScaler.*mixed_precision='bf16'"):
        with tk.accumulate(4, Prepared(inner, scaler=torch.amp.GradScaler("cpu"))):
            pass
    assert optimizer_patch(inner) is None and "step" not in inner.__dict__
    with tk.accumulate(4, Prepared(inner, scaler=torch.amp.GradScaler("cpu", enabled=False))):
        pass  # a disabled scaler is none


def test_accelerates_own_accumulation_with_tk_accumulate_is_refused():
    accelerate = pytest.importorskip("accelerate")
    m = model64()
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    m, opt = accelerator.prepare(m, OPTS["sgd"](m.parameters()))
    try:
        with pytest.raises(ValueError, match=r"accumulate\(4, AcceleratedOptimizer\): .*"
                                             r"gradient_accumulation_steps=4"):
            with tk.accumulate(4, opt):
                pass
        assert optimizer_patch(opt.optimizer) is None
    finally:
        accelerator.gradient_accumulation_steps = 1  # the state is accelerate's singleton


def test_amp_step_through_a_wrapping_optimizer_inside_accumulate():
    # Before, amp.step(prepared) saw no gate on the wrapper: it unscaled every micro-batch, and
    # its scaler.step reached the inner optimizer's gate mid-window, which refused it.
    base = model64()
    data = batches([8] * 10)
    oracle = big_batch_oracle(base, lambda ps: torch.optim.SGD(ps, lr=0.1), data, 4)
    m = copy.deepcopy(base).float()
    opt = Prepared(torch.optim.SGD(m.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    with tk.accumulate(4, opt) as acc:
        for x, y in data:
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x.float()), y.float())
            amp.backward(loss)
            assert amp.step(opt)
            opt.zero_grad()
    assert acc.steps == 3 and amp.skipped == 0
    assert max_rel_err(m.double(), oracle) < 2e-3
