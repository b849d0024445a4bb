"""tk.compiled_step and a checkpoint loaded mid-run: ``optimizer.load_state_dict`` makes new state
tensors, which the compiled step's guards (on the tensors' identity) took for a change: a recompile
and a warning telling the user to keep a value constant that they had no hand in."""
from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import trainkit as tk
from tests.helpers import fail_on_runtime_warnings
from tests.conftest import scalars
from ._dynamo import fresh_dynamo, moving_betas  # noqa: F401 (an autouse fixture)


def _train(compiled: bool, logdir):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=8)
    if compiled:
        tk.compiled_step(opt)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    with tk.session(logdir=logdir, system_metrics=False):
        for i in range(8):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            if i == 3:  # a checkpoint written and read back mid-run (a resume)
                buf = io.BytesIO()
                torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
                buf.seek(0)
                ckpt = torch.load(buf)
                opt.load_state_dict(ckpt["opt"])
                sched.load_state_dict(ckpt["sched"])
    return model, opt


@moving_betas
def test_loading_a_checkpoint_mid_run_causes_no_recompile(tmp_path):
    eager, _ = _train(False, tmp_path / "eager")
    with warnings.catch_warnings():
        fail_on_runtime_warnings()
        model, opt = _train(True, tmp_path / "compiled")
    got = scalars(tmp_path / "compiled")
    assert [v for _, v in got["trainkit/compile/recompiles"]][-1] == 0
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the loaded values are in force, and the state is the optimizer's own (no alias of the dict)
    assert all(int(st["step"]) == 8 for st in opt.state.values())


def test_unpatch_gives_load_state_dict_back_to_torch():
    """The hooks that keep state tensors in place live while a compiled step uses the optimizer:
    after ``tk.unpatch`` (the last user gone) ``load_state_dict`` replaces them as torch's own."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hooks = (opt._optimizer_load_state_dict_pre_hooks, opt._optimizer_load_state_dict_post_hooks)
    tk.patch(opt, compile=True)
    tk.patch(opt, compile=True)  # idempotent: one user still
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert all(len(h) == 1 for h in hooks)
    p = next(model.parameters())
    kept = opt.state[p]["exp_avg"]
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # a checkpoint's own tensors
    assert opt.state[p]["exp_avg"] is kept  # copied into, while compiled

    tk.unpatch(opt)
    assert all(len(h) == 0 for h in hooks) and "_trainkit_keeps_state" not in vars(opt)
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert opt.state[p]["exp_avg"] is not kept  # torch's own behaviour again
    tk.unpatch(opt)  # twice: nothing left to undo


def test_moving_betas_on_a_torch_too_old_for_them_are_refused_clearly(monkeypatch):
    """torch 2.3's and 2.4's CPU Adam step, compiled, failed where OneCycleLR first moved the betas
    (an AssertionError about capturable, or "expected dtype float for `weight`"): now a
    RuntimeError names the torch it needs and the ways out, the param_groups left as they were."""
    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=8)
    tk.compiled_step(opt)
    with pytest.raises(RuntimeError, match=r"\(2\.4\.1\+cpu\).*torch >= 2\.5.*cycle_momentum=False"):
        for _ in range(2):
            model(torch.randn(3, 8)).sum().backward()
            opt.step()
            sched.step()
    group = opt.param_groups[0]
    assert isinstance(group["lr"], float) and all(isinstance(b, float) for b in group["betas"])


def test_an_older_torchs_scheduler_counter_stays_out_of_the_compiled_step():
    """torch < 2.4's LR scheduler wraps optimizer.step in a counter (``with_counter``): compiled
    with it, every step broke its graph at the counter's weak reference. Its count now runs
    outside the compiled step, and counts as before."""
    from torch._dynamo.utils import counters

    from trainkit._optcalls import _schedulers_count_steps

    if not _schedulers_count_steps():
        pytest.skip("this torch's LR scheduler wraps optimizer.step without a counter (2.4+)")

    def breaks(with_scheduler):
        torch._dynamo.reset()
        counters.clear()
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, 2) if with_scheduler else None
        tk.compiled_step(opt)
        for _ in range(4):
            model(torch.randn(3, 8)).sum().backward()
            opt.step()
            if sched is not None:
                sched.step()
        assert not with_scheduler or opt._step_count == 4
        return sum(counters["graph_break"].values())

    assert breaks(True) == breaks(False)
