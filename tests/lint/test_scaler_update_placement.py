"""TK201: what a missing ``scaler.update()`` does, and where an update is too late.

With torch's ``GradScaler`` the second ``scaler.step(opt)`` without an ``update()`` in between
raises ``RuntimeError: step() has already been called since the last update()``: the run crashes,
it does not go on skipping steps silently as the message said. And an ``update()`` once per epoch,
after the batch loop, does not follow each step: it silenced TK201 because every call of the
enclosing loops counted."""
from __future__ import annotations

import textwrap

from trainkit.lint import lint_source

PER_EPOCH = """
import torch
def train(model, loader, optimizer, epochs=10):
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x.cuda(), y.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()
"""


def _found(src: str) -> list:
    return lint_source(textwrap.dedent(src))


def test_message_says_the_second_step_raises() -> None:
    (finding,) = _found(PER_EPOCH.replace("        scaler.update()\n", ""))
    assert finding.code == "TK201"
    assert "RuntimeError" in finding.message and "step() has already been called since the last update()" \
        in finding.message
    assert "never shrinks" not in finding.message and "keep being skipped" not in finding.message


def test_update_once_per_epoch_after_the_batch_loop_is_tk201() -> None:
    (finding,) = _found(PER_EPOCH)
    assert (finding.code, finding.line) == ("TK201", 10)
    assert "line 12" in finding.message and "once per pass" in finding.message


def test_update_per_batch_inside_an_epoch_loop_is_clean() -> None:
    src = PER_EPOCH.replace("        scaler.update()\n", "").replace(
        "scaler.step(optimizer)\n", "scaler.step(optimizer)\n            scaler.update()\n")
    assert _found(src) == []


def test_loop_over_optimizers_nested_in_a_loop_over_optimizers() -> None:
    src = """
    import torch
    def train(model, loader, groups):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            scaler.scale(model(x, y)).backward()
            for i, opt in enumerate(groups.optimizers):
                scaler.step(opt)
            scaler.update()
    """
    assert _found(src) == []


def test_steps_in_an_inner_loop_that_is_no_loop_over_optimizers() -> None:
    # several steps per batch, one update per batch: the second step raises
    src = """
    import torch
    def train(model, loader, optimizer, k):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            for _ in range(k):
                scaler.scale(model(x, y)).backward()
                scaler.step(optimizer); optimizer.zero_grad()
            scaler.update()
    """
    assert [(f.code, f.line) for f in _found(src)] == [("TK201", 8)]
