"""``# trainkit: ignore[...]`` on the header of a compound statement written over several lines,
as Black formats a long ``if``: the comment on its first line (``if (``) or its last (``):``)
silences the findings on the header (the ``if`` itself and its test), as documented for
statements written over several lines. The comment on ``):`` silenced nothing, and the one on
``if (`` missed TK108, reported on the test's own line."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

BLACK_IF = """
def train(model, loader, optimizer, gradient_accumulation_steps=4):
    for step, batch in enumerate(loader):
        loss = model(batch) / gradient_accumulation_steps
        loss.backward()
        if (  {first}
            step % gradient_accumulation_steps == 0
        ):  {last}
            optimizer.step()
            optimizer.zero_grad()
"""
COMMENT = "# trainkit: ignore[TK108,TK112]"


def _found(first: str = "", last: str = "", src: str = BLACK_IF) -> list:
    text = textwrap.dedent(src).replace("{first}", first).replace("{last}", last)
    return [(f.code, f.line) for f in lint_source(text)]


def test_unsilenced_header_has_two_findings() -> None:
    assert _found() == [("TK112", 6), ("TK108", 7)]


@pytest.mark.parametrize("where", ["first", "last"])
def test_comment_on_the_first_or_last_header_line(where: str) -> None:
    assert _found(**{where: COMMENT}) == []


def test_comment_on_the_header_does_not_silence_the_body() -> None:
    src = BLACK_IF.replace("optimizer.zero_grad()", "optimizer.zero_grad()\n        else:\n            print(loss.item())")
    assert _found(last="# trainkit: ignore", src=src) == [("TK302", 12)]
