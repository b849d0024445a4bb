"""What a patched optimizer's step(...) is given: a closure is timed, anything else passed on."""
from __future__ import annotations

import functools

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp


class _Teacher:
    """A callable object a custom step reads (a distillation optimizer's teacher): no closure."""

    temperature = 2.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.temperature


class _TeacherAware(torch.optim.SGD):
    def step(self, teacher=None):  # e.g. an optimizer that scales its lr by the teacher's
        self.seen = teacher
        for g in self.param_groups:
            g["lr"] = 0.1 / teacher.temperature
        return super().step()


def _backward(model: torch.nn.Module) -> None:
    x, y = next(iter(loader()))
    torch.nn.functional.cross_entropy(model(x), y).backward()


def test_a_callable_object_given_to_a_step_parameter_not_named_closure_is_passed_on(tmp_path):
    """It was wrapped in a timed closure: the step got a function (``teacher.temperature``:
    AttributeError), and inside tk.accumulate the gate called it with no arguments (TypeError)."""
    model = mlp()
    opt = tk.patch(_TeacherAware(model.parameters(), lr=0.1))
    teacher = _Teacher()
    with tk.session(logdir=tmp_path, system_metrics=False):
        _backward(model)
        opt.step(teacher)
        assert opt.seen is teacher
        with tk.accumulate(1, opt):
            opt.step(teacher)
        assert opt.seen is teacher
    got = scalars(tmp_path)
    assert len(got["trainkit/update_ms"]) == 2 and "trainkit/closure_ms" not in got


class _Loss:
    """A closure written as a class: torch calls it with no arguments."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self) -> torch.Tensor:
        x, y = next(iter(loader()))
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


class _OwnNames(torch.optim.SGD):
    def step(self, loss_fn=None):  # a custom name: what code writes as a closure is one
        return super().step(loss_fn)


@pytest.mark.parametrize("opt_class, closure", [
    (torch.optim.SGD, _Loss),  # torch's closure parameter: anything callable
    (torch.optim.SGD, lambda m: _Loss(m).__call__),
    (_OwnNames, lambda m: (lambda: _Loss(m)())),
    (_OwnNames, lambda m: functools.partial(_Loss.__call__, _Loss(m))),
], ids=["object", "method", "lambda-own-name", "partial-own-name"])
def test_closures_stay_closures(tmp_path, opt_class, closure):
    model = mlp()
    opt = tk.patch(opt_class(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False):
        loss = opt.step(closure(model))
        assert isinstance(loss, torch.Tensor)
        with tk.accumulate(1, opt):
            assert isinstance(opt.step(closure(model)), torch.Tensor)
    assert len(scalars(tmp_path)["trainkit/closure_ms"]) == 2
