"""Audit: a user's mistakes across the public API get a clear ValueError/TypeError that repeats
the value and shows the fix, raised before any state changes (no folder, no active session, no
half-patched optimizer, no technique recorded, an active session's records intact)."""
from __future__ import annotations

import copy
import os

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def _opt_state(opt):
    return (opt.step, opt.zero_grad, type(opt), copy.deepcopy(opt.defaults),
            [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            set(opt.__dict__))


def _opt(patched: bool = False):
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return tk.patch(opt) if patched else opt


# -- tk.session -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, fix", [
    (dict(log_every=0), ValueError, "log_every=50"),
    (dict(flush_secs=-1), ValueError, "flush_secs=2"),
    (dict(flush_secs="2"), TypeError, "flush_secs=2"),
    (dict(profile=3), TypeError, "tk.ProfileSchedule("),
    (dict(steps_done=-1), ValueError, "steps_done=checkpoint"),
    (dict(steps_done=1.5), TypeError, "steps_done=checkpoint"),
    (dict(steps_done=True), TypeError, "steps_done=checkpoint"),
    (dict(log_every="5"), TypeError, "log_every=50"),
    (dict(system_metrics="yes"), TypeError, "system_metrics=False"),
])
def test_session_refuses_bad_options_before_any_state(tmp_path, monkeypatch, kwargs, exc, fix):
    monkeypatch.chdir(tmp_path)  # the default logdir would be runs/ here
    logdir = tmp_path / "run"
    (name, value), = kwargs.items()
    for given in (dict(logdir=str(logdir)), {}):
        with pytest.raises(exc) as info:
            tk.session(**given, **kwargs)
        assert f"{name}={value!r}" in str(info.value)
        assert fix in str(info.value)
        assert tk.active() is None
        assert os.listdir(tmp_path) == []  # no folder for a refused session


def test_session_logdir_a_file_is_refused(tmp_path):
    path = tmp_path / "afile"
    path.write_text("mine")
    with pytest.raises(ValueError, match="is a file, not a folder") as info:
        tk.session(logdir=str(path))
    assert repr(str(path)) in str(info.value) and "e.g. logdir=" in str(info.value)
    assert tk.active() is None and path.read_text() == "mine" and os.listdir(tmp_path) == ["afile"]


def test_refused_session_leaves_the_active_one_active_and_usable(tmp_path):
    with tk.session(logdir=str(tmp_path / "a"), system_metrics=False) as s:
        s.log("loss", 1.0, step=1)
        with pytest.raises(ValueError, match="log_every=0"):
            tk.session(logdir=str(tmp_path / "b"), log_every=0)
        assert tk.active() is s
        s.log("loss", 3.0, step=2)
    assert sorted(os.listdir(tmp_path)) == ["a"]
    assert scalars(str(tmp_path / "a"))["loss"] == [(1, 1.0), (2, 3.0)]


@pytest.mark.parametrize("kwargs, exc, shown", [
    (dict(wait=-1, warmup=0, active=0), ValueError, "wait=-1"),
    (dict(wait=1, warmup=0, active=0), ValueError, "active=0"),
    (dict(wait=1.5, warmup=0, active=1), TypeError, "wait=1.5"),
])
def test_profile_schedule_refuses_bad_counts(kwargs, exc, shown):
    with pytest.raises(exc) as info:
        tk.ProfileSchedule(**kwargs)
    assert shown in str(info.value) and "e.g. ProfileSchedule(wait=10" in str(info.value)


# -- tk.patch / tk.unpatch --------------------------------------------------------------------

def test_patch_refuses_a_number():
    with pytest.raises(TypeError) as info:
        tk.patch(42)
    assert "patch(42)" in str(info.value) and "tk.patch(optimizer)" in str(info.value)


@pytest.mark.parametrize("patched", [False, True])
def test_patch_compile_not_a_bool_leaves_the_optimizer_as_it_was(patched):
    opt = _opt(patched)
    before = _opt_state(opt)
    with pytest.raises(TypeError) as info:
        tk.patch(opt, compile="yes")
    assert "compile='yes'" in str(info.value) and "compile=True" in str(info.value)
    assert _opt_state(opt) == before


def test_patch_a_generator_twice_and_its_patch_again(tmp_path):
    def gen():
        yield from range(4)

    g = gen()
    p1 = tk.patch(g)
    assert tk.patch(p1) is p1  # idempotent on what patch returned
    p2 = tk.patch(g)  # a second wrapper over the same generator: each item comes once
    with tk.session(logdir=str(tmp_path), system_metrics=False):
        assert list(p1) + list(p2) == [0, 1, 2, 3]
    assert tk.unpatch(p1) is g and tk.unpatch(p2) is g


def test_unpatch_of_something_never_patched_is_a_no_op():
    opt = _opt()
    before = _opt_state(opt)
    assert tk.unpatch(opt) is opt
    assert _opt_state(opt) == before
    data = [1, 2]
    assert tk.unpatch(data) is data and data == [1, 2]


# -- tk.accumulate ----------------------------------------------------------------------------

@pytest.mark.parametrize("patched", [False, True])
@pytest.mark.parametrize("args, kwargs, exc, shown, fix", [
    ((0,), {}, ValueError, "n=0", "accumulate(4, optimizer)"),
    ((2.5,), {}, ValueError, "n=2.5", "accumulate(4, optimizer)"),
    ((2,), dict(normalize="sum"), ValueError, "normalize='sum'", "normalize='items'"),
])
def test_accumulate_refuses_before_touching_the_optimizer(patched, args, kwargs, exc, shown, fix):
    opt = _opt(patched)
    before = _opt_state(opt)
    with pytest.raises(exc) as info:
        with tk.accumulate(*args, opt, **kwargs):
            pass
    assert shown in str(info.value) and fix in str(info.value)
    assert _opt_state(opt) == before


def test_accumulate_refuses_a_string_for_the_optimizer():
    with pytest.raises(TypeError) as info:
        with tk.accumulate(2, "opt"):
            pass
    assert "optimizer='opt'" in str(info.value) and "e.g. accumulate(2, torch.optim" in str(info.value)


@pytest.mark.parametrize("k, exc", [(-1, ValueError), (torch.ones(3), TypeError), (True, TypeError)])
def test_add_items_refuses_and_the_window_goes_on(k, exc):
    opt = _opt()
    with tk.accumulate(2, opt, normalize="items") as acc:
        acc.add_items(3)
        with pytest.raises(exc) as info:
            acc.add_items(k)
        assert "add_items(" in str(info.value) and "acc.add_items(len(y))" in str(info.value)
        acc.add_items(torch.tensor(5))  # a 0-d tensor is a count (read without a sync)


# -- tk.autocast_scaled -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, shown", [(dict(dtype="fp8"), "dtype='fp8'"),
                                           (dict(device_type="tpu"), "device_type='tpu'")])
def test_autocast_scaled_refuses_bad_choices(kwargs, shown):
    enabled = _cpu_autocast_on()
    with pytest.raises(ValueError) as info:
        with tk.autocast_scaled(**kwargs):
            pass
    assert shown in str(info.value) and ("'bf16'" in str(info.value) or "'cpu'" in str(info.value))
    assert _cpu_autocast_on() == enabled


def _cpu_autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch 2.3: no device argument yet
        return torch.is_autocast_cpu_enabled()


# -- tk.profile_region ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "a b"])
def test_profile_region_refuses_bad_names(tmp_path, name):
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        with pytest.raises(ValueError) as info:
            with tk.profile_region(name):
                pass
        assert f"profile_region({name!r})" in str(info.value)
        assert "profile_region('forward')" in str(info.value)
        with tk.profile_region("ok"):
            pass
        s.log("loss", 1.0, step=1)
    tags = scalars(str(tmp_path))
    assert "loss" in tags and "trainkit/region/ok_ms" in tags
    assert not [t for t in tags if t.startswith("trainkit/region/") and t != "trainkit/region/ok_ms"]


# -- tk.to_device -----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's refusal of a CUDA device")
@pytest.mark.parametrize("device", ["cuda:7", "cuda", 0], ids=["index7", "default", "int0"])
def test_to_device_gpu_on_a_cpu_machine(tmp_path, device):
    x = torch.ones(2)
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        with pytest.raises(ValueError) as info:
            tk.to_device((x, x + 1), device)
        assert f"device={device!r}" in str(info.value) and "'cpu'" in str(info.value)
        assert tk.to_device({"a": 1}, device) == {"a": 1}  # nothing to move: returned as it is
        assert tk.to_device(x, "cpu") is x
        s.log("loss", 1.0, step=1)
    assert not [t for t in scalars(str(tmp_path)) if t.startswith("trainkit/h2d")]


@pytest.mark.parametrize("kwargs, exc, shown", [
    (dict(device=3.5), TypeError, "device=3.5"),
    (dict(device="cpu", non_blocking="yes"), TypeError, "non_blocking='yes'"),
])
def test_to_device_refuses_bad_arguments(kwargs, exc, shown):
    with pytest.raises(exc, match="must be") as info:
        tk.to_device(torch.ones(2), **kwargs)
    assert shown in str(info.value)


# -- tk.technique -----------------------------------------------------------------------------

@pytest.mark.parametrize("args, exc, shown, fix", [
    ((3, True), TypeError, "technique(3, ...)", "tk.technique('my_hook', True)"),
    (("fused", "maybe"), TypeError, "'maybe'", "tk.technique('fused', True)"),
    (("num_workers", "4"), TypeError, "'4'", "tk.technique('num_workers', 4)"),
])
def test_technique_refuses_and_records_nothing(tmp_path, args, exc, shown, fix):
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        before = dict(s.techniques)
        with pytest.raises(exc) as info:
            tk.technique(*args)
        assert shown in str(info.value) and fix in str(info.value)
        assert s.techniques == before
        assert tk.technique("fused", None) is None  # a built-in's default may be "unset"
        assert tk.technique("my_hook", "any value") == "any value"  # a user's own: anything


# -- tk.compiled_step -------------------------------------------------------------------------

def test_compiled_step_refuses_a_non_callable():
    with pytest.raises(TypeError) as info:
        tk.compiled_step(3)
    assert "compiled_step(3)" in str(info.value) and "tk.compiled_step(optimizer)" in str(info.value)


# -- Session.log ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, exc, shown", [
    ((3, 1.0), {}, TypeError, "name=3"),
    (("loss", "high"), {}, TypeError, "'high'"),
    (("loss", torch.ones(3)), {}, ValueError, "shape (3,)"),
    (("loss", 1.0), dict(step=-2), ValueError, "step=-2"),
    (("loss", 1.0), dict(step="3"), TypeError, "step='3'"),  # a ValueError before
    (("loss", 1.0), dict(step=2.0), TypeError, "not float"),
    # torch's own "Tensor.item() cannot be called on meta tensors" before, for a name logged
    # before (the fast path) and a new one
    (("loss", torch.empty((), device="meta")), {}, ValueError, "device='meta'"),
    (("new", torch.empty((), device="meta")), {}, ValueError, "a meta tensor holds no value"),
])
def test_refused_log_keeps_the_records_and_the_session(tmp_path, args, kwargs, exc, shown):
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        s.log("loss", 1.0, step=5)
        with pytest.raises(exc) as info:
            s.log(*args, **kwargs)
        assert shown in str(info.value)
        assert "e.g." in str(info.value) or "None files it" in str(info.value)
        assert tk.active() is s
        s.log("loss", 3.0, step=5)  # averaged with the 1.0 only
        s.log("loss", 5.0, step=6)
    assert scalars(str(tmp_path))["loss"] == [(5, 2.0), (6, 5.0)]


@pytest.mark.parametrize("value, kind", [(3, "got int"), (None, "got NoneType"),
                                         ("runs/exp1", "got str"),
                                         (torch.nn.Linear(2, 2), "got a model (nn.Module)")])
def test_unpatch_of_what_patch_never_takes_raises_as_patch_does(value, kind):
    """Before the fix ``tk.unpatch(3)`` returned 3 and ``tk.unpatch(None)`` None, silently (a
    variable holding the wrong thing, found nowhere); ``tk.patch`` raises TypeError for them."""
    with pytest.raises(TypeError):
        tk.patch(value)
    with pytest.raises(TypeError) as info:
        tk.unpatch(value)
    msg = str(info.value)
    assert msg.startswith(f"unpatch({value!r})") and kind in msg and "tk.unpatch(optimizer)" in msg
