"""A loss made of several terms, each divided by the accumulation count (TK102, TK104, TK110).

``loss = ce / accum + kl / accum`` divides the loss as much as ``loss = (ce + kl) / accum``
does: it was reported as never divided (TK102, an error), while its short last window (TK110)
and a division inside ``tk.accumulate`` (TK104) went unseen.
"""
from __future__ import annotations

from tests.lint._loop_analysis_helpers import _pairs

LOOP = """
accum = 4
for i, (x, y) in enumerate(loader):
    out = model(x)
    loss = {loss}
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def test_every_term_divided_is_a_divided_loss() -> None:
    assert _pairs(LOOP.format(loss="ce(out, y) / accum + kl(out) / accum")) == []
    assert _pairs(LOOP.format(loss="ce(out, y).div(accum) + 0.1 * kl(out) / accum")) == []
    assert _pairs(LOOP.format(loss="ce(out, y) / accum - kl(out) / accum")) == []


def test_a_term_left_undivided_is_still_reported() -> None:
    assert _pairs(LOOP.format(loss="ce(out, y) / accum + kl(out)")) == [("TK102", 6)]
    assert _pairs(LOOP.format(loss="ce(out, y) + kl(out)")) == [("TK102", 6)]


def test_a_divided_sum_backward_inline() -> None:
    src = """
    accum = 4
    for i, (x, y) in enumerate(loader):
        out = model(x)
        (ce(out, y) / accum + kl(out) / accum).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_short_last_window_of_a_divided_sum_is_reported() -> None:
    src = """
    accum = 4
    for i, (x, y) in enumerate(loader):
        out = model(x)
        loss = ce(out, y) / accum + kl(out) / accum
        loss.backward()
        if (i + 1) % accum == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK110", 5)]


def test_terms_divided_by_different_counts_have_no_common_divisor() -> None:
    src = """
    accum = 4
    for i, (x, y) in enumerate(loader):
        out = model(x)
        loss = ce(out, y) / accum + kl(out) / 2
        loss.backward()
        if (i + 1) % accum == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_divided_sum_inside_tk_accumulate_is_reported() -> None:
    src = """
    import trainkit as tk
    with tk.accumulate(4, optimizer):
        for x, y in loader:
            out = model(x)
            loss = ce(out, y) / 4 + kl(out) / 4
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK104", 6)]
