"""A held ``zero_grad()`` inside a ``tk.accumulate`` window where gradients were added to the
optimizer's parameters after its last ``step()`` call: PyTorch's DCGAN tutorial order, whose
generator loss backpropagates through the discriminator (``errG.backward()``) and whose next
``netD.zero_grad()`` clears what it left there. Held, those gradients stayed in the
discriminator's window sum (0.1 off the big batch here), and nothing was said."""
from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch

import trainkit as tk

F = torch.nn.functional


def _gan(seed: int = 0):
    torch.manual_seed(seed)
    g, d = torch.nn.Linear(2, 3).double(), torch.nn.Linear(3, 1).double()
    data = [(torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))
            for _ in range(4)]
    return g, d, data


def _loop(g, d, data, *, freeze: bool, model: bool):
    og = torch.optim.SGD(g.parameters(), lr=0.1)
    od = torch.optim.SGD(d.parameters(), lr=0.1)
    with tk.accumulate(2, od, model=d if model else None):
        for real, z in data:
            (d.zero_grad if model else od.zero_grad)()
            (d(g(z).detach()).mean() - d(real).mean()).backward()
            od.step()
            g.zero_grad()
            with contextlib.ExitStack() as stack:
                if freeze:  # the generator's backward leaves the discriminator's grads alone
                    d.requires_grad_(False)
                    stack.callback(d.requires_grad_, True)
                (-d(g(z)).mean()).backward()
            og.step()


@pytest.mark.parametrize("model", [True, False])
def test_gradients_added_after_the_step_call_are_said_at_the_held_zero_grad(model):
    g, d, data = _gan()
    with pytest.warns(RuntimeWarning, match=r"added to its parameters since its last "
                                            r"optimizer\.step\(\).*requires_grad_\(False\)"):
        _loop(g, d, data, freeze=False, model=model)


def test_none_added_none_said_and_the_frozen_loop_equals_the_big_batch():
    g, d, data = _gan()
    g0, d0 = copy.deepcopy(g), copy.deepcopy(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loop(g, d, data, freeze=True, model=True)
    # The oracle: the discriminator's window of two micro-batches as one batch of both.
    og = torch.optim.SGD(g0.parameters(), lr=0.1)
    od = torch.optim.SGD(d0.parameters(), lr=0.1)
    for i, (real, z) in enumerate(data):
        if i % 2 == 0:
            od.zero_grad()
        ((d0(g0(z).detach()).mean() - d0(real).mean()) / 2).backward()
        saved = [p.grad.clone() for p in d0.parameters()]
        if i % 2 == 1:
            od.step()
        g.zero_grad()
        g0.zero_grad()
        (-d0(g0(z)).mean()).backward()
        og.step()
        for p, s in zip(d0.parameters(), saved):  # the generator's pass leaves D's sum alone
            p.grad = s
    for a, b in zip([*g.parameters(), *d.parameters()], [*g0.parameters(), *d0.parameters()]):
        assert torch.allclose(a, b, rtol=0, atol=1e-14)
