"""tk.patch / tk.unpatch on optimizers: bit-identical results, schedulers, pickling, closures."""
from __future__ import annotations

import copy
import pickle
import time
import warnings

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
])
def test_patched_step_is_bit_identical(tmp_path, make):
    a, b = mlp(), mlp()
    opt_a, opt_b = make(a.parameters()), make(b.parameters())
    with tk.session(logdir=tmp_path):
        tk.patch(opt_a)
        train(a, opt_a, tk.patch(loader()))
    train(b, opt_b, loader())
    for pa, pb in zip(_params(a), _params(b)):
        assert torch.equal(pa, pb)
    assert len(scalars(tmp_path)["trainkit/update_ms"]) == 8


def _closure_run(model, opt, batches):
    for x, y in batches:
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4),
    lambda p: torch.optim.SGD(p, lr=0.1),
])
def test_closure_steps_are_bit_identical_and_timed_apart(tmp_path, make):
    a, b = mlp(), mlp()
    opt_a, opt_b = make(a.parameters()), make(b.parameters())
    with tk.session(logdir=tmp_path):
        tk.patch(opt_a)
        _closure_run(a, opt_a, loader(n=32))
    _closure_run(b, opt_b, loader(n=32))
    for pa, pb in zip(_params(a), _params(b)):
        assert torch.equal(pa, pb)
    got = scalars(tmp_path)
    assert len(got["trainkit/closure_ms"]) == 4 and len(got["trainkit/update_ms"]) == 4
    assert all(v > 0 for _, v in got["trainkit/closure_ms"])


def test_closure_keyword_form(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = next(iter(loader()))
    calls = []

    def closure():
        calls.append(1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with tk.session(logdir=tmp_path):
        tk.patch(opt)
        out = opt.step(closure=closure)
    assert calls == [1] and out is not None
    assert len(scalars(tmp_path)["trainkit/closure_ms"]) == 1


def test_idempotent_and_unpatch_restores(tmp_path):
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    assert tk.patch(opt) is opt
    first = opt.step
    assert tk.patch(opt) is opt and opt.step == first
    assert tk.unpatch(opt) is opt
    assert "step" not in opt.__dict__ and "zero_grad" not in opt.__dict__
    with tk.session(logdir=tmp_path):
        opt.step()
    assert "trainkit/update_ms" not in scalars(tmp_path)
    assert tk.unpatch(opt) is opt  # unpatching twice is harmless


def test_state_dict_deepcopy_and_pickle_as_unpatched():
    model = mlp()
    plain = torch.optim.Adam(mlp().parameters(), lr=1e-3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, opt, loader(n=16))
    train(mlp(), plain, loader(n=16))
    before = opt.state_dict()
    tk.patch(opt)
    after = opt.state_dict()
    assert after.keys() == before.keys() and after["param_groups"] == before["param_groups"]
    for k in before["state"]:
        for name, t in before["state"][k].items():
            assert torch.equal(t, after["state"][k][name])
    dup = copy.deepcopy(opt)
    assert "step" not in dup.__dict__ and "_trainkit_patch" not in dup.__dict__
    dup.step()  # a working, unpatched optimizer
    clone = pickle.loads(pickle.dumps(opt))
    assert "_trainkit_patch" not in clone.__dict__
    assert clone.state_dict()["param_groups"] == before["param_groups"]
    assert "step" in opt.__dict__  # the original is still patched
    tk.unpatch(opt)


@pytest.mark.parametrize("when", ["before", "after"])
def test_lr_schedulers_behave_as_unpatched(tmp_path, when):
    def run(patch_it):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if patch_it and when == "before":
            tk.patch(opt)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20)
        if patch_it and when == "after":
            tk.patch(opt)
        lrs = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
            for _ in range(2):
                for x, y in loader(n=64):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    sched.step()
                    lrs.append(opt.param_groups[0]["lr"])
        return lrs[:20], _params(model), opt

    with tk.session(logdir=tmp_path):
        lrs, params, opt = run(True)
    ref_lrs, ref_params, _ = run(False)
    assert lrs == ref_lrs
    for a, b in zip(params, ref_params):
        assert torch.equal(a, b)
    # No patched loader: the first step has no start to measure from.
    assert [st for st, _ in scalars(tmp_path)["trainkit/step_time_ms"]] == list(range(2, 17))
    tk.unpatch(opt)
    opt.step()  # still works after unpatching, even when a scheduler wrapped our step


def test_patch_again_after_a_scheduler_wrapped_the_first_patch(tmp_path):
    """patch -> a scheduler wraps the patched step -> unpatch -> patch: the scheduler's wrapper
    (still holding the first patch's step) becomes the new patch's core without calling it."""
    def run(repatch):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if repatch:
            tk.patch(opt)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if repatch:
            tk.unpatch(opt)
            tk.patch(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
            for x, y in loader(n=32):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                sched.step()
        return _params(model), opt

    with tk.session(logdir=tmp_path):
        params, opt = run(True)
    ref, _ = run(False)
    assert all(torch.equal(a, b) for a, b in zip(params, ref))
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == [1, 2, 3, 4]
    tk.unpatch(opt)
    opt.step()


class _SlowSGD(torch.optim.SGD):
    """An SGD whose step takes 20 ms more: its update time shows where it was filed."""

    def step(self, closure=None):
        time.sleep(0.02)
        return super().step(closure)


@pytest.mark.parametrize("patched_loader", [False, True])
def test_second_optimizer_adds_update_time_to_the_same_step(tmp_path, patched_loader):
    # A GAN's loop: the first optimizer to step makes the steps; the second one's update time
    # goes under the step of the iteration it ran in, not the next one (nor an extra last step).
    d, g = mlp(0), mlp(1)
    opt_d = tk.patch(torch.optim.SGD(d.parameters(), lr=0.1))
    opt_g = tk.patch(_SlowSGD(g.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path):
        batches = loader(n=32)
        for x, y in (tk.patch(batches) if patched_loader else batches):
            for m, o in ((d, opt_d), (g, opt_g)):
                torch.nn.functional.cross_entropy(m(x), y).backward()
                o.step()
                o.zero_grad()
    sc = scalars(tmp_path)
    assert {st for values in sc.values() for st, _ in values} == {1, 2, 3, 4}
    update = sc["trainkit/update_ms"]
    assert [st for st, _ in update] == [1, 2, 3, 4]
    assert all(20.0 <= ms < 1000 for _, ms in update), update
    step_time = sc["trainkit/step_time_ms"]
    assert [st for st, _ in step_time] == ([1, 2, 3, 4] if patched_loader else [2, 3, 4])
    # wall time between the first optimizer's step ends: each holds one step of the second
    assert all(ms >= 20.0 for st, ms in step_time if st > 1), step_time


@pytest.mark.parametrize("bad, text", [
    (42, "got int"),
    ("abc", "got str"),
    ({"a": 1}, "got dict"),
    (torch.nn.Linear(2, 2), "a model"),
    (torch.ones(3), "got Tensor"),
    (torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], lr=0.1), 1),
     "got StepLR of an optimizer: patch the optimizer itself"),
    (torch.optim.SGD([torch.zeros(1)], lr=0.1).step, "got method of an optimizer"),
])
def test_patch_refuses_what_it_cannot_patch(bad, text):
    with pytest.raises(TypeError, match=text) as info:
        tk.patch(bad)
    assert "tk.patch(optimizer)" in str(info.value)


@pytest.mark.parametrize("container", [list, tuple])
def test_patch_refuses_a_list_of_optimizers_and_patches_none(container):
    # A GAN's tk.patch([opt_g, opt_d]) was taken for a loader: no optimizer patched, no error.
    g = torch.optim.SGD(mlp(0).parameters(), lr=0.1)
    d = torch.optim.Adam(mlp(1).parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"one optimizer at a time, e\.g\. tk\.patch\(opt_g\)"):
        tk.patch(container([g, d]))
    assert "step" not in g.__dict__ and "step" not in d.__dict__
    batches = container([(torch.ones(2, 8), torch.zeros(2))])  # a list of batches is a loader
    assert list(tk.patch(batches)) == list(batches)
    tk.patch(g)
    with pytest.raises(TypeError, match=r"unpatch\(\[SGD, Adam\]\).*tk\.unpatch\(opt_g\)"):
        tk.unpatch([g, d])  # returned the list, g still patched
    assert "step" in g.__dict__
    tk.unpatch(g)


def test_patch_compile_flag_must_be_bool_and_only_for_optimizers():
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(TypeError, match="compile='yes'"):
        tk.patch(opt, compile="yes")
    assert "step" not in opt.__dict__
    with pytest.raises(TypeError, match="optimizers only"):
        tk.patch([1, 2], compile=True)


def test_zero_grad_is_wrapped_only_when_something_needs_it():
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    assert "zero_grad" not in opt.__dict__  # set_to_none=True is zero_grad's own default
    with tk.accumulate(2, opt):
        assert "zero_grad" in opt.__dict__  # the window must hold the gradients
        x, y = next(iter(loader()))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        assert all(p.grad is not None for p in model.parameters())
    tk.unpatch(opt)
    assert "zero_grad" not in opt.__dict__


@pytest.mark.parametrize("how", ["repatched", "replaced"])
def test_an_optimizer_patched_again_or_replaced_in_a_session_goes_on_counting_steps(tmp_path, how):
    # The first optimizer to step makes the steps; once it is unpatched (or gone), the next
    # one to step takes over. Before, the session kept waiting for the old one: phase 2's
    # values all went into one step.
    model = mlp()
    batches = list(loader(n=32, batch_size=8))
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        train(model, opt, tk.patch(batches), log=s.log)
        tk.unpatch(opt)
        if how == "replaced":
            del opt
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        tk.patch(opt)
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path)
    assert s.step == 9
    assert [st for st, _ in got["loss"]] == list(range(1, 9))
    assert [st for st, _ in got["trainkit/update_ms"]] == list(range(1, 9))
    assert [st for st, _ in got["trainkit/step_time_ms"]] == list(range(1, 9))


@pytest.mark.parametrize("patched_loader", [True, False])
def test_a_new_optimizer_beside_the_old_one_still_patched_takes_over(tmp_path, patched_loader):
    # The old one is alive and patched (a scheduler or a list still holds it). With a patched
    # loader, the new one steps on a batch the old one did not step on: it takes over at its
    # first step (before, at its second: its first step joined the step before, one step of
    # two batches). Without one, it cannot be told from a GAN's second optimizer until it steps
    # twice with no step of the old one between: from then on it counts (its first step joins
    # the step before).
    model = mlp()
    batches = list(loader(n=32, batch_size=8))
    wrap = tk.patch if patched_loader else list
    old = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        train(model, old, wrap(batches), log=s.log)
        new = tk.patch(torch.optim.Adam(model.parameters(), lr=1e-3))
        train(model, new, wrap(batches), log=s.log)
    steps = 8 if patched_loader else 7
    assert s.step == steps + 1
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/update_ms"]] == list(range(1, steps + 1))
    # (without a patched loader the first step's start is unknown: no time for it)
    first = 1 if patched_loader else 2
    assert [st for st, _ in got["trainkit/step_time_ms"]] == list(range(first, steps + 1))
    if patched_loader:
        assert [st for st, _ in got["loss"]] == list(range(1, 9))
        for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
            assert sps == pytest.approx(8 / (ms / 1e3), rel=1e-4)  # one batch a step
    del old


def test_a_custom_optimizers_positional_argument_that_is_no_closure_is_passed_on():
    class LossAware(torch.optim.SGD):
        def step(self, loss=None):  # e.g. an optimizer that adapts to the loss value
            assert loss is None or isinstance(loss, float), loss
            return super().step()

    model = mlp()
    opt = tk.patch(LossAware(model.parameters(), lr=0.1))
    x, y = next(iter(loader()))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step(0.5)  # before: wrapped as a timed closure, and the optimizer got a function
    with tk.accumulate(1, opt):
        opt.step(0.5)


def test_a_custom_optimizers_model_argument_is_passed_on_not_taken_for_a_closure(tmp_path):
    class ModelAware(torch.optim.SGD):
        def step(self, model=None):  # e.g. an optimizer that reads the model's layers
            self.layers = len(list(model.children()))
            return super().step()

    model = mlp()
    opt = tk.patch(ModelAware(model.parameters(), lr=0.1))
    x, y = next(iter(loader()))
    with tk.session(logdir=tmp_path, system_metrics=False):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step(model)  # before: a timed closure, and the step got a function
        with tk.accumulate(1, opt):
            opt.step(model)  # before: the gate ran the model as a closure, with no input
    assert opt.layers == 3
    got = scalars(tmp_path)
    assert len(got["trainkit/update_ms"]) == 2 and "trainkit/closure_ms" not in got

def test_a_malformed_techniques_variable_leaves_the_optimizer_unpatched(monkeypatch):
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", "{not json")
    with pytest.raises(ValueError, match="TRAINKIT_TECHNIQUES"):
        tk.patch(opt)
    assert "step" not in opt.__dict__ and "_trainkit_patch" not in opt.__dict__
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"set_to_none": false}')
    tk.patch(opt)  # fixed: now it patches, and the switch takes effect
    assert opt.__dict__["_trainkit_patch"].set_to_none is False


def test_a_torch_that_cannot_compile_leaves_the_optimizer_unpatched(monkeypatch):
    """torch.compile raises where dynamo cannot run (e.g. "Dynamo is not supported on Python
    3.x"); tk.patch(opt, compile=True) left the optimizer patched, uncompiled, after raising."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def cannot_compile(*args, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python")

    with monkeypatch.context() as m:
        m.setattr(torch, "compile", cannot_compile)
        with pytest.raises(RuntimeError, match="Dynamo is not supported"):
            tk.patch(opt, compile=True)
    assert "step" not in opt.__dict__ and "_trainkit_patch" not in opt.__dict__
    tk.patch(opt)  # patching it again, once compile works or without it, starts clean
    tk.patch(opt, compile=True)  # and compile=True on a patched optimizer compiles its step
    assert opt.__dict__["_trainkit_patch"].compiled
    tk.unpatch(opt)


class _LineSearchSGD(torch.optim.SGD):
    """A step that calls its closure again with an argument: a forward-only evaluation, as
    line-search optimizers do."""

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            loss = closure()
        super().step()
        self.after = float(closure(backward=False))
        return loss


def _line_search_run(model, opt, batches):
    for x, y in batches:
        def closure(backward=True):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if backward:
                opt.zero_grad()
                loss.backward()
            return loss
        opt.step(closure)
    return opt.after


def test_a_closure_the_optimizer_calls_with_arguments_gets_them(tmp_path):
    # Before: trainkit's timed closure took no arguments, and a patched step raised TypeError
    # ("timed() got an unexpected keyword argument 'backward'") in a session.
    a, b = mlp(), mlp()
    opt_a, opt_b = _LineSearchSGD(a.parameters(), lr=0.1), _LineSearchSGD(b.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt_a)
        after_a = _line_search_run(a, opt_a, loader(n=32))
    after_b = _line_search_run(b, opt_b, loader(n=32))
    assert after_a == after_b
    for pa, pb in zip(_params(a), _params(b)):
        assert torch.equal(pa, pb)
    assert len(scalars(tmp_path)["trainkit/closure_ms"]) == 4


def test_an_accumulating_step_calls_the_closure_again_for_a_call_with_arguments(tmp_path):
    m = mlp()
    opt = _LineSearchSGD(m.parameters(), lr=0.1)
    x, y = next(iter(loader()))
    calls = []

    def closure(backward=True):
        calls.append(backward)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        if backward:
            loss.backward()
        return loss

    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        with tk.accumulate(2, opt):
            opt.step(closure)
            opt.step(closure)
    # each micro-batch's closure once; the real step's own call gets that loss back, and its
    # forward-only evaluation after the update runs the closure
    assert calls == [True, True, False]
    with torch.no_grad():
        assert opt.after == float(torch.nn.functional.cross_entropy(m(x), y))


def test_an_instance_step_runs_after_unpatch_through_a_scheduler_made_while_patched():
    # The user's (or a library's) step set on the instance, then tk.patch, an LR scheduler, and
    # tk.unpatch: the scheduler's wrapper calls the old patched step, which called the class's
    # step and skipped the instance's one (0 of 3 calls, against 3 of 3 unpatched).
    import types

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def counting_step(self, *args, **kwargs):
        calls.append(1)
        return type(self).step(self, *args, **kwargs)

    opt.step = types.MethodType(counting_step, opt)
    tk.patch(opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    tk.unpatch(opt)
    x, y = next(iter(loader()))
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    assert len(calls) == 3
    tk.patch(opt)  # and patched again, through the same wrapper
    opt.step()
    assert len(calls) == 4
