"""A whole-epoch function that the file only ever calls with its training switched off is evaluation.

"Adversarial Robustness: Theory and Practice" writes one function per pass over the data, ``def
epoch(loader, model, opt=None): for X, y in loader: ... if opt: opt.zero_grad(); loss.backward();
opt.step()``, and calls it as ``epoch(train_loader, model, opt)`` to train and ``epoch(test_loader,
model)`` to evaluate. When every call of the file passes no optimizer, its loop never trains, and
TK302 has no training step to report its ``.item()`` in; one training call makes it a training loop.
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


# the tutorial's chapter 4: `epoch` evaluates only, `epoch_adversarial` trains once and evaluates
TUTORIAL = """
import torch
import torch.nn as nn

def pgd_linf(model, X, y, epsilon=0.1, alpha=0.01, num_iter=20):
    delta = torch.zeros_like(X, requires_grad=True)
    for t in range(num_iter):
        loss = nn.CrossEntropyLoss()(model(X + delta), y)
        loss.backward()
        delta.data = (delta + alpha * delta.grad.detach().sign()).clamp(-epsilon, epsilon)
        delta.grad.zero_()
    return delta.detach()

def epoch(loader, model, opt=None):
    total_loss, total_err = 0., 0.
    for X, y in loader:
        X, y = X.to(device), y.to(device)
        yp = model(X)
        loss = nn.CrossEntropyLoss()(yp, y)
        if opt:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total_err += (yp.max(dim=1)[1] != y).sum().item()
        total_loss += loss.item() * X.shape[0]
    return total_err / len(loader.dataset), total_loss / len(loader.dataset)

def epoch_adversarial(loader, model, attack, opt=None, **kwargs):
    total_loss, total_err = 0., 0.
    for X, y in loader:
        X, y = X.to(device), y.to(device)
        delta = attack(model, X, y, **kwargs)
        yp = model(X + delta)
        loss = nn.CrossEntropyLoss()(yp, y)
        if opt:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total_err += (yp.max(dim=1)[1] != y).sum().item()
        total_loss += loss.item() * X.shape[0]
    return total_err / len(loader.dataset), total_loss / len(loader.dataset)

opt = torch.optim.SGD(model_cnn_robust.parameters(), lr=1e-1)
for t in range(10):
    train_err, train_loss = epoch_adversarial(train_loader, model_cnn_robust, pgd_linf, opt)
    test_err, test_loss = epoch(test_loader, model_cnn_robust)
    adv_err, adv_loss = epoch_adversarial(test_loader, model_cnn_robust, pgd_linf)
"""
TRAINS = [("TK302", 39), ("TK302", 40)]  # epoch_adversarial's syncs: it trains through the first call


def test_an_epoch_called_only_without_an_optimizer_is_evaluation() -> None:
    assert _pairs(TUTORIAL) == TRAINS
    # one call with the optimizer makes `epoch` train: its syncs are per training step
    src = _swap(TUTORIAL, "    test_err, test_loss = epoch(test_loader, model_cnn_robust)\n",
                "    test_err, test_loss = epoch(test_loader, model_cnn_robust)\n"
                "    epoch(train_loader, model_cnn_robust, opt)\n")
    assert _pairs(src) == sorted([("TK302", 24), ("TK302", 25)] + TRAINS)
    # `opt=None` and `opt=False` written out switch it off too; a value the linter cannot read does not
    for call, found in (("opt=None", []), ("None", []), ("opt=False", []),
                        ("opt=maybe_opt", [("TK302", 24), ("TK302", 25)])):
        src = _swap(TUTORIAL, "epoch(test_loader, model_cnn_robust)", f"epoch(test_loader, model_cnn_robust, {call})")
        assert _pairs(src) == sorted(found + TRAINS), call


def test_an_epoch_whose_name_is_used_otherwise_stays_a_training_loop() -> None:
    after = "    adv_err, adv_loss = epoch_adversarial(test_loader, model_cnn_robust, pgd_linf)\n"
    for use in ("    run(fn=epoch)\n", "    results = map(epoch, loaders)\n"):
        assert _pairs(_swap(TUTORIAL, after, after + use)) == sorted([("TK302", 24), ("TK302", 25)] + TRAINS), use
    # no call at all (a module of helpers others import): nothing says how it is called
    src = TUTORIAL.replace("    test_err, test_loss = epoch(test_loader, model_cnn_robust)\n", "")
    assert _pairs(src) == sorted([("TK302", 24), ("TK302", 25)] + TRAINS)
    # a second `def epoch`: which one runs is not read
    assert _pairs(TUTORIAL + "\nif fast:\n    def epoch(loader, model, opt=None):\n        pass\n") == sorted(
        [("TK302", 24), ("TK302", 25)] + TRAINS)


def test_a_method_run_only_for_validation_is_evaluation() -> None:
    src = """
    import torch

    class Trainer:
        def run_epoch(self, loader, train=False):
            for x, y in loader:
                loss = self.crit(self.model(x), y)
                if train:
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()
                self.losses.append(loss.item())

        def validate(self):
            self.run_epoch(self.val_loader)
            self.run_epoch(self.test_loader, train=False)
    """
    assert _pairs(src) == []
    assert _pairs(src + "\n        def fit(self):\n            self.run_epoch(self.train_loader, train=True)\n") == [
        ("TK302", 12)]
