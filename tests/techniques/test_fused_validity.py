"""The ``fused`` technique turns ``fused=True`` on only where this torch's own step takes it.

Torch's device list (``_get_fused_kernels_supported_devices``) is not that answer: each class
checks for itself, and the checks change by release (torch 2.11's Adagrad refuses fused on CUDA,
which the list names; 2.13 and 2.14 take it). A technique that trusted the list turned fused on
for a CUDA Adagrad on torch 2.11 and its first ``step()`` raised. That shows only on CUDA with
torch 2.11; here the CPU stands in for CUDA: this torch's Adagrad is made to refuse the CPU as
2.11's refuses CUDA, at the check its step makes (``_device_dtype_check_for_fused``).
"""
from __future__ import annotations

import copy
from typing import Any, List

import pytest
import torch

import trainkit as tk
from trainkit import switches
from trainkit.techniques import fused

from ._tiny import tiny_model as _model, train as _train

CLASSES = [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad]


def _cpu_fused() -> None:
    if "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")


def _make(cls: type, model: torch.nn.Module) -> Any:
    return cls(model.parameters(), lr=0.05, **({"momentum": 0.9} if cls is torch.optim.SGD else {}))


def _make_fused(cls: type, model: torch.nn.Module) -> Any:
    """A ``fused=True`` optimizer of ``cls`` with its state made (one step)."""
    opt = cls(model.parameters(), lr=0.05, fused=True)
    _train(opt, model, steps=1)
    return opt


def test_a_class_refusing_fused_on_its_device_is_left_as_it_is(
        adagrad_refuses_the_cpu: None) -> None:
    """Before the fix: fused turned on (the device list names the CPU) and step() raised."""
    _cpu_fused()
    ref_model, model = _model(), _model()
    ref = _train(torch.optim.Adagrad(ref_model.parameters(), lr=0.05), ref_model)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    with switches.overrides({"fused": True}):
        tk.patch(opt)
    got = _train(opt, model)  # the for-loop step, as without the override (raised before)
    assert opt.param_groups[0]["fused"] is None and opt.defaults["fused"] is None
    assert "_step_supports_amp_scaling" not in opt.__dict__
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    tk.unpatch(opt)
    assert opt.param_groups[0]["fused"] is None


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_answer_is_each_classs_own(cls: type, adagrad_refuses_the_cpu: None) -> None:
    """Adagrad refusing the CPU leaves the others' fused CPU step on, and it runs."""
    _cpu_fused()
    ref_model, model = _model(), _model()
    ref = _train(_make(cls, ref_model), ref_model)
    opt = _make(cls, model)
    with switches.overrides({"fused": True}):
        tk.patch(opt)
    on = cls is not torch.optim.Adagrad
    assert opt.param_groups[0]["fused"] is (True if on else None)
    got = _train(opt, model)
    for a, b in zip(got, ref):  # the fused kernel rounds differently: ~1e-7 relative
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_fused_on_for_what_this_torch_takes_and_its_step_runs(cls: type) -> None:
    """No stand-in: this torch's own answer for the CPU in float32 (yes, for all four since 2.4)
    and in complex64 (no), with the state made before the patch (a step taken eagerly)."""
    _cpu_fused()
    for dtype, on in ((torch.float32, True), (torch.complex64, False)):
        p = torch.nn.Parameter(torch.randn(3, dtype=dtype))
        opt = cls([p], lr=0.05)
        p.grad = torch.ones_like(p)
        opt.step()  # eager, unfused: the state exists before the patch
        with switches.overrides({"fused": True}):
            tk.patch(opt)
        assert bool(opt.param_groups[0]["fused"]) is on, (cls.__name__, dtype)
        opt.step()
        tk.unpatch(opt)


def test_asking_torch_leaves_the_optimizer_and_hooks_untouched() -> None:
    """The twin torch is asked of is not the optimizer: no state, parameter, hook or profiler
    range of the user's sees it."""
    _cpu_fused()
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    calls: List[Any] = []
    handle = register_optimizer_step_pre_hook(lambda *a: calls.append(a))
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    acc_events=True) as prof:
            with switches.overrides({"fused": True}):
                tk.patch(opt)
    finally:
        handle.remove()
    assert opt.param_groups[0]["fused"] is True
    assert calls == [] and len(opt.state) == 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert not [e.name for e in prof.events() if e.name.startswith("Optimizer.step")]


def test_turning_fused_off_is_always_taken() -> None:
    """The ablation's baseline: an optimizer built fused runs its for-loop step."""
    _cpu_fused()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05, fused=True)
    with switches.overrides({"fused": False}):
        tk.patch(opt)
    assert opt.param_groups[0]["fused"] is False and opt._step_supports_amp_scaling is False
    _train(opt, model, steps=1)
    tk.unpatch(opt)
    assert opt.param_groups[0]["fused"] is True and opt._step_supports_amp_scaling is True


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad],
                         ids=lambda c: c.__name__)
def test_state_switched_to_fused_is_hosted_as_torchs_own_fused_state(cls: type) -> None:
    """Unfused state keeps ``step`` as a CPU tensor of the default dtype; fused state as float32
    on the parameter's device (torch's note "special device hosting for step"), where fused
    CUDA kernels read it. An optimizer switched with state (an Adagrad, whose constructor makes
    it; one resumed from a checkpoint) has its steps where a ``fused=True`` one of its class
    makes them, and steps as a ``fused=True`` one loaded from its state dict does (the oracle;
    its ``load_state_dict`` leaves the steps as saved, which the CPU's kernels take). Seen here
    in float64 (the default dtype), where the hosts differ on the CPU too; unpatched, the steps
    go back where they were, with the count they reached."""
    _cpu_fused()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model, twin = _model(), _model()
        opt = _make(cls, model)
        _train(opt, model, steps=2)  # unfused state: steps are float64 CPU tensors
        twin.load_state_dict(model.state_dict())
        oracle = cls(twin.parameters(), lr=0.05, fused=True)
        oracle.load_state_dict(copy.deepcopy(opt.state_dict()))  # (steps as is: not shared)
        assert {v["step"].dtype for v in opt.state.values()} == {torch.float64}
        with switches.overrides({"fused": True}):
            tk.patch(opt)
        assert opt.param_groups[0]["fused"] is True
        fresh = _make_fused(cls, _model())
        (made,) = {(v["step"].dtype, v["step"].device) for v in fresh.state.values()}
        assert made == (torch.float32, torch.device("cpu"))
        for p in model.parameters():
            a = opt.state[p]["step"]
            assert (a.dtype, a.device, float(a)) == (*made, 2.0)
        for a, b in zip(_train(opt, model), _train(oracle, twin)):  # (the oracle runs unfused:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)  # its saved groups say so)
        tk.unpatch(opt)
        assert opt.param_groups[0]["fused"] is None or opt.param_groups[0]["fused"] is False
        assert {(v["step"].dtype, float(v["step"])) for v in opt.state.values()} \
            == {(torch.float64, 5.0)}
    finally:
        torch.set_default_dtype(old)


@pytest.mark.cuda
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_cuda_fused_where_this_torch_takes_it_and_the_step_always_runs(cls: type) -> None:
    """On torch 2.11 a CUDA Adagrad is left unfused (its step refuses fused there); on 2.13+
    it may be fused. Adam, AdamW and SGD take fused on CUDA in every torch with the option.
    Either way the patched optimizer steps, to the reference's values."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref_model, model = _model("cuda"), _model("cuda")
    ref = _train(_make(cls, ref_model), ref_model)
    opt = _make(cls, model)
    with switches.overrides({"fused": True}):
        tk.patch(opt)
    if cls is not torch.optim.Adagrad:
        assert opt.param_groups[0]["fused"] is True
    got = _train(opt, model)  # before the fix, torch 2.11's Adagrad raised here
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_another_optimizers_own_kind_of_fused_value_is_left_as_it_is() -> None:
    """A third party's optimizer whose ``fused`` default is its own kind of value (a str): not a
    technique default trainkit can read, so patching it neither raises (built-in techniques take
    True, False or None) nor switches it, with or without an override."""
    p = torch.nn.Parameter(torch.zeros(3))
    for override in ({}, {"fused": True}):
        opt = torch.optim.SGD([p], lr=0.1)
        opt.defaults["fused"] = "auto"
        with switches.overrides(override):
            tk.patch(opt)
        assert opt.defaults["fused"] == "auto" and opt.param_groups[0]["fused"] is None
        tk.unpatch(opt)
