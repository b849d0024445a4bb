"""Branches that do not run on every micro-batch: accelerate's real step, a non-finite loss.

Under ``if accelerator.sync_gradients:`` (or behind ``if not accelerator.sync_gradients:
continue``) code runs once per optimizer update, like logging every N steps; a branch taken only
on a NaN/inf loss runs on the odd bad batch. TK302 once reported a host sync in either as
"on every training step". The NaN skip (``zero_grad(); continue`` on a non-finite loss) must also
stay clear of the accumulation rules: its ``zero_grad()`` is conditional.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


# --------------------------------------------------------------------------- accelerate's real step

AFTER_THE_REAL_STEP = """
def fit(net, batches, opt, acc):
    for j, batch in enumerate(batches):
        with acc.accumulate(net):
            out = net(**batch).loss
            acc.backward(out)
            opt.step()
            opt.zero_grad()
        if not acc.sync_gradients:
            continue
        seen = out.item()
        acc.print(f"update after batch {j}: {seen}")
"""


def test_a_sync_behind_if_not_sync_gradients_continue_runs_once_per_update() -> None:
    assert _pairs(AFTER_THE_REAL_STEP) == []


def test_a_sync_under_if_sync_gradients_runs_once_per_update() -> None:
    src = AFTER_THE_REAL_STEP.replace(
        "        if not acc.sync_gradients:\n            continue\n        seen = out.item()\n",
        "        if acc.sync_gradients:\n            seen = out.detach().cpu()\n")
    assert _pairs(src) == []


def test_the_other_side_of_sync_gradients_is_every_micro_batch() -> None:
    flipped = AFTER_THE_REAL_STEP.replace("if not acc.sync_gradients:", "if acc.sync_gradients:")
    assert _pairs(flipped) == [("TK302", 11)]
    either = AFTER_THE_REAL_STEP.replace("if not acc.sync_gradients:", "if not acc.sync_gradients and j > 9:")
    assert _pairs(either) == [("TK302", 11)]


# --------------------------------------------------------------------------- a non-finite loss

NAN_SKIP = """
import torch

def fit(net, batches, opt, crit, k):
    for j, (a, b) in enumerate(batches):
        out = crit(net(a), b) / k
        if not torch.isfinite(out):
            print(f"bad loss {out.item()} at batch {j}")
            opt.zero_grad()
            continue
        out.backward()
        if (j + 1) % k == 0:
            opt.step()
            opt.zero_grad()
"""


def test_a_sync_in_the_branch_for_a_non_finite_loss_is_not_every_step() -> None:
    assert _pairs(NAN_SKIP) == []
    assert _pairs(NAN_SKIP.replace("not torch.isfinite(out)", "torch.isnan(out).any()")) == []
    assert _pairs(NAN_SKIP.replace("not torch.isfinite(out)", "out.isinf() or out.isnan()")) == []


def test_the_finite_side_and_a_test_that_syncs_itself_are_still_reported() -> None:
    assert _pairs(NAN_SKIP.replace("not torch.isfinite(out)", "torch.isfinite(out)")) == [("TK302", 8)]
    # the test reads the loss on the host at every batch
    src = NAN_SKIP.replace("not torch.isfinite(out)", "math.isnan(out.item())").replace(
        "import torch", "import math")
    assert _pairs(src) == [("TK302", 7)]


def test_a_nan_skip_zero_grad_is_no_wipe_of_an_accumulation() -> None:
    # before the backward, after it, or with the step behind an early exit: the zero_grad is conditional
    assert _pairs(NAN_SKIP.replace("print(f\"bad loss {out.item()} at batch {j}\")", "pass")) == []
    after = """
    import torch

    def fit(net, batches, opt, crit, k):
        for j, (a, b) in enumerate(batches):
            out = crit(net(a), b) / k
            out.backward()
            if (j + 1) % k != 0:
                continue
            if torch.isnan(out):
                opt.zero_grad()
                continue
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(after) == []
