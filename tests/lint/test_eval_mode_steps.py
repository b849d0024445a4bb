"""An evaluation loop after ``model.eval()`` whose training runs only ``if model.training:`` is no training loop.

``def step(model, batch, opt): ... if model.training: loss.backward(); opt.step()`` shared by
``model.train(); for batch in train_loader: step(model, batch, opt)`` and ``model.eval(); for batch
in val_loader: step(model, batch, opt)``: the second loop never runs a backward or a step, so its
``empty_cache()`` is evaluation code. Each silent case checks a variant that is reported, so that
the mode, not a blind spot, keeps it quiet; each near miss (mode set in a branch, in a called
function, toggled in the loop) keeps today's reading.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str, select: str = "TK") -> List[Tuple[str, int]]:
    return sorted((f.code, f.line) for f in lint_source(textwrap.dedent(source), select=select))


def _swap(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


BRIEF = """
import torch

def step(model, batch, opt):
    loss = crit(model(batch[0]), batch[1])
    if model.training:
        opt.zero_grad(); loss.backward(); opt.step()
    return loss.item()

model.train()
for batch in train_loader:
    step(model, batch, opt)
model.eval()
for batch in val_loader:
    step(model, batch, opt)
    torch.cuda.empty_cache()
"""
# the training loop's own finding: `loss.item()` in `step()`, which it calls at every batch
TRAINING = [("TK302", 8)]
EVAL = [("TK301", 16)]


def test_a_loop_after_model_eval_calling_a_step_guarded_by_the_mode_is_no_training_loop() -> None:
    assert _pairs(BRIEF) == TRAINING
    assert _pairs(_swap(BRIEF, "model.eval()", "pass")) == sorted(TRAINING + EVAL)


def test_train_false_puts_it_in_eval_mode_too() -> None:
    assert _pairs(_swap(BRIEF, "model.eval()", "model.train(False)")) == TRAINING
    assert _pairs(_swap(BRIEF, "model.eval()", "model.train(True)")) == sorted(TRAINING + EVAL)


def test_an_early_return_when_not_training_is_read_both_ways() -> None:
    src = _swap(BRIEF, "    if model.training:\n        opt.zero_grad(); loss.backward(); opt.step()\n",
                "    if not model.training:\n        torch.cuda.empty_cache()\n        return loss.item()\n"
                "    opt.zero_grad(); loss.backward(); opt.step()\n")
    # the training loop (after model.train()) never runs the eval path: not read through it
    assert _pairs(src) == [("TK302", 10)]
    # without model.train() the mode is unknown there: the eval path is read through the training call
    assert _pairs(_swap(src, "model.train()", "pass")) == [("TK302", 8), ("TK302", 10)]


def test_a_guard_that_needs_the_mode_and_more_is_read() -> None:
    assert _pairs(_swap(BRIEF, "if model.training:", "if model.training and not frozen:")) == TRAINING
    # `or` does not need the mode: the step may run in eval mode
    assert _pairs(_swap(BRIEF, "if model.training:", "if model.training or finetune:")) == sorted(TRAINING + EVAL)


def test_the_epoch_loop_shape() -> None:
    src = """
    import torch
    def step(model, batch, opt):
        loss = crit(model(batch[0]), batch[1])
        if model.training:
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.detach()
    for epoch in range(epochs):
        model.train()
        for batch in train_loader:
            step(model, batch, opt)
            torch.cuda.empty_cache()
        model.eval()
        for batch in val_loader:
            total += step(model, batch, opt).item()
            torch.cuda.empty_cache()
    """
    assert _pairs(src) == [("TK301", 12)]
    assert _pairs(_swap(src, "model.eval()", "pass")) == [("TK301", 12), ("TK301", 16), ("TK302", 15)]


def test_a_loop_under_no_grad_does_not_train_through_the_guard() -> None:
    src = """
    import torch
    def step(model, batch, opt):
        loss = crit(model(batch[0]), batch[1])
        if model.training:
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.detach()
    for batch in train_loader:
        step(model, batch, opt)
    with torch.no_grad():
        for batch in val_loader:
            step(model, batch, opt)
            torch.cuda.empty_cache()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "torch.no_grad()", "torch.inference_mode()")) == []
    assert _pairs(_swap(src, "torch.no_grad()", "torch.enable_grad()")) == [("TK301", 13)]
    # gradients switched back on inside the function: the backward may run, kept a training loop
    regrad = _swap(src, "        opt.zero_grad(); loss.backward()", "        opt.zero_grad()\n        with torch.enable_grad(): loss.backward()")
    assert _pairs(regrad) == [("TK301", 14)]


def test_a_loop_whose_own_backward_is_guarded_by_the_mode() -> None:
    src = """
    import torch
    model.eval()
    for batch in val_loader:
        loss = crit(model(batch[0]), batch[1])
        if model.training:
            loss.backward(); opt.step(); opt.zero_grad()
        torch.cuda.empty_cache()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "model.eval()", "model.train()")) == [("TK301", 8)]
    # the step guarded, the backward not: it still runs backwards, a training loop
    assert _pairs(_swap(src, "        if model.training:\n            loss.backward();",
                        "        loss.backward()\n        if model.training:\n           ")) == [("TK301", 9)]


def test_a_method_guarded_by_self_model_training() -> None:
    src = """
    import torch
    class Trainer:
        def run_batch(self, batch):
            loss = self.model(*batch)
            if self.model.training:
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            return loss

        def fit(self):
            self.model.train()
            for batch in self.train_loader:
                self.run_batch(batch)
            self.model.eval()
            for batch in self.val_loader:
                self.total += self.run_batch(batch).item()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "self.model.eval()", "self.model.train()")) == [("TK302", 18)]


def test_near_misses_keep_todays_reading() -> None:
    reported = sorted(TRAINING + EVAL)
    # the mode set in a branch, or by a function the linter does not follow
    assert _pairs(_swap(BRIEF, "model.eval()\n", "if args.eval_mode:\n    model.eval()\n")) == [("TK301", 17), ("TK302", 8)]
    assert _pairs(_swap(BRIEF, "model.eval()\n", "set_eval(model)\n")) == reported
    assert _pairs(_swap(BRIEF, "model.eval()\n", "model.eval()\nprepare(model)\n")) == [("TK301", 17), ("TK302", 8)]
    # switched back before the loop, or inside it
    assert _pairs(_swap(BRIEF, "model.eval()\n", "model.eval()\nmodel.train()\n")) == [("TK301", 17), ("TK302", 8)]
    assert _pairs(_swap(BRIEF, "    torch.cuda.empty_cache()\n",
                        "    torch.cuda.empty_cache()\n    model.train()\n")) == reported
    # another model put in eval mode, or the model rebound after it
    assert _pairs(_swap(BRIEF, "model.eval()", "ema.eval()")) == reported
    assert _pairs(_swap(BRIEF, "model.eval()\n", "model.eval()\nmodel = build()\n")) == [("TK301", 17), ("TK302", 8)]
    # the function sets the mode itself
    assert _pairs(_swap(BRIEF, "    if model.training:\n", "    model.train()\n    if model.training:\n")) == [
        ("TK301", 17), ("TK302", 9)]
    # eval mode set in another function than the loop's
    src = _swap(BRIEF, "model.eval()\nfor batch in val_loader:\n    step(model, batch, opt)\n    torch.cuda.empty_cache()\n",
                "model.eval()\ndef validate():\n    for batch in val_loader:\n        step(model, batch, opt)\n"
                "        torch.cuda.empty_cache()\n")
    assert _pairs(src) == [("TK301", 17), ("TK302", 8)]
