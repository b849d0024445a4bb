"""The compiled step's tensor ``lr`` follows torch's own foreach default (``foreach=None``).

``tk.compiled_step`` holds ``lr`` as a tensor only where the step takes one; whether it does
depends on the update torch picks for ``foreach=None``. trainkit guessed it from the first
parameter being on CUDA; torch checks every parameter (any device with foreach kernels), and
Adam/AdamW keep their for-loop for a tensor ``lr`` without ``capturable``, which takes it. The
guess missed that exception: an Adam on CUDA whose state existed before its first compiled step
(a resumed checkpoint, or eager steps first) kept a float ``lr``, and every new value of its LR
scheduler was a recompile (a warning, then eager steps past dynamo's recompile limit).

That shows only on a GPU (the CPU has no foreach default); on the CPU, the device list torch's
rule reads is given the CPU, so that torch's own rule and steps, eager and compiled, pick the
multi-tensor update here as on CUDA.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, List

import pytest
import torch

import trainkit as tk
from tests.helpers import fail_on_runtime_warnings
from trainkit.techniques._hyper import _takes_tensor

STEPS = 5
_optimizer = importlib.import_module("torch.optim.optimizer")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cpu_has_foreach(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _optimizer._get_foreach_kernels_supported_devices
    monkeypatch.setattr(_optimizer, "_get_foreach_kernels_supported_devices",
                        lambda: [*real(), "cpu"])


def _run(device: str, compiled: bool) -> tuple:
    """An Adam stepped once eagerly (its state exists), then STEPS steps under LinearLR."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(device)
    x = torch.randn(16, 8).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def backward() -> None:
        model(x).pow(2).mean().backward()

    backward()
    opt.step()
    opt.zero_grad()
    takes = _takes_tensor(opt, opt.param_groups[0], "lr")
    if compiled:
        tk.patch(opt, compile=True)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=STEPS)
    for _ in range(STEPS):
        backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    params: List[torch.Tensor] = [p.detach().clone() for p in model.parameters()]
    recompiles = opt.__dict__["_trainkit_patch"].core.trainkit_compiled.recompiles \
        if compiled else 0
    return takes, params, recompiles


@pytest.mark.slow
def test_adam_with_state_takes_a_tensor_lr_where_torch_picks_foreach(cpu_has_foreach: None) -> None:
    """torch's rule says foreach; Adam's exception makes it the for-loop for a tensor lr, and
    the compiled step runs it with no recompile, equal to eager."""
    p = torch.nn.Parameter(torch.zeros(2))
    assert _optimizer._default_to_fused_or_foreach([p], False) == (False, True)
    with warnings.catch_warnings():
        fail_on_runtime_warnings()  # no "late recompile" warning
        takes, got, recompiles = _run("cpu", compiled=True)
    _, ref, _ = _run("cpu", compiled=False)
    assert takes is True and recompiles == 0
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_the_decision_is_torchs_rule_with_adams_exception(cpu_has_foreach: None) -> None:
    """Where torch's rule picks foreach: Adam takes a tensor lr (its for-loop); its betas only
    with that lr a tensor; a group torch's rule keeps on the for-loop (differing parameter
    types) takes it whatever the first parameter is."""
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    opt = torch.optim.Adam([p], lr=0.01)
    opt.step()  # state exists: dynamo will not set capturable
    group = opt.param_groups[0]
    assert _takes_tensor(opt, group, "lr") is True
    assert _takes_tensor(opt, group, "betas") is False  # float lr: foreach, which refuses them
    group["betas"] = (torch.tensor(0.9), torch.tensor(0.999))
    # torch's own answer (the first parameter's device said: the for-loop); torch 2.3 has no
    # check of its own, its foreach kernel refuses the 0-d tensor instead
    with pytest.raises((ValueError, RuntimeError),
                       match="beta1 as a Tensor is not supported|Expected packed scalar Tensor"):
        opt.step()
    group["lr"] = torch.tensor(0.01)
    assert _takes_tensor(opt, group, "betas") is True  # tensor lr: the for-loop
    opt.step()
    group["lr"], group["betas"] = 0.01, (0.9, 0.999)

    class Odd(torch.nn.Parameter):  # not one of torch's foreach types
        pass

    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2)), Odd(torch.zeros(2))], lr=0.1,
                          momentum=0.9)
    for q in sgd.param_groups[0]["params"]:
        q.grad = torch.ones(2)
    sgd.step()
    assert _optimizer._default_to_fused_or_foreach(sgd.param_groups[0]["params"], False)[1] is False
    assert _takes_tensor(sgd, sgd.param_groups[0], "lr") is True


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_adam_resumed_with_state_compiles_once_under_a_scheduler() -> None:
    """Before the fix: lr stayed a float (first parameter on CUDA -> foreach -> state exists ->
    no tensor), and each LinearLR value was a recompile after warm-up."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with warnings.catch_warnings():
        fail_on_runtime_warnings()
        takes, got, recompiles = _run("cuda", compiled=True)
    _, ref, _ = _run("cuda", compiled=False)
    assert takes is True and recompiles == 0
    for a, b in zip(got, ref):
        # a lr not applied, or stale after a recompile, is 1e-2 and more apart
        assert ((a - b).norm() / b.norm()).item() < 1e-4
