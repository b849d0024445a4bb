"""An LR scheduler stepped inside the ``@tk.compiled_step`` function (torch's own recipe for a
compiled optimizer with a scheduler: ``def step(): opt.step(); sched.step()``).

The scheduler fills the lr (and betas) tensors the compiled step holds in ``param_groups`` during
the call; putting the floats from before the call back lost its values: ``param_groups`` and
``state_dict`` kept the first lr, a checkpoint saved it, and the run resumed from it diverged
from eager (0.079 after 4 steps)."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk

from ._dynamo import fresh_dynamo, moving_betas  # noqa: F401 (an autouse fixture)

SCHEDULES = {
    "linear": lambda opt: torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=8),
    "onecycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12),
}


def _make(model, schedule, compiled):
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = SCHEDULES[schedule](opt)

    def step():
        opt.step()
        sched.step()

    return opt, sched, (tk.compiled_step(step) if compiled else step)


def _groups(opt, sched):
    return [(g["lr"], g["betas"]) for g in opt.param_groups], sched.get_last_lr()


def _run(compiled, schedule):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).double()
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    opt, sched, step = _make(model, schedule, compiled)
    seen = []
    for _ in range(4):
        model(x).pow(2).mean().backward()
        step()
        opt.zero_grad()
        seen.append(_groups(opt, sched))
    ckpt = (opt.state_dict(), sched.state_dict())
    opt, sched, step = _make(model, schedule, compiled)  # a resume from the checkpoint
    opt.load_state_dict(ckpt[0])
    sched.load_state_dict(ckpt[1])
    for _ in range(4):
        model(x).pow(2).mean().backward()
        step()
        opt.zero_grad()
        seen.append(_groups(opt, sched))
    return model.weight.detach().clone(), seen, ckpt, step


@pytest.mark.parametrize("schedule", [
    "linear", pytest.param("onecycle", marks=moving_betas)])
def test_a_scheduler_stepped_in_the_compiled_function_keeps_its_values(schedule):
    w_eager, seen_eager, ckpt_eager, _ = _run(False, schedule)
    w, seen, ckpt, step = _run(True, schedule)
    lr, lr_eager = ckpt[0]["param_groups"][0]["lr"], ckpt_eager[0]["param_groups"][0]["lr"]
    assert lr == pytest.approx(lr_eager, rel=1e-12) and isinstance(lr, float)
    # the scheduler's own record of its last lr, what get_last_lr() says and its state_dict
    # saves: Python floats as eager's (they were the compiled step's lr tensors)
    assert all(type(v) is float for v in ckpt[1]["_last_lr"])
    assert ckpt[1]["_last_lr"] == pytest.approx(ckpt_eager[1]["_last_lr"], rel=1e-12)
    for (got, got_last), (want, want_last) in zip(seen, seen_eager):
        assert all(type(v) is float for v in got_last), got_last
        assert got_last == pytest.approx(want_last, rel=1e-12)
        for (glr, gbetas), (wlr, wbetas) in zip(got, want):
            assert type(glr) is float and all(type(b) is float for b in gbetas)
            assert glr == pytest.approx(wlr, rel=1e-12)
            assert gbetas == pytest.approx(wbetas, rel=1e-12)
    # Adam compiled in float64 is ~1e-6 from eager (README); the lost lr was 0.079 off
    assert ((w - w_eager).norm() / w_eager.norm()).item() < 1e-5
    assert step.trainkit_compiled.recompiles == 0


def test_a_hand_written_value_set_in_the_call_is_kept():
    # A schedule of the user's that sets a group's lr in the compiled function: kept, not
    # overwritten by the value from before the call.
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @tk.compiled_step
    def step():
        opt.step()
        opt.param_groups[0]["lr"] = 0.05

    model(torch.randn(2, 4)).sum().backward()
    step()
    assert opt.param_groups[0]["lr"] == 0.05


class _Trainer:
    def __init__(self, model):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)

    @tk.compiled_step
    def step(self):
        self.opt.step()
        self.sched.step()


def _stepped_by(opt, sched):
    @tk.compiled_step
    def step(o, s):
        o.step()
        s.step()

    return lambda: step(opt, sched)


@pytest.mark.parametrize("how", ["attributes", "arguments"])
def test_a_scheduler_found_in_self_or_the_arguments_says_floats(how):
    # get_last_lr() gives what eager gives, however the function reaches the scheduler: its
    # self's attributes (a trainer's method) or the call's arguments
    model = torch.nn.Linear(4, 4).double()
    trainer = _Trainer(model)
    step = trainer.step if how == "attributes" else _stepped_by(trainer.opt, trainer.sched)
    seen = []
    for _ in range(3):
        model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        step()
        trainer.opt.zero_grad()
        seen.append(trainer.sched.get_last_lr())
    assert seen == [[0.05], [0.025], [0.0125]]
    assert all(type(v) is float for lrs in seen for v in lrs)


def test_a_users_own_tensor_lr_stays_a_tensor_in_get_last_lr():
    # the user's recipe, a tensor lr from the start: neither swapped nor read back
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    @tk.compiled_step
    def step():
        opt.step()
        sched.step()

    model(torch.ones(2, 4)).sum().backward()
    step()
    last = sched.get_last_lr()
    assert isinstance(last[0], torch.Tensor) and last[0].item() == pytest.approx(0.05)
