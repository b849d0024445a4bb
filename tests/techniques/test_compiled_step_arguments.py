"""``@tk.compiled_step`` on a function that gets its optimizer from the call: an argument
(``def train_step(model, opt, batch)``), a keyword, a list of them, or ``self.opt`` in a method.

Only the function's globals, closure and defaults were looked at, so such an optimizer's lr and
betas stayed Python floats in the graph: under OneCycleLR every step recompiled (7 of 12) until
dynamo's limit, then ran eagerly, with compile time recorded at each."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from ._dynamo import fresh_dynamo, moving_betas  # noqa: F401 (an autouse fixture)

pytestmark = moving_betas


class Trainer:
    def __init__(self, opt):
        self.opt = opt
        self.other = "not an optimizer"

    def step(self):
        self.opt.step()


def _step_arg(opt):
    opt.step()


def _step_list(opts):
    for o in opts:
        o.step()


CALLS = {
    "argument": lambda step, opt: step(opt),
    "keyword": lambda step, opt: step(opt=opt),
    "list": lambda step, opt: step([opt]),
}


def _run(how, compiled):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if how == "method":
        trainer = Trainer(opt)
        fn = tk.compiled_step(Trainer.step) if compiled else Trainer.step

        def call():
            fn(trainer)
    else:
        plain = _step_list if how == "list" else _step_arg
        step = tk.compiled_step(plain) if compiled else plain

        def call():
            CALLS[how](step, opt)
        fn = step
    for _ in range(12):
        model(x).pow(2).mean().backward()
        call()
        opt.zero_grad()
        sched.step()
    return model.weight.detach().clone(), fn


@pytest.mark.parametrize("how", ["argument", "keyword", "list", "method"])
def test_an_optimizer_from_the_call_is_compiled_without_recompiles(how):
    w_eager, _ = _run(how, False)
    w, step = _run(how, True)
    assert step.trainkit_compiled.recompiles == 0
    assert ((w - w_eager).norm() / w_eager.norm()).item() < 1e-5


def test_the_recompile_warning_points_at_the_users_call():
    # It pointed into trainkit (compiled_step.py), where the other warnings point at the user.
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.0)

    @tk.compiled_step
    def step():
        opt.step()

    with pytest.warns(RuntimeWarning, match="recompiled the optimizer step") as caught:
        for i in range(4):  # the warning comes at the first recompile after 2 warm-up calls
            model(torch.randn(2, 4)).sum().backward()
            opt.param_groups[0]["weight_decay"] = 0.01 * i  # a float the graph holds: a guard
            step()  # the line the warning names
            opt.zero_grad()
    (w,) = [w for w in caught if "recompiled" in str(w.message)]
    assert w.filename == __file__
    assert "step()  # the line the warning names" in open(__file__).read().splitlines()[w.lineno - 1]


def test_a_call_that_raised_keeps_its_error_where_warnings_are_errors(recwarn):
    # python -W error: the recompile warning of a call that raised was raised from the call's
    # `finally`, in place of the user's own exception (which then showed only as its context).
    import warnings

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.0)

    @tk.compiled_step
    def step(fail):
        opt.step()
        if fail:
            raise ValueError("the user's own error")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(2):  # the warm-up: compiles expected, no warning
            model(torch.randn(2, 4)).sum().backward()
            opt.param_groups[0]["weight_decay"] = 0.01 * i
            step(False)
            opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.param_groups[0]["weight_decay"] = 0.5  # a recompile after warm-up, in a call that raises
        with pytest.raises(ValueError, match="the user's own error"):
            step(True)
    shown = [w for w in recwarn if "recompiled the optimizer step" in str(w.message)]
    assert len(shown) == 1 and "ValueError under way goes on" in str(shown[0].message)
    assert shown[0].filename == __file__  # shown at the user's call, as raised it would be


@pytest.mark.parametrize("form", ["patch", "decorator"])
def test_a_late_recompile_where_warnings_are_errors_is_shown_and_its_step_counted(tmp_path, recwarn,
                                                                                  form):
    # python -W error: the warning, known only once the call had updated the parameters, was
    # raised then: the step taken, the call failed, and the session did not count that step
    import warnings

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.0)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        tk.patch(opt, compile=form == "patch")
        step = opt.step if form == "patch" else tk.compiled_step(lambda: opt.step())
        for i in range(5):
            model(torch.randn(2, 4)).sum().backward()
            if i == 3:
                opt.param_groups[0]["weight_decay"] = 0.5  # a recompile after warm-up
            before = model.weight.detach().clone()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                step()  # the line the warning names
            assert not torch.equal(model.weight, before)
            opt.zero_grad()
        assert s.step == 6  # five steps counted (the step in progress is the sixth)
    shown = [w for w in recwarn if "recompiled the optimizer step" in str(w.message)]
    assert len(shown) == 1, [str(w.message) for w in recwarn]
    assert "shown, not raised" in str(shown[0].message)
    assert "the step it reports on was taken" in str(shown[0].message)
    assert shown[0].filename == __file__
    assert "step()  # the line the warning names" in open(__file__).read().splitlines()[
        shown[0].lineno - 1]


def test_a_call_that_raised_leaves_no_reference_cycle():
    # The call's exception, kept in the call's frame for the -W error case above, made a cycle
    # with its own traceback: what the user's frames held (their tensors) lived on till a GC.
    import gc
    import weakref

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    class Held:
        pass

    @tk.compiled_step
    def step(fail):
        opt.step()
        if fail:
            raise ValueError(Held())

    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        step(False)
    gc.collect()
    gc.disable()
    try:
        try:
            step(True)
        except ValueError as exc:
            held = weakref.ref(exc.args[0])
        assert held() is None  # freed with the exception, by its last reference going
    finally:
        gc.enable()
