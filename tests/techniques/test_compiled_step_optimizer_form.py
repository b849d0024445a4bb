"""``tk.compiled_step(optimizer)`` as ``tk.patch(optimizer, compile=True)``: compiled before the
patch changes anything, and asked again, its options checked.

Before the fix it patched first and compiled after: a torch that cannot compile (torch.compile's
own check, e.g. "not supported on Python 3.15+") raised with the optimizer patched but not
compiled. And asked again with another ``mode`` it returned the optimizer compiled with the old
one, saying nothing. No step is taken here: ``torch.compile`` compiles at the first call.
"""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from trainkit.patch import optimizer_patch


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_a_torch_that_cannot_compile_leaves_the_optimizer_as_it_was(monkeypatch) -> None:
    def cannot(*args, **kwargs):  # what torch.compile raises where dynamo is not supported
        raise RuntimeError("torch.compile is not supported on Python 3.15+")

    monkeypatch.setattr(torch, "compile", cannot)
    opt = _opt()
    with pytest.raises(RuntimeError, match="not supported"):
        tk.compiled_step(opt)
    assert optimizer_patch(opt) is None and "step" not in opt.__dict__


def test_asking_again_with_the_same_options_returns_it_with_others_raises() -> None:
    opt = _opt()
    assert tk.compiled_step(opt) is opt
    compiled = optimizer_patch(opt).core.trainkit_compiled
    assert tk.compiled_step(opt, mode="default") is opt  # None is torch.compile's "default"
    assert tk.patch(opt, compile=True) is opt
    with pytest.raises(ValueError) as e:
        tk.compiled_step(opt, mode="max-autotune-no-cudagraphs")
    msg = str(e.value)
    assert "mode='max-autotune-no-cudagraphs'" in msg and "mode=None" in msg
    assert "tk.unpatch(optimizer); tk.compiled_step(optimizer, " \
           "mode='max-autotune-no-cudagraphs')" in msg
    with pytest.raises(ValueError, match="fullgraph=False"):
        tk.compiled_step(opt, fullgraph=True)
    assert optimizer_patch(opt).core.trainkit_compiled is compiled  # unchanged
    tk.unpatch(opt)
    tk.compiled_step(opt, mode="max-autotune-no-cudagraphs")  # the fix the message names
    assert optimizer_patch(opt).core.trainkit_compiled.mode == "max-autotune-no-cudagraphs"
