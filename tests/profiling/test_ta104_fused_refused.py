"""TA104 (the optimizer step dominates) never advises ``fused=True`` where the run's own torch
refuses it. Whether a class takes ``fused=True`` for given parameters is each torch release's
and device's answer (torch 2.11's Adagrad refuses it on CUDA, 2.13 and 2.14 take it; no release
takes complex parameters), and the fix advised ``torch.optim.Adagrad(params, ..., fused=True)``
and "Adam, AdamW, SGD, Adagrad: fused=True" whatever the run's torch said. The session's close
now asks torch (a scratch twin built fused, stepped once) and records ``fused_ok``.

Here the refusal is real: complex parameters, which this torch's fused step refuses on the CPU;
and, standing in for torch 2.11's CUDA refusal, this torch's Adagrad made to refuse the CPU at
the check its step makes (as tests/techniques/test_fused_validity.py does).
"""
from __future__ import annotations

from typing import Any, Callable, List

import pytest
import torch

import trainkit as tk
from trainkit import _optinfo
from trainkit._optinfo import fused_accepted
from trainkit.profiling.analyzers.records import Steps, _optimizer_fix
from trainkit.profiling.runs import load_run
from trainkit.techniques import fused as fused_technique

from .conftest import dominated_run, gan_run



@pytest.fixture(autouse=True)
def _fused_on_cpu():
    if "cpu" not in fused_technique._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")


def _ta104(logdir: str):
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA104"]
    return f


def _complex(make: Callable[[List[Any]], Any]) -> Callable[[List[Any]], Any]:
    """``dominated_run``'s optimizer over a complex 2M-element parameter (4M floats, its
    gradient kept across steps) in place of its float 4M one: this torch's fused step refuses
    complex parameters (``_device_dtype_check_for_fused``), its for-loop and multi-tensor ones
    take them."""
    def build(params: List[Any]) -> Any:
        *layer, _ = params
        big = torch.nn.Parameter(torch.zeros(1000, 2000, dtype=torch.complex64))
        big.grad = torch.randn_like(big)
        return make([*layer, big])
    return build


def test_an_adam_whose_parameters_fused_refuses_is_told_its_multi_tensor_form(logdir):
    # It said "use its fused implementation, torch.optim.Adam(params, ..., fused=True)", whose
    # first step raises for these parameters.
    entry = dominated_run(logdir, _complex(lambda p: torch.optim.Adam(p, lr=1e-3)))
    assert entry["fused_ok"] is False and entry["impl"] == ["for-loop"], entry
    f = _ta104(logdir)
    assert "fused=True" not in f.fix, f.fix
    assert f.fix.startswith("it ran the for-loop update: use its multi-tensor implementation, "
                            "torch.optim.Adam(params, ..., foreach=True) (its fused one, which "
                            "the run's torch refuses for its parameters), or compile the step"), f.fix


def test_refused_fused_and_already_multi_tensor_is_told_to_compile(logdir):
    entry = dominated_run(logdir, _complex(lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True)))
    assert entry["fused_ok"] is False and entry["impl"] == ["foreach"], entry
    f = _ta104(logdir)
    assert "fused=True" not in f.fix and "foreach=True" not in f.fix, f.fix
    assert f.fix.startswith("the update already runs multi-tensor (foreach), and the run's torch "
                            "refuses torch.optim.Adam's fused one for its parameters: compile "
                            "the step, tk.patch(optimizer, compile=True)"), f.fix


def test_an_adagrad_its_torch_refuses_fused_is_not_told_fused(logdir, adagrad_refuses_the_cpu):
    # The case that started it: torch 2.11's Adagrad on CUDA, advised fused=True.
    entry = dominated_run(logdir, lambda p: torch.optim.Adagrad(p, lr=1e-3))
    assert entry["fused_ok"] is False, entry
    f = _ta104(logdir)
    assert "fused=True" not in f.fix, f.fix
    assert "torch.optim.Adagrad(params, ..., foreach=True) (its fused one, which the run's " \
           "torch refuses for its parameters)" in f.fix, f.fix


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.Adagrad], ids=lambda c: c.__name__)
def test_an_accepted_fused_form_is_recorded_and_still_advised(logdir, cls):
    entry = dominated_run(logdir, lambda p: cls(p, lr=1e-3))
    assert entry["fused_ok"] is True and entry["impl"] == ["for-loop"], entry
    f = _ta104(logdir)
    assert f"use its fused implementation, torch.optim.{cls.__name__}(params, ..., fused=True)" \
        in f.fix, f.fix


class MyAdam(torch.optim.Adam):
    """A user's subclass of torch.optim.Adam: another module's, so told the general forms."""


def test_the_general_forms_do_not_claim_a_fused_one_every_stepped_optimizer_was_refused(logdir):
    entry = dominated_run(logdir, _complex(lambda p: MyAdam(p, lr=1e-3)))
    assert entry["module"] == __name__ and entry["fused_ok"] is False, entry
    f = _ta104(logdir)
    assert "fused=True" not in f.fix, f.fix
    # (its foreach=None is not torch.optim's to resolve: what it ran is not said)
    assert f.fix.startswith("use a multi-tensor implementation where the optimizer has one "
                            "(foreach=True; not a fused one: the run's MyAdam, which the run's "
                            "torch refuses for its parameters), or compile the step"), f.fix


def test_two_types_one_refused_are_told_which(logdir):
    # A GAN's generator (Adam, float) and critic (SGD, complex): the general forms name fused=True
    # for torch.optim's classes, and say the run's SGD is refused it.
    entries = gan_run(logdir, critic_dtype=torch.complex64)
    assert sorted((e["type"], e["fused_ok"]) for e in entries) == [("Adam", True),
                                                                  ("SGD", False)], entries
    fix = _optimizer_fix(Steps(load_run(logdir, logdir)))
    assert "(torch.optim.Adam, AdamW, SGD, Adagrad: fused=True; not for the run's SGD, which the " \
           "run's torch refuses for its parameters) or a multi-tensor one (foreach=True)" in fix, fix


def test_the_check_raising_leaves_the_key_out_and_the_close_intact(logdir, monkeypatch):
    # Asking torch only decides what is recorded: whatever it raises, the close writes everything
    # and the fix is the one a run recorded before fused_ok was gets.
    def raises(opt: Any) -> bool:
        raise RuntimeError("a torch whose optimizer this close does not foresee")

    monkeypatch.setattr(_optinfo, "_fused_twin_steps", raises)
    entry = dominated_run(logdir, lambda p: torch.optim.Adam(p, lr=1e-3))
    assert entry == {"type": "Adam", "module": "torch.optim.adam", "stepped": True,
                     "fused": None, "foreach": None, "impl": ["for-loop"]}, entry
    f = _ta104(logdir)
    assert "torch.optim.Adam(params, ..., fused=True)" in f.fix, f.fix


def test_a_profiler_recording_at_the_close_is_left_without_the_twins_ops(logdir):
    # A user's own torch.profiler around the session: the twin's step would land in its trace.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        entry = dominated_run(logdir, lambda p: torch.optim.Adam(p, lr=1e-3))
    assert "fused_ok" not in entry, entry
    assert not [e.name for e in prof.events() if "fused" in e.name], \
        sorted({e.name for e in prof.events() if "fused" in e.name})


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD,
                                 torch.optim.Adagrad], ids=lambda c: c.__name__)
def test_asking_leaves_the_optimizer_its_hooks_and_the_rng_alone(cls):
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = cls([p], lr=0.1, **({"momentum": 0.9} if cls is torch.optim.SGD else {}))
    p.grad = torch.randn_like(p)
    opt.step()
    before = (p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()},
              [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
              torch.get_rng_state())
    calls: List[Any] = []
    handle = register_optimizer_step_pre_hook(lambda *a: calls.append(a))
    try:
        assert fused_accepted(opt) == {"fused_ok": True}
    finally:
        handle.remove()
    assert calls == []
    assert torch.equal(p, before[0])
    assert opt.state[p].keys() == before[1].keys()
    assert all(torch.equal(opt.state[p][k], v) for k, v in before[1].items())
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == before[2]
    assert torch.equal(torch.get_rng_state(), before[3])


@pytest.mark.cuda
def test_a_cuda_adagrad_is_told_fused_as_its_torch_answers(logdir):
    # torch 2.11's Adagrad refuses fused on CUDA (its step raises), 2.13's and 2.14's take it:
    # the record is torch's own answer, and the fix follows it. A 4M-parameter update takes well
    # under TA104's 0.2 ms there, so the fix is read directly.
    p = torch.zeros(1, device="cuda")
    try:
        opt = torch.optim.Adagrad([p], lr=0.1, fused=True)
        p.grad = torch.zeros_like(p)
        opt.step()
        torch.cuda.synchronize()
        takes = True
    except RuntimeError:
        takes = False
    if torch.__version__.startswith("2.11."):
        assert takes is False
    entry = dominated_run(logdir, lambda p: torch.optim.Adagrad(p, lr=1e-3), device="cuda")
    assert entry["fused_ok"] is takes and entry["impl"] == ["foreach"], entry
    fix = _optimizer_fix(Steps(load_run(logdir, logdir)))
    if takes:
        assert "torch.optim.Adagrad(params, ..., fused=True)" in fix, fix
    else:
        assert "fused=True" not in fix and "foreach=True" not in fix, fix
        assert "refuses torch.optim.Adagrad's fused one" in fix and "compile=True" in fix, fix
    torch.cuda.synchronize()  # the close's twin left no fault behind
