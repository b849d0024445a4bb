"""A loop that runs a backward for an input's gradient and steps nothing is no training loop.

An adversarial attack (FGSM, PGD), a saliency map or integrated gradients run ``loss.backward()`` on
every batch, usually under ``model.eval()``, and read ``x.grad`` of an input they made require
gradients: nothing is trained, so TK301/TK302 have no training step to report in. Each silent case
also checks a variant that trains (a step, a parameter's gradient read) is reported, so that the
reading, not a blind spot, keeps it quiet; adversarial training, which does step, keeps its findings.
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


# PyTorch's FGSM tutorial's test(), with a cache flush added
FGSM = """
import torch
import torch.nn.functional as F

model.eval()
for data, target in test_loader:
    data, target = data.to(device), target.to(device)
    data.requires_grad = True
    output = model(data)
    loss = F.nll_loss(output, target)
    model.zero_grad()
    loss.backward()
    data_grad = data.grad.data
    perturbed = torch.clamp(data + epsilon * data_grad.sign(), 0, 1)
    final_pred = model(perturbed).max(1, keepdim=True)[1]
    if final_pred.item() == target.item():
        correct += 1
    torch.cuda.empty_cache()
"""
FGSM_FOUND = [("TK301", 18), ("TK302", 16), ("TK302", 16)]


def test_an_fgsm_evaluation_loop_is_no_training_loop() -> None:
    assert _pairs(FGSM) == []
    # the same loop stepping an optimizer trains: reported
    assert _pairs(_swap(FGSM, "    data_grad = data.grad.data\n",
                        "    optimizer.step()\n    data_grad = data.grad.data\n")) == sorted(
        [("TK301", 19), ("TK302", 17), ("TK302", 17)])


def test_a_backward_whose_input_gradient_is_not_read_still_trains() -> None:
    # no `x.grad` read: the backward's gradients may be the parameters' (a loop of backwards only)
    src = _swap(FGSM, "data_grad = data.grad.data", "data_grad = torch.sign(output)")
    assert _pairs(src) == FGSM_FOUND
    # nothing made to require gradients: `x.grad` may be a parameter's, but nothing steps nor updates
    # a parameter by hand: a loop that reads gradients (see test_gradient_statistics.py)
    src = _swap(FGSM, "    data.requires_grad = True\n", "    pass\n")
    assert _pairs(src) == []
    # updated by hand with that gradient (PyTorch's tutorials' SGD), it trains
    assert _pairs(_swap(src, "    data_grad = data.grad.data\n",
                        "    data_grad = data.grad.data\n    data -= 0.1 * data_grad\n")) == sorted(
        [("TK301", 19), ("TK302", 17), ("TK302", 17)])


def test_a_parameter_gradient_read_or_clipped_is_no_attack() -> None:
    # gradient statistics of the parameters: the model's gradients are in use, so this is no attack,
    # and as nothing steps nor updates a parameter, no training either (test_gradient_statistics.py)
    src = _swap(FGSM, "    data_grad = data.grad.data\n",
                "    data_grad = data.grad.data\n    norms = [p.grad.norm() for p in model.parameters()]\n")
    assert _pairs(src) == []
    assert _pairs(src.replace("    norms = [p.grad.norm() for p in model.parameters()]\n",
                              "    for p in model.parameters():\n        p.data.add_(p.grad, alpha=-0.1)\n")) == [
        ("TK301", 20), ("TK302", 18), ("TK302", 18)]
    src = _swap(FGSM, "    data_grad = data.grad.data\n",
                "    data_grad = data.grad.data\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")
    assert _pairs(src) == [("TK301", 19), ("TK302", 17), ("TK302", 17)]


def test_a_scaled_or_wrapped_backward_is_not_read_as_an_input_backward() -> None:
    src = _swap(FGSM, "    loss.backward()\n", "    scaler.scale(loss).backward()\n")
    assert _pairs(src) == FGSM_FOUND
    src = _swap(FGSM, "    loss.backward()\n", "    amp.backward(loss)\n").replace(
        "import torch\n", "import torch\nfrom apex import amp\n", 1)
    assert _pairs(src) == [("TK301", 19), ("TK302", 17), ("TK302", 17)]


def test_backward_with_inputs_of_the_marked_input_needs_no_grad_read() -> None:
    src = _swap(FGSM, "    loss.backward()\n    data_grad = data.grad.data\n",
                "    loss.backward(inputs=[data])\n    data_grad = torch.sign(output)\n")
    assert _pairs(src) == []
    # `inputs=` naming what was not made to require gradients: the parameters, maybe
    assert _pairs(src.replace("inputs=[data]", "inputs=params")) == FGSM_FOUND


# Madry, Kolter and Wong's robustness tutorial: `delta` made once, then the attack's iterations
PGD = """
import torch
import torch.nn as nn

def pgd_linf(model, X, y, epsilon, alpha, num_iter, losses):
    delta = torch.zeros_like(X, requires_grad=True)
    for t in range(num_iter):
        loss = nn.CrossEntropyLoss()(model(X + delta), y)
        loss.backward()
        losses.append(loss.item())
        delta.data = (delta + alpha * delta.grad.detach().sign()).clamp(-epsilon, epsilon)
        delta.grad.zero_()
    return delta.detach()

def evaluate(model, loader):
    model.eval()
    for X, y in loader:
        delta = pgd_linf(model, X, y, 0.1, 0.01, 20, [])
        err = (model(X + delta).max(dim=1)[1] != y).sum().item()
        torch.cuda.empty_cache()
"""


def test_a_pgd_attack_loop_marked_before_it_is_no_training_loop() -> None:
    assert _pairs(PGD) == []
    # `delta` made without `requires_grad=True`: nothing says its gradient is an input's
    assert _pairs(_swap(PGD, "torch.zeros_like(X, requires_grad=True)", "torch.zeros_like(X)")) == [("TK302", 10)]


# an attack helper called from the evaluation loop
HELPER = """
import torch
import torch.nn.functional as F

def fgsm(model, x, y, eps):
    x = x.clone().detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return (x + eps * x.grad.sign()).clamp(0, 1).detach()

def evaluate(model, loader, eps):
    model.eval()
    for x, y in loader:
        x_adv = fgsm(model, x, y, eps)
        with torch.no_grad():
            correct += (model(x_adv).argmax(1) == y).sum().item()
        torch.cuda.empty_cache()
"""


def test_an_attack_helper_is_no_step_function() -> None:
    assert _pairs(HELPER) == []
    # a helper that steps is one: its caller trains
    src = _swap(HELPER, "    loss.backward()\n", "    loss.backward()\n    optimizer.step()\n")
    assert _pairs(src) == [("TK301", 18)]


# a saliency map: gradients switched back on inside a no_grad evaluation
SALIENCY = """
import torch

model.eval()
with torch.no_grad():
    for images, labels in loader:
        with torch.enable_grad():
            images.requires_grad_()
            score = model(images).gather(1, labels.view(-1, 1)).squeeze().sum()
            score.backward()
        maps.append(images.grad.abs().amax(dim=1).cpu())
        torch.cuda.empty_cache()
"""


def test_a_saliency_loop_under_enable_grad_is_no_training_loop() -> None:
    assert _pairs(SALIENCY) == []
    # `images` not made to require gradients: no attack, but a loop reading gradients that trains nothing
    src = _swap(SALIENCY, "images.requires_grad_()", "images.requires_grad_(False)")
    assert _pairs(src) == []
    assert _pairs(_swap(src, "            score.backward()\n", "            scaler.scale(score).backward()\n")) == [
        ("TK301", 12), ("TK302", 11)]


# adversarial training: the attack runs inside a loop that steps
ADVERSARIAL = """
import torch
import torch.nn.functional as F

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def fgsm(model, x, y, eps):
    x = x.clone().detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return (x + eps * x.grad.sign()).clamp(0, 1).detach()

model.train()
for i, (x, y) in enumerate(loader):
    x_adv = fgsm(model, x, y, eps)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        attack_loss = F.cross_entropy(model(x_adv), y)
        attack_loss.backward()
        print(attack_loss.item())
        x_adv = (x_adv + alpha * x_adv.grad.sign()).detach()
    loss = F.cross_entropy(model(x_adv), y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.empty_cache()
"""


def test_adversarial_training_keeps_its_findings() -> None:
    # the attack loop inside the loop that steps is part of its iteration (TK302 there), its backward
    # is not one of the accumulation's (no TK102 for the undivided `attack_loss`); its last window is
    # never stepped (TK112)
    assert _pairs(ADVERSARIAL) == [("TK112", 24), ("TK301", 27), ("TK302", 20)]


def test_an_attack_helper_inside_an_accumulating_loop_is_not_read_as_its_step() -> None:
    # `fgsm()`'s undivided backward was read at its call as the training step's: a false TK102
    src = """
    import torch
    import torch.nn.functional as F

    def fgsm(model, inputs, targets, eps):
        adv = inputs.clone().detach().requires_grad_(True)
        attack_loss = F.cross_entropy(model(adv), targets)
        attack_loss.backward()
        return (adv + eps * adv.grad.sign()).clamp(0, 1).detach()

    for epoch in range(10):
        for i, (x, y) in enumerate(loader):
            x_adv = fgsm(model, x, y, 0.03)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_adv), y) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
    """
    # the real accumulation's zero_grad() at every batch is still reported
    assert _pairs(src) == [("TK103", 14), ("TK112", 17)]


def test_an_attack_loop_in_a_step_function_is_read_through_its_call() -> None:
    src = """
    import torch
    import torch.nn.functional as F

    def train_step(model, x, y, optimizer):
        delta = torch.zeros_like(x, requires_grad=True)
        for _ in range(7):
            loss = F.cross_entropy(model(x + delta), y)
            loss.backward()
            print(loss.item())
            delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.03, 0.03)
            delta.grad.zero_()
        optimizer.zero_grad()
        F.cross_entropy(model(x + delta), y).backward()
        optimizer.step()

    for x, y in loader:
        train_step(model, x, y, optimizer)
    """
    # the attack's loop is part of the step: its sync is reported as `train_step()`'s, once
    found = lint_source(textwrap.dedent(src))
    assert [(f.code, f.line) for f in found] == [("TK302", 10)]
    assert "in `train_step()`, which runs on every step" in found[0].message


def test_an_attack_evaluation_beside_the_training_loop_in_one_function() -> None:
    # the training pass over other data in the same function does not make the evaluation train
    src = """
    import torch

    def main():
        for epoch in range(10):
            model.train()
            for x, y in train_loader:
                optimizer.zero_grad()
                crit(model(x), y).backward()
                optimizer.step()
            model.eval()
            for x, y in test_loader:
                delta = torch.zeros_like(x, requires_grad=True)
                for _ in range(10):
                    loss = crit(model(x + delta), y)
                    loss.backward()
                    print(loss.item())
                    delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.03, 0.03)
                    delta.grad.zero_()
    """
    assert _pairs(src) == []
    # the attack's loop stepping the optimizer too (free adversarial training): reported
    assert _pairs(src.replace("                    delta.grad.zero_()\n",
                              "                    delta.grad.zero_()\n                    optimizer.step()\n")) == [
        ("TK302", 17)]
