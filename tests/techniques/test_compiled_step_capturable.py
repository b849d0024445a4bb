"""A compiled step leaves each param group's ``capturable`` as its user set it.

torch 2.3's dynamo sets ``capturable=True`` on every group it traces, the CPU's too, and left it
there: after a compiled step ``tk.unpatch(opt); opt.step()``, the eager step of a
``copy.deepcopy``/pickled copy, and that of a plain optimizer loaded from its ``state_dict`` (a
checkpoint) raised on the CPU ("If capturable=True, params and state_steps must be CUDA or XLA
tensors"), and with ``@tk.compiled_step`` an eager ``opt.step()`` between compiled calls too.
torch 2.4+ leaves a CPU group's flag alone; there these tests hold the same contract.
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, List

import pytest
import torch

import trainkit as tk
from tests.helpers import compiled
from tests.techniques._dynamo import fresh_dynamo  # noqa: F401 - a fresh dynamo per test

STEPS = 4


def _pair() -> List[Any]:
    """Two equal Adams over two groups each: the first steps eagerly, the second compiled."""
    opts = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        opts.append(torch.optim.Adam([{"params": model[0].parameters()},
                                      {"params": model[1].parameters(), "lr": 0.02}], lr=0.05))
    return opts


def _grads(opt: Any, i: int) -> None:
    for g in opt.param_groups:
        for p in g["params"]:
            p.grad = 0.1 * (i + 1) * torch.linspace(1, 2, p.numel()).view_as(p)


def _assert_same(a: Any, b: Any) -> None:
    pa = [p for g in a.param_groups for p in g["params"]]
    pb = [p for g in b.param_groups for p in g["params"]]
    for x, y in zip(pa, pb):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)  # compiled vs eager: float32 sums


def _compiled_object(opt: Any, step: Any) -> Any:
    from trainkit.patch import optimizer_patch

    p = optimizer_patch(opt)
    return getattr(step, "trainkit_compiled", None) or p.core.trainkit_compiled


@pytest.mark.parametrize("form", ["patch", "decorator"])
def test_capturable_stays_the_users_and_every_eager_step_after_a_compiled_one_works(
        form: str, tmp_path: Any) -> None:
    plain, opt = _pair()
    step = compiled(opt, form)
    for i in range(STEPS):
        _grads(plain, i)
        plain.step()
        _grads(opt, i)
        step()
        assert [g["capturable"] for g in opt.param_groups] == [False, False]
    _assert_same(opt, plain)
    assert _compiled_object(opt, step).recompiles == 0  # the flag set for each call: no guard fails

    # its state_dict, saved and loaded into a plain optimizer (a resume), steps eagerly
    assert [g["capturable"] for g in opt.state_dict()["param_groups"]] == [False, False]
    torch.save(opt.state_dict(), tmp_path / "ckpt.pt")
    resumed, want = _pair()
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    want.load_state_dict(copy.deepcopy(plain.state_dict()))  # (loaded, it shares the tensors)
    for o in (resumed, want):
        _grads(o, STEPS)
        o.step()
    _assert_same(resumed, want)

    # its copies step eagerly, as the uncompiled one's copies
    for copier in (copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
        dup, dup_want = copier(opt), copier(plain)
        for o in (dup, dup_want):
            _grads(o, STEPS)
            o.step()
        _assert_same(dup, dup_want)

    # and so does the optimizer itself: unpatched, or outside the decorated function
    if form == "patch":
        tk.unpatch(opt)
    for o in (opt, plain):
        _grads(o, STEPS)
        o.step()
    _assert_same(opt, plain)
    if form == "decorator":  # and the compiled step goes on after an eager one
        for o, s in ((opt, step), (plain, plain.step)):
            _grads(o, STEPS + 1)
            s()
        _assert_same(opt, plain)
        assert step.trainkit_compiled.recompiles == 0


def test_a_group_without_capturable_is_left_without_it() -> None:
    """SGD has no ``capturable``: none is added to its groups (dynamo sets it only where the key
    is, and so does trainkit around the call)."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(torch.nn.Linear(4, 3).parameters(), lr=0.1, momentum=0.9)
    tk.compiled_step(opt)
    for i in range(2):
        _grads(opt, i)
        opt.step()
    assert "capturable" not in opt.param_groups[0]


def test_only_groups_off_cuda_get_their_capturable_back() -> None:
    """On torch < 2.4 a group's flag is set for each compiled call and put back after it; a group
    on CUDA keeps what dynamo set (it works eagerly there, as newer torch leaves it), and a group
    without the key stays without it. (Called directly: the same on every torch.)"""
    from trainkit.techniques._capturable import put_back, turn_on

    torch.manual_seed(0)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    held: List[Any] = []
    turn_on(opt, held)
    assert opt.param_groups[0]["capturable"] is True and len(held) == 1
    put_back(held)
    assert opt.param_groups[0]["capturable"] is False and not held
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    turn_on(sgd, held)
    assert "capturable" not in sgd.param_groups[0] and not held


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_groups_capturable_is_left_to_dynamo() -> None:
    from trainkit.techniques._capturable import turn_on

    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, device="cuda"))], lr=0.1)
    held: List[Any] = []
    turn_on(opt, held)
    assert opt.param_groups[0]["capturable"] is False and not held
