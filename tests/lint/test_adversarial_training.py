"""Adversarial training: the attack's loop is part of the training step that runs it.

Madry et al.'s PGD adversarial training runs, in each batch of the loop that steps, an attack of
``k`` iterations that takes the input's gradient (``loss.backward()`` then ``x_adv.grad``) and often
zeroes the model's gradients first. That loop steps nothing: it is no training loop of its own but
part of the batch's iteration, so an accumulating batch loop's window is wiped by its
``model.zero_grad()`` (TK103), while its undivided attack loss is none of the accumulation's
backwards (no TK102) and its per-iteration ``.item()`` is still a sync on every training step.
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


# Madry-style PGD adversarial training, accumulating 4 batches per update
MADRY = """
import torch
import torch.nn.functional as F

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accum = 4
for epoch in range(epochs):
    model.train()
    for i, (x, y) in enumerate(train_loader):
        x_adv = x.detach() + 0.001 * torch.randn_like(x)
        for _ in range(10):
            x_adv.requires_grad_(True)
            loss = F.cross_entropy(model(x_adv), y)
            model.zero_grad()
            loss.backward()
            x_adv = x_adv.detach() + 0.01 * x_adv.grad.sign()
            x_adv = torch.min(torch.max(x_adv, x - 0.03), x + 0.03).clamp(0, 1)
        loss = F.cross_entropy(model(x_adv), y) / accum
        loss.backward()
        if (i + 1) % accum == 0 or i + 1 == len(train_loader):
            optimizer.step()
            optimizer.zero_grad()
"""


def test_the_attacks_zero_grad_wipes_an_accumulating_window() -> None:
    # the attack's `model.zero_grad()` runs on every micro-batch: the window keeps only the last one
    assert _pairs(MADRY, "TK103") == [("TK103", 14)]
    # the attack's undivided loss is none of the accumulation's micro-batches: no TK102 for it
    assert _pairs(MADRY, "TK1") == [("TK103", 14), ("TK110", 18)]
    # the same attack with `torch.autograd.grad` (no backward) was always read so
    src = _swap(MADRY, "            loss.backward()\n            x_adv = x_adv.detach() + 0.01 * x_adv.grad.sign()\n",
                "            grad = torch.autograd.grad(loss, [x_adv])[0]\n"
                "            x_adv = x_adv.detach() + 0.01 * grad.sign()\n")
    assert _pairs(src, "TK103") == [("TK103", 14)]


def test_the_attacks_zero_grad_is_right_when_every_batch_steps() -> None:
    # Madry's own loop: one batch, one step; zeroing before each attack backward is correct
    src = _swap(MADRY, "        if (i + 1) % accum == 0 or i + 1 == len(train_loader):\n"
                       "            optimizer.step()\n            optimizer.zero_grad()\n",
                "        optimizer.step()\n        optimizer.zero_grad()\n").replace(" / accum", "")
    assert _pairs(src) == []


def test_a_sync_in_the_attack_is_reported_once_on_every_training_step() -> None:
    src = _swap(MADRY, "            loss.backward()\n", "            loss.backward()\n            print(loss.item())\n")
    assert _pairs(src, "TK3") == [("TK302", 16)]


# the attack and the training backward in a step function; the loop steps every 4 calls
STEP = """
import torch
import torch.nn.functional as F

def train_step(model, x, y):
    delta = torch.zeros_like(x, requires_grad=True)
    for _ in range(7):
        loss = F.cross_entropy(model(x + delta), y)
        model.zero_grad()
        loss.backward()
        delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.03, 0.03)
    adv_loss = F.cross_entropy(model(x + delta), y)
    adv_loss.backward()

for i, (x, y) in enumerate(loader):
    train_step(model, x, y)
    if (i + 1) % 4 == 0 or i + 1 == len(loader):
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_step_function_running_an_attack_then_the_training_backward_is_read_at_its_call() -> None:
    # `adv_loss.backward()` reads no input's gradient after it: the model's, so `train_step` is a step
    # function (not an attack helper), read at its call: its attack wipes the window, its loss undivided
    found = lint_source(textwrap.dedent(STEP))
    assert sorted((f.code, f.line) for f in found) == [("TK102", 13), ("TK103", 9)]
    assert all("in `train_step()`" in f.message for f in found)
    # the attack alone, returned to the loop, is an attack helper: nothing of it is read at its call
    # (only the loop's own short last window, weighted as a full one)
    src = _swap(STEP, "    adv_loss = F.cross_entropy(model(x + delta), y)\n    adv_loss.backward()\n",
                "    return delta.detach()\n").replace("    train_step(model, x, y)\n",
                                                       "    delta = train_step(model, x, y)\n"
                                                       "    (F.cross_entropy(model(x + delta), y) / 4).backward()\n")
    assert _pairs(src) == [("TK110", 16)]
