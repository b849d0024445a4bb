"""LR schedulers made before or after ``tk.patch``: the same learning rates, parameters and
warnings as on an unpatched twin, whichever order the loop calls the scheduler in."""
from __future__ import annotations

import warnings

import pytest
import torch

import trainkit as tk
from tests.helpers import loader, mlp

S = torch.optim.lr_scheduler

SCHEDULERS = {
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, patience=0),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.5, total_iters=2), S.ExponentialLR(o, 0.9)], milestones=[2]),
    "ChainedScheduler": lambda o: S.ChainedScheduler(
        [S.ConstantLR(o, 0.5, total_iters=2), S.ExponentialLR(o, 0.9)]),
    "LambdaLR": lambda o: S.LambdaLR(o, lambda e: 0.9 ** e),
    "SWALR": lambda o: torch.optim.swa_utils.SWALR(o, swa_lr=0.05, anneal_epochs=3),
}


def _run(make, patch_when, scheduler_first):
    torch.set_default_dtype(torch.float64)
    try:
        model = mlp(dtype=torch.float64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    finally:
        torch.set_default_dtype(torch.float32)
    if patch_when == "before":
        tk.patch(opt)
    sched = make(opt)
    if patch_when == "after":
        tk.patch(opt)

    def sched_step(loss):
        sched.step(loss.item()) if isinstance(sched, S.ReduceLROnPlateau) else sched.step()

    lrs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.tensor(1.0)
        for x, y in loader(n=48):
            if scheduler_first:  # the mistake torch warns about: the warning must stay
                sched_step(loss)
            loss = torch.nn.functional.cross_entropy(model(x.double()), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if not scheduler_first:
                sched_step(loss)
            lrs.append(opt.param_groups[0]["lr"])
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    params = [p.detach().clone() for p in model.parameters()]
    tk.unpatch(opt)
    return lrs, params, said


@pytest.mark.parametrize("scheduler_first", [False, True], ids=["in-order", "scheduler-first"])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_schedulers_and_their_warnings_as_unpatched(tmp_path, name, when, scheduler_first):
    with tk.session(logdir=tmp_path, system_metrics=False):
        lrs, params, said = _run(SCHEDULERS[name], when, scheduler_first)
    ref_lrs, ref_params, ref_said = _run(SCHEDULERS[name], None, scheduler_first)
    assert lrs == ref_lrs
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert said == ref_said
    if scheduler_first and name != "ReduceLROnPlateau":
        assert any("before `optimizer.step()`" in w for w in said), said
