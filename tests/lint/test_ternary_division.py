"""A loss divided in a conditional expression (``loss = loss / accum if accum > 1 else loss``)
is divided whenever accumulation is on, as the ``if accum > 1: loss /= accum`` block form is.
TK102 called it "never divided" (an error about a correct loop), and TK101 missed the same
ternary written after the backward."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

BEFORE = """
def train(model, loader, optimizer, accum):
    for epoch in range(3):
        for i, batch in enumerate(loader):
            loss = model(batch)
            {divide}
            loss.backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
"""

AFTER = """
def train(model, loader, optimizer, accum):
    for epoch in range(3):
        for i, batch in enumerate(loader):
            loss = model(batch)
            loss.backward()
            {divide}
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
"""

TERNARIES = [
    "loss = loss / accum if accum > 1 else loss",
    "loss = loss if accum == 1 else loss / accum",
    "loss = (loss / accum) if accum > 1 else loss",
    "loss = loss.div(accum) if accum > 1 else loss",
]


def _codes(template: str, divide: str) -> list:
    return [f.code for f in lint_source(textwrap.dedent(template).replace("{divide}", divide))]


# The step also runs on the last batch, so TK110 (a short last window divided by `accum`) is
# right, and it finds the divisor in the dividing branch.
@pytest.mark.parametrize("divide", TERNARIES)
def test_ternary_division_before_backward_is_no_tk102(divide: str) -> None:
    assert _codes(BEFORE, divide) == ["TK110"]


@pytest.mark.parametrize("divide", TERNARIES)
def test_ternary_division_after_backward_is_tk101(divide: str) -> None:
    assert _codes(AFTER, divide) == ["TK101"]


def test_inline_ternary_in_the_backward_operand_is_no_tk102() -> None:
    src = textwrap.dedent(BEFORE).replace("{divide}", "pass").replace(
        "loss.backward()", "(loss / accum if accum > 1 else loss).backward()")
    assert [f.code for f in lint_source(src)] == ["TK110"]


def test_ternary_without_a_division_is_still_tk102() -> None:
    assert _codes(BEFORE, "loss = loss * 2 if accum > 1 else loss") == ["TK102"]


def test_ternary_division_in_a_plain_loop_has_no_finding() -> None:
    src = """
def train(model, loader, optimizer, accum):
    for i, batch in enumerate(loader):
        loss = model(batch)
        loss = loss / accum if accum > 1 else loss
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    if (i + 1) % accum != 0:
        optimizer.step()
        optimizer.zero_grad()
"""
    assert [f.code for f in lint_source(src)] == []
