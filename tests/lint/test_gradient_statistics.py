"""A loop of backwards that reads the parameters' gradients and trains nothing is no training loop.

EWC's Fisher estimate and a per-parameter gradient-norm probe run ``loss.backward()`` on every
batch and read ``p.grad``, but no optimizer steps and no parameter is updated by hand: TK301/TK302
have no training step to report in. Each silent case also checks that the same loop reported
when it does train (a step, however spelled; an update by hand; inside code that steps), so that the
reading, not a blind spot, keeps it quiet.
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


# EWC's diagonal Fisher estimate, as van de Ven's continual-learning code writes it (with a log line
# and a cache flush added)
FISHER = """
import torch
import torch.nn.functional as F

def estimate_fisher(model, data_loader, n_samples=None):
    est_fisher_info = {}
    for n, p in model.named_parameters():
        est_fisher_info[n.replace('.', '__')] = p.detach().clone().zero_()
    model.eval()
    for index, (x, y) in enumerate(data_loader):
        if n_samples is not None and index >= n_samples:
            break
        output = model(x.to(device))
        label = output.max(1)[1]
        negloglikelihood = F.nll_loss(F.log_softmax(output, dim=1), label)
        model.zero_grad()
        negloglikelihood.backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                est_fisher_info[n.replace('.', '__')] += p.grad.detach() ** 2
        print(f"batch {index}: {negloglikelihood.item():.3f}")
        torch.cuda.empty_cache()
    return {n: p / index for n, p in est_fisher_info.items()}
"""
FISHER_FOUND = [("TK301", 22), ("TK302", 21)]
GRAD_READ = "                est_fisher_info[n.replace('.', '__')] += p.grad.detach() ** 2\n"


def test_an_ewc_fisher_estimate_is_no_training_loop() -> None:
    assert _pairs(FISHER) == []
    # without reading the gradients, a loop of backwards may train through them: reported
    assert _pairs(_swap(FISHER, GRAD_READ, "                pass\n")) == FISHER_FOUND


def test_a_fisher_loop_that_steps_however_spelled_is_a_training_loop() -> None:
    after = "        model.zero_grad()\n"
    for step in ("optimizer.step()", "scaler.step(optimizer)", "optimizer.step(closure)", "model_engine.step()",
                 "optimizer_step(model)", "self.update()"):
        src = _swap(FISHER, after, f"        {step}\n" + after)
        assert _pairs(src, "TK3") == [("TK301", 23), ("TK302", 22)], step
    # through a step function of the file
    src = FISHER + "\ndef train_step(model, x, y):\n    crit(model(x), y).backward()\n    optimizer.step()\n"
    assert _pairs(_swap(src, after, "        train_step(model, x, label)\n" + after)) == [("TK301", 23), ("TK302", 22)]


def test_a_loop_updating_the_parameters_by_hand_is_a_training_loop() -> None:
    # PyTorch's tutorials train without an optimizer: `w -= lr * w.grad`, `f.data.sub_(...)`, ...
    updates = ["                p -= 0.01 * p.grad\n",
               "                p.data.sub_(p.grad.data * 0.01)\n",
               "                p.data.add_(p.grad, alpha=-0.01)\n",
               "                p.data = p.data - 0.01 * p.grad\n",
               "                p.copy_(p - 0.01 * p.grad)\n",
               "                g = p.grad\n                w = p\n                w.data -= 0.01 * g\n"]
    for update in updates:
        src = _swap(FISHER, GRAD_READ, update)
        shift = update.count("\n") - 1
        assert _pairs(src) == [("TK301", 22 + shift), ("TK302", 21 + shift)], update
    src = _swap(FISHER, "        torch.cuda.empty_cache()\n",
                "        torch._foreach_add_(params, [q.grad for q in params], alpha=-0.01)\n"
                "        torch.cuda.empty_cache()\n")
    assert _pairs(src) == [("TK301", 23), ("TK302", 21)]
    # a clipped or scaled backward is one of a training step's
    src = _swap(FISHER, "        torch.cuda.empty_cache()\n",
                "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        torch.cuda.empty_cache()\n")
    assert _pairs(src) == [("TK301", 23), ("TK302", 21)]
    src = _swap(FISHER, "        negloglikelihood.backward()\n", "        scaler.scale(negloglikelihood).backward()\n")
    assert _pairs(src) == FISHER_FOUND


# avalanche's EWC importances: `optimizer.zero_grad()` (never a step), `imp.data +=` an entry of its own
AVALANCHE = """
import torch

def compute_importances(model, criterion, optimizer, dataloader, device):
    importances = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i, batch in enumerate(dataloader):
        x, y = batch[0].to(device), batch[1].to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        for (k1, p), (k2, imp) in zip(model.named_parameters(), importances.items()):
            if p.grad is not None:
                imp.data += p.grad.data.clone().pow(2)
        losses.append(loss.item())
    return importances
"""

# a per-parameter gradient-norm probe
PROBE = """
import gc

def grad_norm_probe(model, loader, criterion, n_batches=10):
    norms = {}
    for i, (x, y) in enumerate(loader):
        if i == n_batches:
            break
        model.zero_grad(set_to_none=True)
        criterion(model(x.cuda()), y.cuda()).backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                norms.setdefault(name, []).append(p.grad.norm().item())
        pbar.update(1)
        gc.collect()
    return norms
"""


def test_importances_and_a_grad_norm_probe_are_no_training_loops() -> None:
    assert _pairs(AVALANCHE) == []
    assert _pairs(_swap(AVALANCHE, "        optimizer.zero_grad()\n",
                        "        optimizer.step()\n        optimizer.zero_grad()\n")) == [("TK302", 15)]
    assert _pairs(PROBE) == []
    assert _pairs(_swap(PROBE, "        pbar.update(1)\n", "        optimizer.step()\n")) == [
        ("TK301", 15), ("TK302", 13)]


def test_the_fisher_loop_after_the_training_pass_of_a_task_loop() -> None:
    # EWC inline: each task trains, then estimates the Fisher over its data; only the training pass
    # is a training loop, and the task loop around both is none for the Fisher's backward
    src = """
    import torch

    for task, loader in enumerate(tasks):
        for x, y in loader:
            optimizer.zero_grad()
            loss = crit(model(x), y) + ewc_penalty(model)
            loss.backward()
            optimizer.step()
            print(loss.item())
        for x, y in loader:
            model.zero_grad()
            crit(model(x), y).backward()
            for n, p in model.named_parameters():
                fisher[n] += p.grad ** 2 / len(loader)
            print(loss.item())
        torch.cuda.empty_cache()
    """
    assert _pairs(src) == [("TK302", 10)]


def test_a_gradient_loop_inside_code_that_steps_stays_a_training_loop() -> None:
    # per-sample gradients collected for the step after them (DP-SGD by hand): part of training
    src = """
    import torch

    for x, y in loader:
        summed = [torch.zeros_like(p) for p in params]
        for xi, yi in zip(x, y):
            model.zero_grad()
            crit(model(xi[None]), yi[None]).backward()
            for s, p in zip(summed, params):
                s += p.grad * min(1.0, clip / p.grad.norm().item())
        for s, p in zip(summed, params):
            p.grad = (s + noise * torch.randn_like(s)) / len(x)
        optimizer.step()
    """
    assert _pairs(src) == [("TK302", 10)]


def test_a_loop_around_a_fisher_loop_is_none_for_its_backward() -> None:
    # the Fisher's backward makes no loop around it a training loop: a per-round read and flush are
    # no training step's (the round's `scheduler.step()` may be anything's: it does not count)
    src = """
    import torch

    for rnd in range(3):
        for x, y in loader:
            model.zero_grad()
            crit(model(x), y).backward()
            for n, p in model.named_parameters():
                fisher[n] += p.grad ** 2 / len(loader)
        print(fisher["w"].sum().item())
        torch.cuda.empty_cache()
        scheduler.step()
    """
    assert _pairs(src) == []
