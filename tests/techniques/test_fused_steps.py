"""The ``fused`` technique puts the state's ``step`` counters where the switched update reads them.

torch keeps a step where its group's update reads it (its note "special device hosting for
step"): float32 on the parameter's device for a fused group, a CPU tensor of the default scalar
dtype for the for-loop update, which reads it with ``.item()``. An optimizer built
``fused=True`` on a GPU and switched off by the ablation (its baseline) kept its steps on the
GPU: one ``.item()`` sync per parameter per step. On the CPU both places are the CPU; the dtype
still tells them apart when the default dtype is float64 (for-loop: float64; fused: float32).
"""
from __future__ import annotations

from typing import Any, Set, Tuple

import pytest
import torch

import trainkit as tk
from trainkit import switches
from trainkit.techniques import fused
from trainkit.techniques._fused_steps import hosted

from ._tiny import fused_float64, tiny_model as _model, train as _train

CLASSES = [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad]


float64 = pytest.fixture(fused_float64)


def _places(opt: Any) -> Set[Tuple[torch.dtype, str, float]]:
    return {(v["step"].dtype, v["step"].device.type, float(v["step"]))
            for v in opt.state.values()}


def _made(cls: type, device: str = "cpu", **kwargs: Any) -> Tuple[torch.dtype, str]:
    """Where ``cls(..., **kwargs)`` keeps its steps after one step: torch's own answer."""
    model = _model(device)
    opt = cls(model.parameters(), lr=0.05, **kwargs)
    _train(opt, model, 1)
    (made,) = {(dtype, dev) for dtype, dev, _ in _places(opt)}
    return made


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_switched_off_the_steps_go_where_the_for_loop_update_keeps_them(
        cls: type, float64: None) -> None:
    """Before the fix they stayed as fused state has them (float32; on a GPU, on the GPU), and
    the count was kept; unpatched, they go back where fused state has them, with the count."""
    model, ref_model = _model(), _model()
    opt = cls(model.parameters(), lr=0.05, fused=True)
    ref = cls(ref_model.parameters(), lr=0.05, fused=True)
    _train(opt, model, 2)
    _train(ref, ref_model, 2)
    with switches.overrides({"fused": False}):
        tk.patch(opt)
    assert opt.param_groups[0]["fused"] is False
    assert _places(opt) == {(*_made(cls), 2.0)}
    ref.param_groups[0]["fused"] = False  # the oracle: switched by hand, its steps as they were
    for a, b in zip(_train(opt, model, 3), _train(ref, ref_model, 3)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    tk.unpatch(opt)
    assert _places(opt) == {(*_made(cls, fused=True), 5.0)}
    _train(opt, model, 1)  # the fused step runs on them
    assert _places(opt) == {(*_made(cls, fused=True), 6.0)}


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW], ids=lambda c: c.__name__)
def test_steps_made_under_the_switch_go_where_the_restored_update_keeps_them(
        cls: type, float64: None) -> None:
    """State the for-loop update made under the patch (switched off before the first step) is
    hosted for the fused update ``tk.unpatch`` gives back; before the fix only the steps the
    patch itself had moved went back, none here (on a GPU, a fused step on CPU steps)."""
    model = _model()
    opt = cls(model.parameters(), lr=0.05, fused=True)
    with switches.overrides({"fused": False}):
        tk.patch(opt)
    _train(opt, model, 2)
    assert _places(opt) == {(*_made(cls), 2.0)}
    tk.unpatch(opt)
    assert _places(opt) == {(*_made(cls, fused=True), 2.0)}


def test_hosted_puts_a_step_where_each_mode_keeps_it(float64: None) -> None:
    """The conversion itself, with the dtype and device checks: the CPU's default scalar dtype
    for the for-loop update, float32 on the parameter's device for fused or capturable; the
    step itself where it is already there; the count kept."""
    param = torch.zeros(2)
    f32, f64 = torch.tensor(7.0, dtype=torch.float32), torch.tensor(7.0, dtype=torch.float64)
    off, on = hosted(f32, param, False), hosted(f64, param, True)
    assert (off.dtype, off.device.type, float(off)) == (torch.float64, "cpu", 7.0)
    assert (on.dtype, on.device.type, float(on)) == (torch.float32, "cpu", 7.0)
    assert hosted(f64, param, False) is f64 and hosted(f32, param, True) is f32
    torch.set_default_dtype(torch.float32)
    assert hosted(f32, param, False) is f32


@pytest.mark.cuda
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_cuda_switched_off_the_steps_leave_the_gpu_and_come_back(cls: type) -> None:
    """On a GPU: a ``fused=True`` optimizer switched off keeps its steps on the CPU (no
    ``.item()`` sync per parameter per step), steps as the same optimizer switched by hand
    whose steps torch's own for-loop update made, and ``tk.unpatch`` puts them back on the
    GPU in float32, where its fused step runs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if cls is torch.optim.Adagrad and not fused._accepted(
            cls(_model("cuda").parameters(), lr=0.05, fused=True)):
        pytest.skip("this torch's Adagrad takes no fused step on CUDA")
    model, ref_model = _model("cuda"), _model("cuda")
    opt = cls(model.parameters(), lr=0.05, fused=True)
    ref = cls(ref_model.parameters(), lr=0.05, fused=True)
    _train(opt, model, 2)
    _train(ref, ref_model, 2)
    assert {d for _, d, _ in _places(opt)} == {"cuda"}
    with switches.overrides({"fused": False}):
        tk.patch(opt)
    assert _places(opt) == {(*_made(cls, "cuda"), 2.0)}
    assert _made(cls, "cuda")[1] == "cpu"
    ref.param_groups[0]["fused"] = False
    for st in ref.state.values():  # the oracle's steps where its own for-loop update keeps them
        st["step"] = st["step"].cpu()
    for a, b in zip(_train(opt, model, 3), _train(ref, ref_model, 3)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    tk.unpatch(opt)
    assert _places(opt) == {(torch.float32, "cuda", 5.0)}
    _train(opt, model, 1)
    assert _places(opt) == {(torch.float32, "cuda", 6.0)}


def _switched_on(model: torch.nn.Module) -> Any:
    """An unfused Adam with state (two steps), patched under a ``fused=True`` override."""
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    _train(opt, model, 2)
    with switches.overrides({"fused": True}):
        tk.patch(opt)
    assert opt.param_groups[0]["fused"] is True
    return opt


def test_a_group_added_under_the_switch_takes_it_and_unpatch_gives_it_back(float64: None) -> None:
    """Before the fix the group added with ``add_param_group`` kept ``fused=True`` after
    ``tk.unpatch`` (only the groups at the patch were restored), its steps as fused keeps them."""
    model = _model()
    opt = _switched_on(model)
    extra = torch.nn.Parameter(torch.ones(3))
    opt.add_param_group({"params": [extra]})
    mine = torch.nn.Parameter(torch.ones(3))
    opt.add_param_group({"params": [mine], "fused": False})  # the caller's own value: kept
    assert [g["fused"] for g in opt.param_groups] == [True, True, False]
    extra.grad = torch.ones(3)
    _train(opt, model, 1)
    tk.unpatch(opt)
    assert [(g["fused"], g["foreach"]) for g in opt.param_groups] == [(None, None)] * 2 \
        + [(False, None)]
    assert opt.state[extra]["step"].dtype == torch.float64  # where the for-loop update keeps it


def test_a_state_dict_saved_under_the_switch_is_the_unpatched_ones(float64: None) -> None:
    """Before the fix it carried ``fused=True`` and the fused steps into the optimizer it was
    loaded into later: a plain resume ran fused, with its steps on the device. The live state is
    left as it is."""
    model, ref_model = _model(), _model()
    opt = _switched_on(model)
    ref = torch.optim.Adam(ref_model.parameters(), lr=0.05)  # never patched: the oracle
    _train(ref, ref_model, 2)
    live = [opt.state[p]["step"] for p in model.parameters()]
    saved = opt.state_dict()
    assert saved["param_groups"] == ref.state_dict()["param_groups"]
    assert {(v["step"].dtype, float(v["step"])) for v in saved["state"].values()} \
        == {(torch.float64, 2.0)}
    assert [opt.state[p]["step"] for p in model.parameters()] == live  # the same tensors
    assert {v["step"].dtype for v in opt.state.values()} == {torch.float32}
    later = torch.optim.Adam(_model().parameters(), lr=0.05)
    later.load_state_dict(saved)
    assert later.param_groups[0]["fused"] is None
    assert {v["step"].dtype for v in later.state.values()} == {torch.float64}


def test_a_checkpoint_loaded_under_the_switch_keeps_it(float64: None) -> None:
    """``load_state_dict`` replaces the groups with the checkpoint's: before the fix a resume
    under the ablation's ``fused=True`` ran unfused from there on, measured as fused. Unpatched,
    the groups hold the checkpoint's values."""
    model = _model()
    opt = _switched_on(model)
    opt.load_state_dict(_switched_on(_model()).state_dict())  # saved as unpatched: fused None
    assert opt.param_groups[0]["fused"] is True
    assert {(v["step"].dtype, float(v["step"])) for v in opt.state.values()} \
        == {(torch.float32, 2.0)}
    plain = torch.optim.Adam(_model().parameters(), lr=0.05, foreach=False)
    opt.load_state_dict(plain.state_dict())  # foreach=False, no state
    assert opt.param_groups[0]["fused"] is True
    tk.unpatch(opt)
    assert (opt.param_groups[0]["fused"], opt.param_groups[0]["foreach"]) == (None, False)
