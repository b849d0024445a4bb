"""TK302's logging branches: the body of an ``if`` whose test names a logging or evaluation
setting is a rare branch, not every step. Names were matched by substring, so ``if
use_aux_logits:`` ("log" in "logits") and ``if clip_value is not None:`` ("val" in "value") hid a
real ``.item()`` run at every step; the words of a name are matched now."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import torch
import torch.nn.functional as F

def train(args, model, loader, optimizer, step, log_every, writer):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        logits, aux = model(x)
        loss = F.cross_entropy(logits, y)
        if {test}:
            writer.add_scalar("loss", loss.item(), step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _tk302(test: str) -> int:
    src = textwrap.dedent(LOOP).replace("{test}", test)
    return sum(f.code == "TK302" for f in lint_source(src))


@pytest.mark.parametrize("test", [
    "args.use_aux_logits", "clip_value is not None", "args.interval > 0", "catalog",
    "self.dialog_open", "args.prevalence > 0.5",
])
def test_a_name_that_only_contains_a_logging_word_is_no_logging_branch(test: str) -> None:
    assert _tk302(test) == 1


@pytest.mark.parametrize("test", [
    "args.log", "should_log", "args.verbose", "args.debug", "do_eval", "is_val",
    "args.print_freq and step", "logStep", "args.logfreq", "self.logger is not None",
    "args.report_to", "display", "args.eval_during_training", "validate", "logging_enabled",
])
def test_a_logging_or_evaluation_setting_is_a_logging_branch(test: str) -> None:
    assert _tk302(test) == 0
