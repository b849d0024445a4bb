"""TK102 and gradients divided by hand before the step (``p.grad /= n``, ``p.grad.div_(n)``,
``torch._foreach_div_(grads, n)``): the loss is not divided, yet the step sees the window's mean
gradient, as the big batch would. TK102 said "never divided: the update is n times too large", an
error, about a correct loop (found on a hand-written reference for a HF model's accumulation)."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import torch
def train(model, loader, optimizer, scheduler, accum):
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        if (step + 1) % accum == 0:
{divide}
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
"""

DIVIDED = {
    "augassign": """
            for p in model.parameters():
                if p.grad is not None:
                    p.grad /= accum""",
    "div_": """
            for p in model.parameters():
                p.grad.div_(accum)""",
    "data_div_": """
            for p in model.parameters():
                p.grad.data.div_(accum)""",
    "mul_reciprocal": """
            for p in model.parameters():
                p.grad.mul_(1.0 / accum)""",
    "assign": """
            for p in model.parameters():
                p.grad = p.grad / accum""",
    "foreach": """
            torch._foreach_div_([p.grad for p in model.parameters()], accum)""",
}


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _codes(divide: str) -> list:
    src = textwrap.dedent(LOOP).replace("{divide}", textwrap.dedent(divide).strip("\n")
                                        .replace("\n", "\n            ").join(["            ", ""]))
    return [f.code for f in lint_source(src, ignore="TK112")]


@pytest.mark.parametrize("how", sorted(DIVIDED))
def test_gradients_divided_before_the_step_are_no_tk102(how: str) -> None:
    assert _codes(DIVIDED[how]) == []


@pytest.mark.parametrize("divide", [
    "            pass",
    # a clip written by hand multiplies the gradients too, by no count of micro-batches
    """
            for p in model.parameters():
                p.grad.mul_(clip_coef)""",
])
def test_no_division_of_the_gradients_is_still_tk102(divide: str) -> None:
    assert _codes(divide) == ["TK102"]
