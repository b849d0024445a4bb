"""An optimizer class whose own ``__getstate__`` returns its ``__dict__``: pickled and copied while
patched, it gives what it gives unpatched (before, pickling failed and a deep copy's step changed
nothing: its patch still pointed at the original)."""
from __future__ import annotations

import copy
import gc
import importlib
import pickle
import weakref

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train

_patch_module = importlib.import_module("trainkit.patch")  # tk.patch is the function


class DictStateSGD(torch.optim.SGD):
    """An optimizer as some libraries write it: its whole ``__dict__`` is its state."""

    def __getstate__(self):
        return self.__dict__


class FailingStateSGD(torch.optim.SGD):
    def __getstate__(self):
        raise RuntimeError("this optimizer cannot be copied")


def _trained(patch_it, tmp_path, set_to_none=True):
    torch.manual_seed(0)
    model = mlp()
    opt = DictStateSGD(model.parameters(), lr=0.1, momentum=0.9)
    if patch_it:
        tk.patch(opt)
        if not set_to_none:
            _patch_module.wrap_zero_grad(opt)  # what set_to_none=False or accumulate does
    with tk.session(logdir=tmp_path / ("patched" if patch_it else "plain")):
        train(model, opt, loader(n=16))
    return model, opt


def _copy_steps_itself(dup):
    """One step of ``dup`` alone: its parameters move, by exactly SGD's update of ``dup``."""
    params = dup.param_groups[0]["params"]
    for p in params:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in params]
    dup.step()
    return [not torch.equal(b, p) for b, p in zip(before, params)]


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "copy"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_copies_of_a_patched_optimizer_are_unpatched_ones(tmp_path, how, set_to_none):
    copier = {"deepcopy": copy.deepcopy, "copy": copy.copy,
              "pickle": lambda o: pickle.loads(pickle.dumps(o))}[how]
    _, plain = _trained(False, tmp_path)
    model, opt = _trained(True, tmp_path, set_to_none)
    expected = sorted(copier(plain).__dict__)
    dup = copier(opt)
    assert sorted(dup.__dict__) == expected  # no step, zero_grad, patch or __getstate__ of ours
    assert "_trainkit_patch" in opt.__dict__ and "step" in opt.__dict__  # the original still is
    if how != "copy":  # a shallow copy shares the parameters, as unpatched
        w = [p.detach().clone() for p in model.parameters()]
        assert all(_copy_steps_itself(dup))
        assert all(torch.equal(a, b) for a, b in zip(w, model.parameters()))
        assert dup.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    # the original goes on recording its steps
    with tk.session(logdir=tmp_path / "again"):
        train(model, opt, loader())
    assert len(scalars(tmp_path / "again")["trainkit/update_ms"]) == 8


def test_unpatch_removes_the_instance_getstate_and_repatching_works(tmp_path):
    _, opt = _trained(True, tmp_path)
    assert "__getstate__" in opt.__dict__
    tk.unpatch(opt)
    assert "__getstate__" not in opt.__dict__ and "step" not in opt.__dict__
    tk.patch(opt)
    dup = pickle.loads(pickle.dumps(opt))
    assert "_trainkit_patch" not in dup.__dict__ and all(_copy_steps_itself(dup))
    tk.unpatch(opt)


def test_an_optimizer_whose_state_leaves_instance_attributes_out_gets_no_getstate(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tk.patch(opt)
    assert "__getstate__" not in opt.__dict__  # Optimizer.__getstate__ hands over 3 keys only
    tk.unpatch(opt)


def test_a_failing_getstate_fails_as_unpatched_and_the_patch_works(tmp_path):
    model = mlp()
    opt = FailingStateSGD(model.parameters(), lr=0.1)
    tk.patch(opt)
    with pytest.raises(RuntimeError, match="cannot be copied"):
        copy.deepcopy(opt)
    with tk.session(logdir=tmp_path):
        train(model, opt, loader())
    assert len(scalars(tmp_path)["trainkit/update_ms"]) == 8


def test_the_guarded_optimizer_is_freed_without_the_cyclic_collector():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        opt = DictStateSGD(mlp().parameters(), lr=0.1)
        tk.patch(opt)
        assert "__getstate__" in opt.__dict__
        ref = weakref.ref(opt)
        del opt
        assert ref() is None
    finally:
        if was:
            gc.enable()
