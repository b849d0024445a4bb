"""A patched optimizer is freed as soon as the loop drops it, as an unpatched one is: its state
(Adam's moments, on the GPU) does not wait for Python's cyclic garbage collector."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, step_function, train
from trainkit.techniques import fused


@pytest.fixture
def no_cyclic_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def _warm_up():  # an optimizer's first step ever keeps it in torch's caches once
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    train(model, opt, loader(n=8))


@pytest.mark.parametrize("how", ["plain", "scheduler", "set_to_none_off", "fused", "accumulate",
                                 "compiled"])
def test_a_dropped_patched_optimizer_is_freed_without_the_cyclic_collector(
        tmp_path, no_cyclic_gc, monkeypatch, how):
    # The patch kept bound methods of the optimizer in its own __dict__ (its step, its
    # zero_grad, the original step in the patch's state): a reference cycle, so `del opt` (or a
    # second phase's new optimizer bound to the same name) left it, and its state, alive until
    # a full collection.
    if how == "set_to_none_off":
        monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"set_to_none": false}')
    if how == "fused" and "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")
    if how == "fused":  # the technique's undo is kept in the patch too
        monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fused": true}')
    _warm_up()
    model = mlp()
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        # compiled: the bound step compiled, and the optimizer held for its hyper-parameter
        # tensors, kept it alive (a cycle through the patch), its state and all
        opt = tk.patch(torch.optim.Adam(model.parameters(), lr=1e-2), compile=how == "compiled")
        sched = (torch.optim.lr_scheduler.StepLR(opt, 2) if how in ("scheduler", "compiled")
                 else None)
        if how == "fused":
            assert opt.defaults["fused"] is True
        if how == "accumulate":
            with tk.accumulate(2, opt):
                train(model, opt, tk.patch(loader(n=32)), log=s.log)
        else:
            train(model, opt, tk.patch(loader(n=32)), log=s.log)
            if sched is not None:
                sched.step()
        state = weakref.ref(next(iter(opt.state.values()))["exp_avg"])
        freed = weakref.ref(opt)
        del opt, sched
        assert freed() is None
        assert state() is None
    assert [st for st, _ in scalars(tmp_path)["trainkit/update_ms"]] == (
        [1, 2] if how == "accumulate" else [1, 2, 3, 4])


def test_a_step_method_kept_across_unpatch_still_steps():
    opt = tk.patch(torch.optim.SGD(mlp().parameters(), lr=0.1))
    step = opt.step
    tk.unpatch(opt)
    step()  # unpatched since: the class's own step


@pytest.mark.parametrize("use_c", [True, False], ids=["C", "Python"])
def test_a_step_kept_after_its_optimizer_was_dropped_says_so(tmp_path, monkeypatch, use_c):
    """`step = opt.step; del opt`: unpatched, the bound method keeps the optimizer alive; the
    patched one holds it weakly (above), and its call said "TypeError: instance must not be
    None". Now a ReferenceError that says why and what to do, and nothing recorded for it."""
    from trainkit import recorder

    if use_c and recorder._fast is None:
        pytest.skip("trainkit._speedups is not built here")
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    model = mlp()
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
        assert (type(step_function(opt)).__name__ == "FastStep") is use_c
        train(model, opt, loader(n=16))
        step = opt.step
        freed = weakref.ref(opt)
        del opt
        gc.collect()
        assert freed() is None
        before = (s.step, len(s._buf))
        with pytest.raises(ReferenceError, match="SGD.step: its optimizer was deleted.*keep a "
                                                 "reference to the optimizer"):
            step()
        assert (s.step, len(s._buf)) == before
