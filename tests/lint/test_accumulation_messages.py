"""What the TK1xx messages say when two accumulation mistakes meet in one loop.

Each message must be true of the loop as written and its fix must not make things
worse on its own: TK102's next to TK103's wiping ``zero_grad()``, TK108's with and
without a division of the loss.
"""
from __future__ import annotations

import textwrap
from typing import Dict

import pytest

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _by_code(source: str) -> Dict[str, str]:
    return {f.code: f"{f.message}; fix: {f.fix}" for f in lint_source(textwrap.dedent(source), ignore="TK112")}


UNDIVIDED = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        if (i + 1) % n == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

UNDIVIDED_AND_WIPED = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        if (i + 1) % n == 0:
            optimizer.step()
"""


def test_tk102_alone_says_the_update_is_n_times_too_large() -> None:
    found = _by_code(UNDIVIDED)
    assert set(found) == {"TK102"}
    assert "the update is `n` times too large" in found["TK102"]
    assert "TK103" not in found["TK102"]


def test_tk102_next_to_tk103_says_the_sum_is_wiped_and_both_fixes_go_together() -> None:
    # zero_grad() on every micro-batch leaves the step one micro-batch's gradient: "n times too
    # large" is false today, and dividing by n without moving zero_grad() makes it n times too small.
    found = _by_code(UNDIVIDED_AND_WIPED)
    assert set(found) == {"TK102", "TK103"}
    message = found["TK102"]
    assert "the update is `n` times too large" not in message
    assert "`optimizer.zero_grad()` on line 4 wipes the sum (TK103)" in message
    assert "once that is fixed, it is `n` times too large" in message
    assert "fix both together" in message and "dividing alone makes the update `n` times too small" in message


FIRST_WINDOW = """
def train(model, loader, optimizer, n):
    for step, (x, y) in enumerate(loader):
        loss = model(x, y){divide}
        loss.backward()
        if step % n == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_tk108_with_a_divided_loss_says_it_is_still_divided() -> None:
    found = _by_code(FIRST_WINDOW.format(divide=" / n"))
    assert set(found) == {"TK108"}
    assert "its loss still divided by `n`, so that update is `n` times too small" in found["TK108"]


RANGE_WINDOW = """
{imports}
def train(q, replay, optimizer, n, total_steps):
    for t in {source}:
        loss = q(replay.sample(32)) / n
        loss.backward()
        if t % n == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("imports, source, origin", [
    ("", "range(total_steps)", "range(...)"),
    ("", "range(0, total_steps)", "range(...)"),
    ("from tqdm import tqdm", "tqdm(range(total_steps), desc='train')", "range(...)"),
    ("from tqdm.auto import trange", "trange(total_steps)", "trange(...)"),
    ("import itertools", "itertools.count()", "count()"),
])
def test_tk108_an_index_from_range_counts_from_0_as_enumerate_s(imports, source, origin) -> None:
    # An RL loop over environment steps, accumulating over n of them: the first window holds one.
    found = _by_code(RANGE_WINDOW.format(imports=imports, source=source))
    assert set(found) == {"TK108"}
    assert f"`t % n == 0` with `t` counting from 0 (`{origin}`)" in found["TK108"]


@pytest.mark.parametrize("source", ["range(1, total_steps + 1)", "range(0, total_steps, 2)",
                                    "range(start, total_steps)", "itertools.count(1)"])
def test_tk108_not_for_a_range_that_does_not_count_from_0_by_1(source) -> None:
    assert _by_code(RANGE_WINDOW.format(imports="import itertools", source=source)) == {}


def test_tk108_with_an_undivided_loss_does_not_claim_a_division() -> None:
    found = _by_code(FIRST_WINDOW.format(divide=""))
    assert set(found) == {"TK102", "TK108"}
    message = found["TK108"]
    assert "still divided" not in message
    assert "not yet divided before backward; once divided by `n`, that update is `n` times too small" in message
