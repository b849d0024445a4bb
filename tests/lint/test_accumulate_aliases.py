"""TK104 through the imports: ``from trainkit import accumulate as tk_acc`` opens the same block as
``tk.accumulate``, so a loss divided inside it is divided twice. TK105, TK106 and TK109 resolved
the alias; TK104 matched the written name (``...accumulate``) and missed it."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import torch
{imports}

def train(model, loader, optimizer, accum_steps=4):
    with {call}(accum_steps, optimizer) as acc:
        for x, y in loader:
            loss = model(x, y) / accum_steps
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("imports, call", [
    ("from trainkit import accumulate as tk_acc", "tk_acc"),
    ("from trainkit import accumulate", "accumulate"),
    ("import trainkit as tk", "tk.accumulate"),
    ("import trainkit", "trainkit.accumulate"),
    ("from trainkit import accumulate as window", "window"),
])
def test_tk104_through_every_import_spelling(imports: str, call: str) -> None:
    src = textwrap.dedent(LOOP).replace("{imports}", imports).replace("{call}", call)
    assert [(f.code, f.line) for f in lint_source(src)] == [("TK104", 8)]


def test_an_unrelated_context_manager_is_no_block() -> None:
    src = textwrap.dedent(LOOP).replace("{imports}", "from contextlib import nullcontext as window") \
        .replace("{call}", "window")
    assert "TK104" not in [f.code for f in lint_source(src)]
