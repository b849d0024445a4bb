"""tk.analyze on a run with tk.compiled_step: the steps that compiled hold seconds of compile time
in their update_ms and step_time_ms; they are no evidence of where a step's time goes."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_time_is_not_taken_for_an_optimizer_step_that_dominates(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = tk.compiled_step(torch.optim.Adam(model.parameters(), lr=0.01))
    # OneCycleLR moves Adam's betas: the second step compiles again (betas as tensors)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)
    batches = [torch.randn(8, 256) for _ in range(10)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x in tk.patch(batches):  # the first step is timed too
            model(x).square().mean().backward()
            time.sleep(0.03)  # the rest of the step: the update is a few % of it
            opt.step()
            opt.zero_grad()
            sched.step()
    findings = tk.analyze(tmp_path)
    assert "TA104" not in [f.code for f in findings], [str(f) for f in findings]
