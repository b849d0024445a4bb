"""A patched optimizer's step shows its own signature: code that reads it acts as unpatched."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import trainkit as tk
from tests.helpers import loader, mlp
from trainkit import _optcalls


class _ScalerAwareSGD(torch.optim.SGD):
    """GradScaler's contract for an optimizer that handles scaling itself: its step takes
    ``grad_scaler`` (the scaler passes itself when the step's signature names it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        if grad_scaler is not None:
            grad_scaler.unscale_(self)
        return super().step(closure)


@pytest.mark.parametrize("use_c", [True, False], ids=["C", "Python"])
@pytest.mark.parametrize("scheduler", [None, "before", "after"])
def test_step_signature_is_the_optimizers_own(monkeypatch, scheduler, use_c):
    from trainkit import recorder

    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)

    def step_signature(patch_it):
        opt = _ScalerAwareSGD(mlp().parameters(), lr=0.1)
        if scheduler == "before":
            torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        if patch_it:
            tk.patch(opt)
        if scheduler == "after":
            torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        return inspect.signature(opt.step)

    want = step_signature(False)
    assert "grad_scaler" in want.parameters
    if scheduler == "after" and _optcalls._schedulers_count_steps():
        # torch < 2.4's scheduler sets its with_counter wrapper, a plain function, on the
        # instance: its signature names the optimizer's `self` too, a parameter no call passes
        first, *rest = want.parameters.values()
        assert first.name == "self"
        want = want.replace(parameters=rest)
    assert step_signature(True) == want


def test_grad_scaler_passes_itself_to_a_patched_step_that_takes_it(tmp_path):
    # Before: the patched step's (*args, **kwargs) hid `grad_scaler`, so GradScaler set
    # `grad_scale`/`found_inf` on the optimizer instead, and SGD's step failed on them.
    def run(patch_it):
        torch.set_default_dtype(torch.float64)
        try:
            model = mlp(dtype=torch.float64)
            opt = _ScalerAwareSGD(model.parameters(), lr=0.1, momentum=0.9)
        finally:
            torch.set_default_dtype(torch.float32)
        if patch_it:
            tk.patch(opt)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "GradScaler is going to stop passing"
            for x, y in loader(n=32):
                loss = torch.nn.functional.cross_entropy(model(x.double()), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], opt

    with tk.session(logdir=tmp_path, system_metrics=False):
        got, opt = run(True)
    want, _ = run(False)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    tk.unpatch(opt)
