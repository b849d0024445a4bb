"""``tk.compiled_step(optimizer)`` as ``tk.patch(optimizer, compile=True)``: compiled before the
patch changes anything, and asked again, its options checked.

Before the fix it patched first and compiled after: a torch that cannot compile (torch.compile's
own check, e.g. "not supported on Python 3.15+") raised with the optimizer patched but not
compiled. And asked again with another ``mode`` it returned the optimizer compiled with the old
one, saying nothing. No step is taken here: ``torch.compile`` compiles at the first call.
"""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.techniques._dynamo import fresh_dynamo  # noqa: F401 - a fresh dynamo per test
from trainkit.patch import optimizer_patch


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_a_torch_that_cannot_compile_leaves_the_optimizer_as_it_was(monkeypatch) -> None:
    def cannot(*args, **kwargs):  # what torch.compile raises where dynamo is not supported
        raise RuntimeError("torch.compile is not supported on Python 3.15+")

    monkeypatch.setattr(torch, "compile", cannot)
    opt = _opt()
    with pytest.raises(RuntimeError, match="not supported"):
        tk.compiled_step(opt)
    assert optimizer_patch(opt) is None and "step" not in opt.__dict__


def test_asking_again_with_the_same_options_returns_it_with_others_raises() -> None:
    opt = _opt()
    assert tk.compiled_step(opt) is opt
    compiled = optimizer_patch(opt).core.trainkit_compiled
    assert tk.compiled_step(opt, mode="default") is opt  # None is torch.compile's "default"
    assert tk.patch(opt, compile=True) is opt
    with pytest.raises(ValueError) as e:
        tk.compiled_step(opt, mode="max-autotune-no-cudagraphs")
    msg = str(e.value)
    assert "mode='max-autotune-no-cudagraphs'" in msg and "mode=None" in msg
    assert "tk.unpatch(optimizer); tk.compiled_step(optimizer, " \
           "mode='max-autotune-no-cudagraphs')" in msg
    with pytest.raises(ValueError, match="fullgraph=False"):
        tk.compiled_step(opt, fullgraph=True)
    assert optimizer_patch(opt).core.trainkit_compiled is compiled  # unchanged
    tk.unpatch(opt)
    tk.compiled_step(opt, mode="max-autotune-no-cudagraphs")  # the fix the message names
    assert optimizer_patch(opt).core.trainkit_compiled.mode == "max-autotune-no-cudagraphs"


class Wrapping(torch.optim.Optimizer):
    """accelerate's ``AcceleratedOptimizer`` as trainkit._wrapped recognises it (a
    ``gradient_state``, the inner optimizer's own ``param_groups``), stepping the optimizer it
    wraps at every ``every``-th call only, as under accelerate's gradient accumulation.

    Its calls are counted in a list, not an int attribute: torch 2.11's dynamo fails to compile
    ``self.calls += 1`` in the step of an ``Optimizer`` subclass ("Attempted setattr on a
    user-defined object that does not have an AttributeMutation mutation_type"; a plain
    ``torch.compile`` alike; 2.14's compiles it): a test of trainkit, not of that dynamo."""

    def __init__(self, optimizer: torch.optim.Optimizer, every: int) -> None:
        self.optimizer, self.gradient_state, self.every, self.counted = optimizer, None, every, [0]

    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.optimizer.defaults)
    calls = property(lambda self: self.counted[0])

    def step(self, closure=None):
        self.counted[0] += 1
        if self.counted[0] % self.every == 0:
            self.optimizer.step(closure)


def test_a_wrapped_optimizer_compiles_the_one_it_wraps_as_tk_patch_does(tmp_path) -> None:
    """Before the fix ``tk.compiled_step(wrapper)`` patched and compiled the wrapper, where
    ``tk.patch(wrapper)`` patches the optimizer inside: each of its calls counted as a step
    (each micro-batch), and a later ``tk.patch(wrapper)`` patched the inner one besides."""
    inner = _opt()
    wrapped = Wrapping(inner, every=2)
    assert tk.compiled_step(wrapped) is wrapped
    assert optimizer_patch(wrapped) is None and optimizer_patch(inner).compiled
    compiled = optimizer_patch(inner).core.trainkit_compiled
    assert tk.compiled_step(wrapped) is wrapped and tk.patch(wrapped, compile=True) is wrapped
    assert optimizer_patch(wrapped) is None
    assert optimizer_patch(inner).core.trainkit_compiled is compiled
    with pytest.raises(ValueError, match=r"compiled already, with mode=None"):
        tk.compiled_step(wrapped, mode="max-autotune-no-cudagraphs")
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(4):  # two micro-batches a step: two real steps
            inner.param_groups[0]["params"][0].grad = torch.ones(2)
            wrapped.step()
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2]
    # compiled indeed: the wrapper calls step(None), once taken for a closure and run eagerly
    assert sum(v for _, v in scalars(tmp_path)["trainkit/compile/seconds"]) > 0
    assert float(inner.param_groups[0]["params"][0][0].detach()) == pytest.approx(-0.2)
    tk.unpatch(wrapped)
    assert optimizer_patch(inner) is None and "step" not in inner.__dict__
