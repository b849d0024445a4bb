"""Copies of an optimizer whose ``fused`` the ablation switched are the unpatched one's copies.

``copy.deepcopy`` and ``pickle`` take what ``__getstate__`` hands over: the live groups, defaults
and state. Before the fix a copy of an optimizer switched to fused was fused itself (``fused=True``
in its groups and defaults, its steps float32 as fused state keeps them) with no patch to undo
it: a model-averaging copy, or a pickled trainer resumed later, ran fused. The default dtype is
float64 here, where the for-loop update keeps its steps in float64: the place tells them apart.
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable, List

import pytest
import torch

import trainkit as tk
from trainkit import switches

from ._tiny import fused_float64, tiny_model as _model

COPIERS = {"deepcopy": copy.deepcopy, "pickle": lambda o: pickle.loads(pickle.dumps(o))}


class DictStateAdam(torch.optim.Adam):
    """A class whose ``__getstate__`` hands over its whole ``__dict__`` (hooks, flags and all)."""

    def __getstate__(self) -> Any:
        return self.__dict__


float64 = pytest.fixture(autouse=True)(fused_float64)


def _train(opt: Any, steps: int) -> List[torch.Tensor]:
    params = [p for g in opt.param_groups for p in g["params"]]
    for i in range(steps):
        for p in params:
            p.grad = torch.full_like(p, 0.1 * (i + 1))
        opt.step()
    return [p.detach().clone() for p in params]


def _trained(cls: type, switch: bool) -> Any:
    opt = cls(_model().parameters(), lr=0.05)
    _train(opt, 2)
    if switch:
        with switches.overrides({"fused": True}):
            tk.patch(opt)
        assert opt.param_groups[0]["fused"] is True
    return opt


def _seen(opt: Any) -> Any:
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    steps = {(v["step"].dtype, float(v["step"])) for v in opt.state.values()}
    return groups, opt.defaults, steps


@pytest.mark.parametrize("how", sorted(COPIERS))
@pytest.mark.parametrize("cls", [torch.optim.Adam, DictStateAdam], ids=lambda c: c.__name__)
def test_a_copy_of_a_switched_optimizer_is_the_unpatched_ones_copy(
        how: str, cls: type) -> None:
    copier: Callable[[Any], Any] = COPIERS[how]
    plain, opt = _trained(cls, False), _trained(cls, True)
    live = [opt.state[p]["step"] for g in opt.param_groups for p in g["params"]]
    want, dup = copier(plain), copier(opt)
    assert _seen(dup) == _seen(want)  # before: fused=True in both, float32 steps
    assert {dt for dt, _ in _seen(want)[2]} == {torch.float64}
    assert sorted(dup.__dict__) == sorted(want.__dict__)  # no flag, patch or getstate of ours
    # the original is left switched, its steps the same tensors
    assert opt.param_groups[0]["fused"] is True and opt.defaults["fused"] is True
    assert [opt.state[p]["step"] for g in opt.param_groups for p in g["params"]] == live
    for a, b in zip(_train(dup, 2), _train(want, 2)):  # the copy runs the unfused update
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert _seen(dup) == _seen(want)
    tk.unpatch(opt)


def test_a_copy_carries_none_of_the_switchs_hooks() -> None:
    """A class handing over its ``__dict__`` handed over the switch's ``load_state_dict`` hook:
    a checkpoint loaded into the copy switched it to fused, and ``_step_supports_amp_scaling``
    had GradScaler leave unscaling to a kernel the copy did not run."""
    plain, opt = _trained(DictStateAdam, False), _trained(DictStateAdam, True)
    dup = copy.deepcopy(opt)
    assert "_step_supports_amp_scaling" not in dup.__dict__
    assert len(dup._optimizer_load_state_dict_post_hooks) == 0
    assert len(dup._optimizer_state_dict_post_hooks) == 0
    dup.load_state_dict(plain.state_dict())
    assert dup.param_groups[0]["fused"] is None
    assert {v["step"].dtype for v in dup.state.values()} == {torch.float64}
    assert len(opt._optimizer_load_state_dict_post_hooks) == 1  # the original keeps its own
    tk.unpatch(opt)
    assert opt.param_groups[0]["fused"] is None and "__getstate__" not in opt.__dict__


def test_a_shallow_copy_of_a_switched_optimizer_has_its_own_values_in_groups_of_its_own() -> None:
    """``copy.copy`` of an unpatched optimizer shares its groups, defaults and state. Of a
    switched one it gets groups and defaults of its own, with their own values, as ``pickle``
    and ``deepcopy`` do (trainkit.techniques._fused_switch says why), and shares the parameters
    and the moments; without the guard it shared the switched groups: fused, with no patch."""
    plain, opt = _trained(torch.optim.Adam, False), _trained(torch.optim.Adam, True)
    want, dup = copy.copy(plain), copy.copy(opt)
    assert want.param_groups is plain.param_groups and want.state is plain.state  # torch's
    assert dup.param_groups is not opt.param_groups and _seen(dup) == _seen(want)
    p = opt.param_groups[0]["params"][0]
    assert dup.param_groups[0]["params"][0] is p
    assert dup.state[p]["exp_avg"] is opt.state[p]["exp_avg"]
    assert opt.param_groups[0]["fused"] is True and opt.defaults["fused"] is True
    tk.unpatch(opt)
