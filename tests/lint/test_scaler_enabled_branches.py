"""TK202 and a scaler switched off where the plain step runs: with
``scaler = GradScaler("cuda", enabled=use_amp)`` the unconditional ``scaler.scale(loss).backward()``
returns the loss unchanged when ``use_amp`` is false, so ``optimizer.step()`` under ``else:`` of
``if use_amp:`` steps true gradients. TK202 called it an error."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import torch
def train(model, loader, optimizer, args, use_amp=True):
    scaler = torch.amp.GradScaler("cuda", enabled={enabled})
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", enabled={enabled}):
            loss = model(x, y)
        scaler.scale(loss).backward()
        {branch}
"""

ELSE = """if {test}:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()"""
NOT = """if not {test}:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()"""


def _codes(enabled: str, branch: str, test: str) -> list:
    src = textwrap.dedent(LOOP).replace("{enabled}", enabled).replace("{branch}", branch.replace("{test}", test))
    return [(f.code, f.line) for f in lint_source(src)]


@pytest.mark.parametrize("enabled", ["use_amp", "args.amp"])
@pytest.mark.parametrize("branch", [ELSE, NOT])
def test_plain_step_where_the_scaler_is_disabled_is_clean(enabled: str, branch: str) -> None:
    assert _codes(enabled, branch, enabled) == []


def test_plain_step_under_another_test_is_still_tk202() -> None:
    assert _codes("use_amp", ELSE, "args.fp16") == [("TK202", 14)]


def test_plain_step_where_the_scaler_is_enabled_is_still_tk202() -> None:
    branch = "if use_amp:\n            optimizer.step()\n        else:\n            scaler.step(optimizer)\n" \
             "            scaler.update()"
    assert _codes("use_amp", branch, "use_amp") == [("TK202", 11)]


def test_an_always_enabled_scaler_is_still_tk202() -> None:
    assert _codes("True", ELSE, "use_amp") == [("TK202", 14)]
