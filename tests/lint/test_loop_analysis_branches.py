"""Which branches exclude each other and which conditions are real (TK202, TK201, TK301).

Two ``if``s on the same unchanged flag (optional AMP), ``match`` case bodies and a ``match`` on a
modulo, a device check that is no condition, and where ``scaler.update()`` may be next to one
``scaler.step()`` per optimizer. Each correct loop here was once reported as a mistake (or a
mistake was missed); the planted-mistake variants next to them keep the rules from going quiet.
"""
from __future__ import annotations

import sys

import pytest

from tests.lint._loop_analysis_helpers import _pairs

# The lint parses with the running Python's grammar: before 3.10 a ``match`` is a syntax error.
needs_match = pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements need Python 3.10+")


# --------------------------------------------------------------------------- TK202: exclusive branches


AMP_TWO_IFS = """
import torch
def train(model, loader, optimizer, use_amp, accum=4):
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (i + 1) % accum == 0:
            if use_amp:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
"""


def test_optional_amp_in_two_ifs_on_the_same_flag_is_exclusive() -> None:
    assert _pairs(AMP_TWO_IFS) == []


def test_two_ifs_are_not_exclusive_when_the_flag_changes_between_them() -> None:
    changed = AMP_TWO_IFS.replace("        if (i + 1) % accum == 0:\n", "        use_amp = i > 10\n        if (i + 1) % accum == 0:\n")
    assert _pairs(changed) == [("TK202", 17)]
    # A test that calls something may answer differently the second time.
    called = AMP_TWO_IFS.replace("if use_amp:", "if coin():")
    assert _pairs(called) == [("TK202", 16)]


def test_a_plain_step_after_unscale_is_worded_for_unscaled_gradients() -> None:
    """After ``scaler.unscale_(optimizer)`` (to clip) the gradients are no longer scaled: the
    finding said they were; what is wrong then is that inf/NaN steps are taken and the scale is
    fixed."""
    from trainkit.lint import lint_source

    src = """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(criterion(model(x), y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
"""
    found = [f for f in lint_source(src) if f.code == "TK202"]
    assert [f.line for f in found] == [8]
    assert "unscaled the gradients" in found[0].message and "still multiplied" not in found[0].message
    plain = [f for f in lint_source(src.replace("    scaler.unscale_(optimizer)\n", "")) if f.code == "TK202"]
    assert [f.line for f in plain] == [7] and "still multiplied by the loss scale" in plain[0].message


# --------------------------------------------------------------------------- conditions: match, device checks


@needs_match
def test_match_case_bodies_are_conditional() -> None:
    src = """
    import gc
    def train(model, loader, optimizer, phase):
        for batch in loader:
            loss = model(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            match phase:
                case "end_of_epoch":
                    gc.collect()
                case _:
                    pass
    """
    assert _pairs(src) == []


@needs_match
def test_match_on_a_modulo_is_an_accumulation_guard() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        match i % 4:
            case 3:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK102", 4)]


def test_a_device_check_is_not_a_condition() -> None:
    src = """
    import gc
    import torch
    def train(model, loader, optimizer, device):
        for x, y in loader:
            loss = model(x.to(device), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if device.type == "cuda":
                gc.collect()
    """
    assert _pairs(src) == [("TK301", 11), ("TK301", 13)]
    assert _pairs(src.replace('device.type == "cuda"', "step % 100 == 0")) == [("TK301", 11)]


# --------------------------------------------------------------------------- TK201: where update() may be


def test_scaler_step_per_optimizer_with_one_update_in_the_batch_loop() -> None:
    src = """
    import torch
    def train(model, loader, optimizers):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            for opt in optimizers:
                opt.zero_grad()
            scaler.scale(model(x, y)).backward()
            for opt in optimizers:
                scaler.step(opt)
            scaler.update()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("            scaler.update()\n", "")) == [("TK201", 10)]


def test_scaler_step_per_optimizer_in_a_train_step_function() -> None:
    src = """
    def train_step(scaler, loss, optimizers):
        scaler.scale(loss).backward()
        for opt in optimizers:
            scaler.step(opt)
        scaler.update()
    """
    assert _pairs(src) == []


def test_update_once_after_the_whole_batch_loop_is_still_tk201() -> None:
    src = """
    for x, y in loader:
        scaler.scale(model(x, y)).backward()
        scaler.step(optimizer); optimizer.zero_grad()
    scaler.update()
    """
    assert _pairs(src) == [("TK201", 4)]
