"""Functions defined in the loop body and called there (timm's ``_forward()`` / ``_backward(loss)``).

huggingface/pytorch-image-models train.py, train_one_epoch (rewritten below in our own words): the
batch loop's body defines ``_forward()`` (forward under autocast, ``loss /= accum_steps``, ``return
loss``) and ``_backward(_loss)`` (backward, then clip and ``optimizer.step()`` under ``if
need_update:``), and calls them in both branches of ``if has_no_sync and not need_update:``. Seen
through the calls only, the loop's step, backward and division were hidden: the loop was a training
loop for TK301/TK302, but a copy of it that wiped the gradients on every micro-batch, clipped
partial sums, or never divided the loss got no finding. Each call is now read as the function's
body written there; timm's own loop stays clean (but for its per-micro-batch ``loss.item()``).
"""
from __future__ import annotations

import ast
import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source
from trainkit.lint._core import FileContext


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _swap(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


TIMM = """
import torch

def train_one_epoch(model, loader, optimizer, loss_fn, args, losses_m, amp_autocast, loss_scaler):
    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    has_no_sync = hasattr(model, "no_sync")
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps

        def _forward():
            with amp_autocast():
                loss = loss_fn(model(input), target)
            if accum_steps > 1:
                loss /= accum_steps
            return loss

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(_loss, optimizer, clip_grad=args.clip_grad, need_update=need_update)
            else:
                _loss.backward(create_graph=False)
                if need_update:
                    if args.clip_grad is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
                    optimizer.step()

        if has_no_sync and not need_update:
            with model.no_sync():
                loss = _forward()
                _backward(loss)
        else:
            loss = _forward()
            _backward(loss)

        if not args.distributed:
            losses_m.update(loss.item() * accum_steps, input.size(0))

        if not need_update:
            continue

        optimizer.zero_grad()
"""


def test_timm_s_own_loop_reports_only_its_per_micro_batch_sync() -> None:
    assert _pairs(TIMM) == [("TK302", 43)]


def test_a_wipe_of_the_accumulated_gradients_in_a_timm_shaped_loop_is_found() -> None:
    src = _swap(TIMM, "        if not need_update:\n            continue\n",
                "        optimizer.zero_grad()\n        if not need_update:\n            continue\n")
    assert ("TK103", 45) in _pairs(src)


def test_an_undivided_or_late_divided_loss_in_timm_s_step_function_is_found() -> None:
    undivided = _swap(TIMM, "            if accum_steps > 1:\n                loss /= accum_steps\n", "")
    assert _pairs(undivided) == [("TK102", 26), ("TK302", 41)]
    (finding,) = [f for f in lint_source(textwrap.dedent(undivided)) if f.code == "TK102"]
    # named as the caller's value: `_backward(loss)` takes the gradient of `loss`
    assert "but `loss` is never divided" in finding.message
    late = _swap(undivided, "_loss.backward(create_graph=False)\n",
                 "_loss.backward(create_graph=False)\n                _loss /= accum_steps\n")
    assert _pairs(late) == [("TK101", 27), ("TK302", 42)]


def test_a_clip_on_every_micro_batch_inside_timm_s_step_function_is_found() -> None:
    src = _swap(TIMM, "_loss.backward(create_graph=False)\n",
                "_loss.backward(create_graph=False)\n                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")
    assert ("TK107", 29) in _pairs(src)


def test_a_division_at_the_call_counts_before_the_inlined_backward() -> None:
    # the copies are ordered at their calls: `loss = _forward() / n` comes before `_backward(loss)`
    src = """
    def fit(net, batches, opt, crit, n):
        for j, (a, b) in enumerate(batches):
            def _forward():
                return crit(net(a), b)

            def _backward(_loss):
                _loss.backward()
                if (j + 1) % n == 0:
                    opt.step()
                    opt.zero_grad()

            loss = _forward() / n
            _backward(loss)
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "loss = _forward() / n", "loss = _forward()")) == [("TK102", 8)]


def test_functions_used_otherwise_are_not_inlined() -> None:
    # an LBFGS closure passed to the step is only called by it: its body is not the loop's
    closure = """
    def fit(net, batches, opt, crit, n):
        for j, (a, b) in enumerate(batches):
            def closure():
                opt.zero_grad()
                loss = crit(net(a), b)
                loss.backward()
                return loss
            if (j + 1) % n == 0:
                opt.step(closure)
    """
    assert _pairs(closure) == []
    tree = ast.parse(textwrap.dedent(closure))
    FileContext("t.py", "", tree)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "closure" for n in ast.walk(tree))
    # an early return, a call used in an expression, or `*args`: left as they were
    for old, new in (("return loss", "if loss is None:\n                    return None\n                return loss"),
                     ("opt.step(closure)", "opt.step(lambda: closure())"),
                     ("def closure():", "def closure(*args):")):
        tree = ast.parse(textwrap.dedent(_swap(closure, old, new)))
        FileContext("t.py", "", tree)
        assert any(isinstance(n, ast.FunctionDef) and n.name == "closure" for n in ast.walk(tree)), new


def test_an_inlined_body_keeps_its_lines_and_its_suppressions() -> None:
    src = _swap(TIMM, "            if accum_steps > 1:\n                loss /= accum_steps\n", "")
    src = _swap(src, "_loss.backward(create_graph=False)\n", "_loss.backward(create_graph=False)  # trainkit: ignore[TK102]\n")
    assert _pairs(src) == [("TK302", 41)]
