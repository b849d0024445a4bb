"""``@tk.compiled_step`` on a function that steps accelerate's wrapper of an optimizer: the
optimizer compiled for is the one it wraps, as ``tk.patch`` and ``tk.compiled_step(optimizer)``
take it (trainkit._wrapped).

Before the fix the first call raised "'Wrapping' object has no attribute
'_optimizer_load_state_dict_pre_hooks'": the wrapper, which never runs ``Optimizer.__init__``,
was taken for the optimizer. With the inner optimizer patched, each call of the function counted
as a step (each micro-batch) where the wrapper steps it at real steps only; and the patched
step, called ``step(None)`` by the wrapper, ran eagerly, None taken for a closure.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

import trainkit as tk
from tests.conftest import scalars
from tests.techniques._dynamo import fresh_dynamo  # noqa: F401 - a fresh dynamo per test
from tests.techniques.test_compiled_step_optimizer_form import Wrapping

CALLS, EVERY = 6, 2  # three real steps


def _train(tmp_path: Any, *, compiled: bool, patched: bool) -> Tuple[List[torch.Tensor], Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    wrapped = Wrapping(inner, every=EVERY)
    if patched:
        tk.patch(wrapped)

    def step() -> None:
        wrapped.step()

    if compiled:
        step = tk.compiled_step(step)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(CALLS):
            model(x).pow(2).mean().backward()  # gradients add up over the wrapper's window
            step()
            if wrapped.calls % EVERY == 0:
                inner.zero_grad()
    return [p.detach().clone() for p in model.parameters()], step, inner


def _assert_close(got: List[torch.Tensor], ref: List[torch.Tensor]) -> None:
    for a, b in zip(got, ref):
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < 1e-5, rel


def test_the_decorator_compiles_for_the_optimizer_a_wrapper_holds(tmp_path: Any) -> None:
    ref, _, _ = _train(tmp_path / "eager", compiled=False, patched=False)
    got, step, inner = _train(tmp_path / "compiled", compiled=True, patched=False)
    _assert_close(got, ref)
    c = step.trainkit_compiled
    assert c.calls == CALLS and c.recompiles == 0 and c.compile_seconds > 0
    assert "_trainkit_keeps_state" in inner.__dict__  # its hooks on the inner one


def test_a_patched_wrapped_optimizer_counts_real_steps_only_and_compiles(tmp_path: Any) -> None:
    ref, _, _ = _train(tmp_path / "eager", compiled=False, patched=True)
    got, _, _ = _train(tmp_path / "compiled", compiled=True, patched=True)
    _assert_close(got, ref)
    tags = scalars(tmp_path / "compiled")
    assert [st for st, _ in tags["trainkit/update_ms"]] == [1, 2, 3]  # not one per call
    assert sum(v for _, v in tags["trainkit/compile/seconds"]) > 0  # not eager: step(None)
