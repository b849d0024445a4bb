"""Copies of an optimizer a compiled step has used are the unpatched one's copies.

The first compiled step gives the optimizer ``load_state_dict`` hooks and a flag
(techniques._state_keeper: a checkpoint loaded mid-run copies into the state tensors the compiled
step guards on). A class whose ``__getstate__`` hands over its whole ``__dict__`` handed them to
copies: before the fix ``pickle.dumps`` failed ("Can't pickle local object
'keep_state_tensors.<locals>.pre'") and ``copy.deepcopy`` kept the flag and both hooks, under
``tk.patch(opt, compile=True)`` and ``@tk.compiled_step`` alike. A plain torch optimizer hands
over its groups, defaults and state only, and stays so.
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable, List

import pytest
import torch

import trainkit as tk
from tests.helpers import compiled
from tests.techniques._dynamo import fresh_dynamo  # noqa: F401 - a fresh dynamo per test
from tests.techniques.test_fused_copies import DictStateAdam

COPIERS = {"deepcopy": copy.deepcopy, "pickle": lambda o: pickle.loads(pickle.dumps(o))}
HOOKS = ("_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")


def _opt(cls: type) -> Any:
    torch.manual_seed(0)
    return cls(torch.nn.Linear(4, 3).parameters(), lr=0.05)


def _step(opt: Any, step: Callable[[], Any], i: int) -> None:
    for g in opt.param_groups:
        for p in g["params"]:
            p.grad = torch.full_like(p, 0.1 * (i + 1))
    step()


def _params(opt: Any) -> List[torch.Tensor]:
    return [p.detach().clone() for g in opt.param_groups for p in g["params"]]


def _assert_like(dup: Any, want: Any) -> None:
    assert sorted(dup.__dict__) == sorted(want.__dict__)  # no flag, patch or getstate of ours
    for name in HOOKS:
        assert len(getattr(dup, name)) == len(getattr(want, name)) == 0
    for a, b in zip(_params(dup), _params(want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # compiled vs eager


@pytest.mark.parametrize("form", ["patch", "decorator"])
@pytest.mark.parametrize("cls", [torch.optim.Adam, DictStateAdam], ids=lambda c: c.__name__)
def test_a_copy_of_a_compiled_optimizer_is_the_unpatched_ones_copy(cls: type, form: str) -> None:
    plain, opt = _opt(cls), _opt(cls)
    step = compiled(opt, form)
    _step(plain, plain.step, 0)
    _step(opt, step, 0)
    assert "_trainkit_keeps_state" in opt.__dict__  # the keeper is at work
    for how, copier in COPIERS.items():
        dup, want = copier(opt), copier(plain)
        _assert_like(dup, want)
        _step(dup, dup.step, 1)  # the copy steps eagerly, as the unpatched one's copy
        _step(want, want.step, 1)
        _assert_like(dup, want)
    # the original keeps its hooks, and its compiled step goes on
    assert all(len(getattr(opt, name)) == 1 for name in HOOKS)
    _step(opt, step, 1)
    if form == "patch":
        tk.unpatch(opt)
        assert not any(k.startswith(("_trainkit", "__getstate__")) for k in opt.__dict__)


def test_copies_stay_clean_while_the_patch_and_a_compiled_step_come_and_go() -> None:
    """The patch's guard and the state keeper's are one ``__getstate__``: unpatched while a
    ``@tk.compiled_step`` function still uses the optimizer, its copies still leave the keeper's
    hooks out; the keeper released, no ``__getstate__`` of ours is left."""
    plain, opt = _opt(DictStateAdam), _opt(DictStateAdam)
    tk.patch(opt)
    step = compiled(opt, "decorator")
    _step(plain, plain.step, 0)
    _step(opt, step, 0)
    tk.unpatch(opt)
    assert "_trainkit_keeps_state" in opt.__dict__ and "__getstate__" in opt.__dict__
    _assert_like(pickle.loads(pickle.dumps(opt)), copy.deepcopy(plain))
    step.trainkit_compiled.release(opt)
    assert "_trainkit_keeps_state" not in opt.__dict__ and "__getstate__" not in opt.__dict__
    _assert_like(copy.deepcopy(opt), copy.deepcopy(plain))
