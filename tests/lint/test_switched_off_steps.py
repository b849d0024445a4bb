"""An evaluation loop calling the file's step function with training switched off is no training loop.

``def step(model, batch, opt, train=True): ... if train: loss.backward(); opt.step()`` shared by
``for batch in train_loader: step(model, batch, opt)`` and ``for batch in val_loader: step(model,
batch, opt, train=False)``: the second call runs no backward and no step, so its loop's `.item()`
and `empty_cache()` are evaluation code. Each silent case also checks the variant that trains is
reported, so that the switch, not a blind spot, is what keeps it quiet.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str, select: str = "TK") -> List[Tuple[str, int]]:
    return sorted((f.code, f.line) for f in lint_source(textwrap.dedent(source), select=select))


BRIEF = """
import torch

def step(model, batch, opt, train=True):
    loss = crit(model(batch[0]), batch[1])
    if train:
        opt.zero_grad(); loss.backward(); opt.step()
    return loss.item()

for batch in train_loader:
    step(model, batch, opt)
for batch in val_loader:
    step(model, batch, opt, train=False)
    torch.cuda.empty_cache()
    total += crit(model(batch[0]), batch[1]).item()
"""
# the training loop's own finding: `loss.item()` in `step()`, which it calls at every batch
TRAINING = [("TK302", 8)]
EVAL = [("TK301", 14), ("TK302", 15)]


def test_an_eval_loop_passing_train_false_is_not_a_training_loop() -> None:
    assert _pairs(BRIEF) == TRAINING
    assert _pairs(BRIEF.replace("train=False", "train=True")) == sorted(TRAINING + EVAL)


def test_a_positional_false_switches_it_off_too() -> None:
    src = BRIEF.replace("step(model, batch, opt, train=False)", "step(model, batch, opt, False)")
    assert src != BRIEF and _pairs(src) == TRAINING
    assert _pairs(src.replace("opt, False)", "opt, True)")) == sorted(TRAINING + EVAL)


def test_the_message_names_the_training_loop_not_the_eval_loop() -> None:
    # the eval loop coming first must not be named as the caller that runs it on every step
    src = """
    def step(model, batch, opt, train=True):
        loss = crit(model(batch[0]), batch[1])
        if train:
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.item()
    for batch in val_loader:
        step(model, batch, opt, train=False)
    for batch in train_loader:
        step(model, batch, opt)
    """
    found = lint_source(textwrap.dedent(src), select="TK3")
    assert [(f.code, f.line) for f in found] == [("TK302", 6)]
    assert "the training loop on line 9 calls it on line 10" in found[0].message


def test_an_early_return_when_not_training_is_a_switch() -> None:
    src = BRIEF.replace("    if train:\n        opt.zero_grad(); loss.backward(); opt.step()\n",
                        "    if not train:\n        return loss.item()\n    opt.zero_grad(); loss.backward(); opt.step()\n")
    assert src != BRIEF
    # the training loop's read is past the early return: still reported, a line further down
    assert _pairs(src) == [("TK302", 9)]
    assert _pairs(src.replace("train=False", "train=True")) == sorted([("TK302", 9), ("TK301", 15), ("TK302", 16)])


def test_a_test_that_needs_the_flag_and_more_is_a_switch() -> None:
    src = BRIEF.replace("    if train:\n", "    if train and not frozen:\n")
    assert src != BRIEF and _pairs(src) == TRAINING
    # `or` does not need the flag: the step may run with train=False
    either = BRIEF.replace("    if train:\n", "    if train or finetune:\n")
    assert _pairs(either) == sorted(TRAINING + EVAL)


def test_an_optimizer_passed_as_none_is_a_switch_when_the_step_needs_it() -> None:
    src = """
    import torch
    def step(model, batch, opt=None):
        loss = crit(model(batch[0]), batch[1])
        if opt is not None:
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.item()
    for batch in train_loader:
        step(model, batch, opt)
    for batch in val_loader:
        step(model, batch, None)
        torch.cuda.empty_cache()
    """
    assert _pairs(src) == [("TK302", 7)]
    assert _pairs(src.replace("step(model, batch, None)", "step(model, batch, opt)")) == [("TK301", 12), ("TK302", 7)]


def test_a_method_called_with_train_false() -> None:
    src = """
    import torch
    class Trainer:
        def run_batch(self, batch, train=True):
            loss = self.model(*batch)
            if train:
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            return loss

        def fit(self):
            for batch in self.train_loader:
                self.run_batch(batch)
            for batch in self.val_loader:
                self.total += self.run_batch(batch, False).item()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("self.run_batch(batch, False)", "self.run_batch(batch, True)")) == [("TK302", 16)]


def test_a_flag_that_guards_only_the_step_is_no_switch() -> None:
    # the backward still runs with train=False: that loop runs backwards, it is kept a training loop
    src = BRIEF.replace("    if train:\n        opt.zero_grad(); loss.backward(); opt.step()\n",
                        "    loss.backward()\n    if train:\n        opt.step(); opt.zero_grad()\n")
    assert src != BRIEF and _pairs(src) == [("TK301", 15), ("TK302", 9), ("TK302", 16)]


def test_a_flag_that_is_not_a_literal_or_is_rebound_is_no_switch() -> None:
    assert _pairs(BRIEF.replace("train=False", "train=is_training")) == sorted(TRAINING + EVAL)
    rebound = BRIEF.replace("    if train:\n", "    train = train or always\n    if train:\n")
    assert rebound != BRIEF and _pairs(rebound) == sorted([("TK302", 9), ("TK301", 15), ("TK302", 16)])


def test_what_the_training_call_never_runs_is_not_read_through_it() -> None:
    # `step(model, batch, opt)` runs with train=True: the eval path's reads are not its own
    src = """
    import torch
    def step(model, batch, opt, train=True):
        loss = crit(model(batch[0]), batch[1])
        if train:
            opt.zero_grad(); loss.backward(); opt.step()
            return loss.detach()
        torch.cuda.empty_cache()
        return loss.item()
    for batch in train_loader:
        step(model, batch, opt)
    """
    assert _pairs(src) == []
    # called with train=False from inside the training loop, the eval path does run at every step
    inside = src.replace("        step(model, batch, opt)\n", "        step(model, batch, opt)\n        step(model, batch, opt, train=False)\n")
    assert _pairs(inside) == [("TK301", 8), ("TK302", 9)]
    # with a flag the linter cannot read, it may run: reported
    assert _pairs(src.replace("step(model, batch, opt)\n", "step(model, batch, opt, train=flag)\n")) == [
        ("TK301", 8), ("TK302", 9)]


def test_a_default_of_false_switches_off_a_call_that_leaves_it_out() -> None:
    src = BRIEF.replace("step(model, batch, opt, train=False)", "step(model, batch, opt)")
    src = src.replace("train=True):", "train=False):").replace("    step(model, batch, opt)\n",
                                                              "    step(model, batch, opt, train=True)\n", 1)
    assert src.count("train=True") == 1 and _pairs(src) == TRAINING
