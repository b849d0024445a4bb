"""TA104 (the optimizer step dominates) on runs whose optimizer already ran its fused or
multi-tensor update: the session's close records the implementation asked for and the one that
ran (``trainkit/meta/optimizers``), so the fix never suggests what the run already used. It
said ``torch.optim.Adam(params, ..., fused=True)`` to a run of exactly that."""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

import trainkit as tk
from trainkit.profiling.analyzers.records import Steps, _optimizer_fix
from trainkit.profiling.runs import load_run
from trainkit.techniques import fused as fused_technique

from .conftest import dominated_run, gan_run


def _ta104(logdir: str):
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA104"]
    return f


@pytest.fixture(autouse=True)
def _fused_on_cpu():
    if "cpu" not in fused_technique._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")


def test_a_fused_adam_is_not_told_to_use_fused(logdir):
    entry = dominated_run(logdir, lambda p: torch.optim.Adam(p, lr=1e-3, fused=True))
    assert entry == {"type": "Adam", "module": "torch.optim.adam", "stepped": True, "fused": True,
                     "foreach": None,
                     "impl": ["fused"]}
    f = _ta104(logdir)  # the update still dominates: the finding stands, with what is left
    assert f.share >= 0.3
    assert "torch.optim.Adam(params, ..., fused=True)" not in f.fix, f.fix  # what it ran
    assert "already runs fused (torch.optim.Adam(..., fused=True))" in f.fix, f.fix
    assert "tk.accumulate(n, optimizer)" in f.fix and "larger batch" in f.fix, f.fix
    # compiling does not speed a fused update up: not offered as the way out
    assert "compile=True" not in f.fix and "compiled_step" not in f.fix, f.fix


def test_fused_by_the_ablations_technique_counts_as_fused(logdir):
    # An ablation's {"fused": True} turns it on at tk.patch (param_groups and defaults), not
    # in the user's constructor: the close records what the step ran with.
    entry = dominated_run(logdir, lambda p: torch.optim.AdamW(p, lr=1e-3),
                           override={"fused": True})
    assert entry["fused"] is True and entry["impl"] == ["fused"], entry
    f = _ta104(logdir)
    assert "already runs fused (torch.optim.AdamW(..., fused=True))" in f.fix, f.fix


def test_an_optimizer_on_its_multi_tensor_update_without_a_fused_one_is_told_to_compile(logdir):
    entry = dominated_run(logdir, lambda p: torch.optim.RMSprop(p, lr=1e-3, foreach=True))
    assert entry == {"type": "RMSprop", "module": "torch.optim.rmsprop", "stepped": True,
                     "foreach": True, "impl": ["foreach"]}
    f = _ta104(logdir)
    assert "foreach=True" not in f.fix, f.fix  # what it ran
    assert "already runs multi-tensor (foreach)" in f.fix and "no fused one" in f.fix, f.fix
    assert "tk.patch(optimizer, compile=True)" in f.fix, f.fix


@pytest.mark.parametrize("make, asked, ran", [
    (lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True), {"foreach": True, "fused": None},
     "the multi-tensor update (foreach)"),
    # torch's default (foreach=None) on the CPU is the for-loop: foreach only on CUDA
    (lambda p: torch.optim.Adam(p, lr=1e-3), {"foreach": None, "fused": None},
     "the for-loop update"),
])
def test_an_adam_not_fused_is_told_to_fuse_and_what_it_ran(logdir, make, asked, ran):
    entry = dominated_run(logdir, make)
    assert {k: entry[k] for k in asked} == asked
    f = _ta104(logdir)
    assert f.fix.startswith(f"it ran {ran}: use its fused implementation, "
                            f"torch.optim.Adam(params, ..., fused=True), or compile"), f.fix


def test_an_optimizer_on_its_for_loop_is_still_told_its_multi_tensor_form(logdir):
    entry = dominated_run(logdir, lambda p: torch.optim.RMSprop(p, lr=1e-3))
    assert entry["foreach"] is None and entry["impl"] == ["for-loop"], entry
    f = _ta104(logdir)
    assert f.fix.startswith("it ran the for-loop update: use its multi-tensor implementation, "
                            "torch.optim.RMSprop(params, ..., foreach=True) (it has no fused "
                            "one)"), f.fix


@pytest.mark.cuda
def test_foreach_by_default_on_cuda_is_recorded_as_ran(logdir):
    # foreach=None is torch's choice at each step: the multi-tensor update for CUDA parameters.
    # A 4M-parameter update takes well under TA104's 0.2 ms there, so the fix is read directly.
    entry = dominated_run(logdir, lambda p: torch.optim.RMSprop(p, lr=1e-3), device="cuda")
    assert entry["foreach"] is None and entry["impl"] == ["foreach"], entry
    fix = _optimizer_fix(Steps(load_run(logdir, logdir)))
    assert "foreach=True" not in fix and "compile=True" in fix, fix


def test_two_optimizer_types_both_fused_are_not_told_to_fuse(logdir):
    # A GAN's generator (Adam) and discriminator (SGD), both fused=True: with two types the
    # recorded implementations were ignored, and the fix said "a fused implementation ...
    # fused=True".
    entries = gan_run(logdir, fused=True)
    assert sorted((e["type"], e["impl"]) for e in entries) == [("Adam", ["fused"]),
                                                              ("SGD", ["fused"])]
    fix = _optimizer_fix(Steps(load_run(logdir, logdir)))
    assert fix.startswith("the update already runs fused (fused=True)"), fix


class Adam(torch.optim.Optimizer):
    """A third party's Adam (this module's, not torch.optim's): a foreach option, no fused one."""

    def __init__(self, params: Any, lr: float = 1e-3, foreach: Optional[bool] = None) -> None:
        super().__init__(params, dict(lr=lr, foreach=foreach))

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            torch._foreach_add_(params, [p.grad for p in params], alpha=-group["lr"])


def test_another_librarys_adam_is_not_told_torch_optims_forms(logdir):
    # Recorded by its name alone, it was read as torch.optim.Adam from a torch without fused:
    # "the update already runs multi-tensor (foreach), and torch.optim.Adam has no fused one".
    entry = dominated_run(logdir, lambda p: Adam(p, foreach=True))
    assert entry["module"] == __name__ and entry["impl"] == ["foreach"], entry
    fix = _optimizer_fix(Steps(load_run(logdir, logdir)))
    assert "torch.optim.Adam has no fused one" not in fix and "foreach=True" not in fix, fix
    assert fix.startswith("it ran the multi-tensor update (foreach): use a fused implementation "
                          "where the optimizer has one"), fix


def test_torchs_default_rule_raising_leaves_impl_out_and_the_close_goes_on(logdir, monkeypatch):
    # torch's private rule, on a group a later torch does not foresee, raising at the close
    # failed the user's `with` block after the run; it only decides what is recorded.
    import torch.optim.optimizer as torch_optimizer

    def refuses(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a group this torch's rule does not take")

    monkeypatch.setattr(torch_optimizer, "_default_to_fused_or_foreach", refuses)
    entry = dominated_run(logdir, lambda p: torch.optim.RMSprop(p, lr=1e-3))
    assert entry["foreach"] is None and "impl" not in entry, entry
