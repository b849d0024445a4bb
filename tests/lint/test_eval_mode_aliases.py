"""The mode set through a plain alias of the model: ``net = model; net.eval()`` before the loop.

A model is known by its written name; one alias bound once, ``net = model``, in the loop's block
(or one around it) before the loop, is the same module: ``net.eval()`` puts ``model`` in eval mode,
so the loop calling ``step(model, batch, opt)`` (whose backward and step run only ``if
model.training:``) is evaluation code, and ``net.train()`` after an earlier ``model.eval()`` puts it
back in training mode. Near misses (the alias bound twice, in a branch, the model rebound after it,
the alias toggled in the loop) keep the loop a training loop.
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


ALIAS = """
import torch

def step(model, batch, opt):
    loss = crit(model(batch[0]), batch[1])
    if model.training:
        opt.zero_grad(); loss.backward(); opt.step()
    return loss.item()

model.train()
for batch in train_loader:
    step(model, batch, opt)
net = model
net.eval()
for batch in val_loader:
    step(model, batch, opt)
    torch.cuda.empty_cache()
"""
# the training loop's own finding: `loss.item()` in `step()`, which it calls at every batch
TRAINING = [("TK302", 8)]
REPORTED = [("TK301", 17), ("TK302", 8)]


def test_eval_through_an_alias_of_the_model() -> None:
    assert _pairs(ALIAS) == TRAINING
    assert _pairs(_swap(ALIAS, "net.eval()", "net.train(False)")) == TRAINING
    assert _pairs(_swap(ALIAS, "net.eval()", "net.train()")) == REPORTED


def test_the_model_called_by_its_alias() -> None:
    src = _swap(ALIAS, "net = model\nnet.eval()\nfor batch in val_loader:\n    step(model, batch, opt)\n",
                "net = model\nmodel.eval()\nfor batch in val_loader:\n    step(net, batch, opt)\n")
    assert _pairs(src) == TRAINING
    # eval mode set before the alias is bound holds for it too
    src = _swap(ALIAS, "net = model\nnet.eval()\nfor batch in val_loader:\n    step(model, batch, opt)\n",
                "model.eval()\nnet = model\nfor batch in val_loader:\n    step(net, batch, opt)\n")
    assert _pairs(src) == TRAINING


def test_training_mode_set_through_the_alias_after_eval_is_seen() -> None:
    # `model.eval()` then `net.train()`: the loop trains; read as eval mode, its findings were hidden
    src = _swap(ALIAS, "model.train()\n", "model.eval()\n").replace("net.eval()", "net.train()")
    assert _pairs(src) == [("TK301", 17), ("TK302", 8)]


def test_an_alias_in_a_validation_function() -> None:
    src = """
    import torch

    def step(model, batch, opt):
        loss = crit(model(batch[0]), batch[1])
        if model.training:
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.item()

    def validate(model, loader, opt):
        net = model
        net.eval()
        for batch in loader:
            step(model, batch, opt)
            torch.cuda.empty_cache()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "net.eval()", "net.train()")) == [("TK301", 15), ("TK302", 8)]


def test_near_misses_keep_the_loop_a_training_loop() -> None:
    # the alias bound twice, or in a branch
    assert _pairs(_swap(ALIAS, "net = model\n", "net = model\nif swap:\n    net = ema\n")) == [("TK301", 19), ("TK302", 8)]
    assert _pairs(_swap(ALIAS, "net = model\n", "net = ema\nnet = model\n")) == [("TK301", 18), ("TK302", 8)]
    assert _pairs(_swap(ALIAS, "net = model\n", "if use_net:\n    net = model\n")) == [("TK301", 18), ("TK302", 8)]
    # the model rebound after the alias: `net` is the old one
    assert _pairs(_swap(ALIAS, "net = model\n", "net = model\nmodel = build()\n")) == [("TK301", 18), ("TK302", 8)]
    # the alias toggled inside the loop, or passed to a function before it
    assert _pairs(_swap(ALIAS, "    torch.cuda.empty_cache()\n",
                        "    torch.cuda.empty_cache()\n    net.train()\n")) == REPORTED
    assert _pairs(_swap(ALIAS, "net.eval()\n", "net.eval()\nprepare(net)\n")) == [("TK301", 18), ("TK302", 8)]
    # a part of the model: `model.training` is not the part's
    assert _pairs(_swap(ALIAS, "net = model\n", "net = model.encoder\n")) == REPORTED


def test_a_trainer_s_local_name_for_self_model() -> None:
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

        def validate(self):
            model = self.model
            model.eval()
            for batch in self.val_loader:
                self.total += self.run_batch(batch).item()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "model.eval()", "model.train()")) == [("TK302", 16)]
    # `self.model` set again after the local was taken: another module
    assert _pairs(_swap(src, "model.eval()\n", "model.eval()\n            self.model = self.ema\n")) == [("TK302", 17)]
