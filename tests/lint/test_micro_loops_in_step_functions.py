"""A micro-batch loop inside a step function, with the step after it in the function.

``def train_step(batch): opt.zero_grad(); for micro in batch.chunk(4): loss = ...; loss.backward()``
then ``opt.step()``: the function's body is one step, as a batch loop's iteration is, and the inner
loop's backwards add up into the step after it. The inner loop was analysed on its own (a training
loop, with no step) and the function was never its "outer loop", so an undivided loss (TK102), a
division after the backward (TK101) or a ``zero_grad()`` per micro-batch (TK103) went unreported.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source))]


def _swap(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


STEP = """
import torch

def train_step(batch):
    opt.zero_grad()
    for micro in batch.chunk(4):
        loss = crit(model(micro))
        loss.backward()
    opt.step()

for batch in loader:
    train_step(batch)
"""


def test_an_undivided_loss_in_a_step_function_s_micro_batch_loop_is_found() -> None:
    found = lint_source(textwrap.dedent(STEP))
    assert [(f.code, f.line) for f in found] == [("TK102", 8)]
    assert "micro-batch loop (line 6)" in found[0].message and "step (line 9)" in found[0].message
    assert "`4` times too large" in found[0].message
    # divided before its backward: clean
    assert _pairs(_swap(STEP, "        loss.backward()", "        loss = loss / 4\n        loss.backward()")) == []


def test_a_method_and_the_other_micro_batch_rules() -> None:
    src = """
    class Trainer:
        def train_step(self, batch):
            for micro in batch.chunk(self.parts):
                self.opt.zero_grad()
                loss = self.crit(self.model(micro)) / self.parts
                loss.backward()
            self.opt.step()
    """
    assert _pairs(src) == [("TK103", 5)]
    late = _swap(src, "                self.opt.zero_grad()\n", "").replace(" / self.parts\n", "\n").replace(
        "                loss.backward()\n", "                loss.backward()\n                loss = loss / self.parts\n")
    assert _pairs(late) == [("TK101", 7)]


def test_near_misses_stay_silent() -> None:
    # no step after the inner loop in the function (the caller steps, or nothing does)
    assert _pairs(_swap(STEP, "    opt.step()\n", "")) == []
    # the inner loop steps itself: a training loop of its own, not a micro-batch loop
    assert _pairs(_swap(STEP, "        loss.backward()", "        loss.backward(); opt.step()")) == []
    # a loop over task losses that does not say it goes over micro-batches may mean them to add up
    assert _pairs(_swap(STEP, "for micro in batch.chunk(4):", "for head in heads:").replace("(micro)", "(head)")) == []
    # gradients combined by hand before the step (gradient surgery)
    assert _pairs(_swap(STEP, "    opt.step()", "    project(model.parameters())\n    grads = [p.grad for p in params]\n    opt.step()")) == []
    # the loop inside a nested function of the step function, the step outside it
    nested = _swap(STEP, "    opt.zero_grad()\n    for micro", "    opt.zero_grad()\n    def run():\n      for micro")
    nested = nested.replace("        loss = crit", "        loss = crit").replace("    opt.step()", "    run()\n    opt.step()")
    assert _pairs(nested) == []
