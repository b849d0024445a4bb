"""tk.analyze on a run with tk.compiled_step: the steps that compiled hold seconds of compile time
in their update_ms and step_time_ms; they are no evidence of where a step's time goes."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from trainkit.profiling.analyzers.records import Steps
from trainkit.profiling.runs import load_run
from trainkit.recorder import COMPILE_SECONDS, STEP_TIME
from trainkit.sinks.tbplugin.data import TabData
from trainkit.techniques import _hyper

#: OneCycleLR moves Adam's betas, which a compiled step holds as tensors: CPU needs torch >= 2.5.
pytestmark = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split(".")[:2]) < _hyper.TENSOR_BETAS_ON_CPU,
    reason="a compiled CPU Adam step with moving betas needs torch >= 2.5 (refused below)")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # One thread: inductor's CPU kernels use as many OpenMP threads as torch has when compiled,
    # and beside another busy process (a second pytest) their barriers wait on descheduled
    # threads: a ~1 ms update took 25-40 ms, and TA104 was right to fire.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def _train(logdir) -> None:
    """10 steps of ~30 ms, of which tk.compiled_step's warm-up and OneCycleLR's switch of betas
    to tensors (the second step) compile: seconds of torch.compile in their update and step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = tk.compiled_step(torch.optim.Adam(model.parameters(), lr=0.01))
    # OneCycleLR moves Adam's betas: the second step compiles again (betas as tensors)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)
    batches = [torch.randn(8, 256) for _ in range(10)]
    with tk.session(logdir=logdir, system_metrics=False):
        for x in tk.patch(batches):  # the first step is timed too
            model(x).square().mean().backward()
            time.sleep(0.03)  # the rest of the step: the update is a few % of it
            opt.step()
            opt.zero_grad()
            sched.step()


def test_compile_time_is_not_taken_for_an_optimizer_step_that_dominates(tmp_path):
    _train(tmp_path)
    findings = tk.analyze(tmp_path)
    assert "TA104" not in [f.code for f in findings], [str(f) for f in findings]


def test_the_tab_breakdown_leaves_out_the_steps_the_findings_leave_out(tmp_path):
    # The tab (and trainkit analyze --json) shows the breakdown and step count beside the
    # findings: a mean step holding seconds of compile would contradict "no TA104" next to it.
    _train(tmp_path)
    run = load_run(str(tmp_path), str(tmp_path))
    compiled = run.values(COMPILE_SECONDS)
    assert compiled, "no step compiled: the test checks nothing"
    st = Steps(run)  # the findings' steps
    assert not set(st.steps) & set(compiled)
    rep = TabData(str(tmp_path)).report(".")
    assert rep["steps"] == len(st)
    b = rep["breakdown"]
    assert b["step"] == pytest.approx(st.total_ms / len(st))
    # and in numbers, independent of Steps: no compiling step's time is in the mean
    slowest = max(run.values(STEP_TIME)[s] for s in compiled)
    assert b["step"] < slowest, (b, slowest)
    assert b["optimizer"] < 0.3 * b["step"], b  # what TA104's absence says, the bar says too
    assert "TA104" not in [f["code"] for f in rep["findings"]]
