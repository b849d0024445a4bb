"""tk.compiled_step with an lr given as an int (``SGD(..., lr=1)``): the schedulers' first float
for it (StepLR's ``1 * gamma``) must not recompile the step after warm-up."""
from __future__ import annotations

import warnings
from typing import Any, List

import pytest
import torch

import trainkit as tk
from tests.helpers import fail_on_runtime_warnings


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train(compiled: bool) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1, momentum=0.9)
    if compiled:
        tk.compiled_step(opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    lrs: List[Any] = []
    for _ in range(6):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return [p.detach().clone() for p in model.parameters()], lrs, opt


def test_an_int_lr_moved_by_a_scheduler_causes_no_recompile() -> None:
    ref, ref_lrs, _ = _train(False)
    with warnings.catch_warnings():
        fail_on_runtime_warnings()
        got, lrs, opt = _train(True)
    assert lrs == ref_lrs and [type(v) for v in lrs[:2]] == [int, int]  # as the user gave it
    assert type(lrs[-1]) is float
    assert opt.__dict__["_trainkit_patch"].core.trainkit_compiled.recompiles == 0
    for a, b in zip(got, ref):
        assert ((a - b).norm() / b.norm()).item() < 1e-5
