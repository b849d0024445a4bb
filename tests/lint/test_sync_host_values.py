"""TK302 on values that are on the host already: a NumPy array's ``.tolist()``/``.item()`` (no
device to wait for), and a loss name rebound to a float by ``loss = loss.item()`` (reported once,
at the ``.item()``, not again where the float is formatted)."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import numpy as np
import numpy
import torch

def train(model, loader, optimizer):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        {line}
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        {after}
"""


def _found(line: str = "pass", after: str = "pass") -> list:
    src = textwrap.dedent(LOOP).replace("{line}", line).replace("{after}", after)
    return [(f.code, f.line) for f in lint_source(src)]


@pytest.mark.parametrize("line", [
    "keep = np.random.permutation(x.shape[0])[: x.shape[0] // 2].tolist()",
    "k = np.random.randint(0, 10, size=3).tolist()",
    "k = numpy.arange(4).sum().item()",
    "k = np.array([1, 2]).mean().item()",
])
def test_numpy_values_are_not_reported(line: str) -> None:
    assert _found(line) == []


@pytest.mark.parametrize("line", [
    "k = torch.from_numpy(np.arange(4)).cuda().sum().item()",
    "k = model(x).tolist()",
    "k = f(np.arange(4)).item()",
])
def test_tensor_values_are_still_reported(line: str) -> None:
    assert _found(line) == [("TK302", 9)]


@pytest.mark.parametrize("after", [
    'loss = loss.item()\n        print(f"loss {loss:.3f}")',
    "loss = loss.item()\n        total = float(loss)",
    'loss = float(loss.detach().item())\n        print(loss)',
])
def test_a_loss_rebound_to_a_float_is_reported_once(after: str) -> None:
    assert _found(after=after) == [("TK302", 14)]


def test_a_loss_printed_before_its_rebinding_is_still_reported() -> None:
    assert _found(after='print(loss)\n        loss = loss.item()') == [("TK302", 14), ("TK302", 15)]
