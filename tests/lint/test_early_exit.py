"""Accumulation guarded by an early exit (``if ... % n != 0: continue``) or by a named test.

pytorch-image-models (timm) writes its train loop's accumulation as
``need_update = last_batch or (batch_idx + 1) % accum_steps == 0`` and then
``if need_update: ...`` / ``if not need_update: continue``; other scripts skip the step
with ``if (i + 1) % n != 0: continue``. Each shape once gave no finding at all; the
near-misses next to them (a data filter's ``continue``, an eval loop) must stay clean.
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _fixes(source: str) -> Dict[str, str]:
    return {f.code: f.fix for f in lint_source(textwrap.dedent(source), ignore="TK112")}


# --------------------------------------------------------------------------- early exit

CONTINUE = """
def train(model, loader, optimizer, loss_fn, accum_steps=4):
    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        if (i + 1) % accum_steps != 0:
            continue
        optimizer.step()
        optimizer.zero_grad()
"""


def test_step_behind_a_modulo_continue_accumulates_tk102() -> None:
    assert _pairs(CONTINUE) == [("TK102", 5)]


def test_step_behind_a_modulo_continue_with_the_loss_divided_is_clean() -> None:
    assert _pairs(CONTINUE.replace("loss = loss_fn(model(x), y)", "loss = loss_fn(model(x), y) / accum_steps")) == []


def test_else_continue_guards_the_rest_like_the_if_body() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            model(x, y).backward()
            if (i + 1) % n == 0:
                pass
            else:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK102", 4)]


def test_zero_grad_every_micro_batch_before_a_modulo_continue_is_tk103() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = model(x, y) / n
            loss.backward()
            if (i + 1) % n != 0:
                continue
            optimizer.step()
    """
    assert _pairs(src) == [("TK103", 4)]
    assert "below `if (i + 1) % n != 0: continue` (line 7) with the step" in _fixes(src)["TK103"]


def test_clip_before_a_modulo_continue_is_tk107_and_after_it_is_clean() -> None:
    before = """
    from torch.nn.utils import clip_grad_norm_
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % n != 0:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(before) == [("TK107", 6)]
    assert _fixes(before)["TK107"].startswith("move it below `if (i + 1) % n != 0: continue` (line 7) with the step")
    after = """
    from torch.nn.utils import clip_grad_norm_
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n != 0:
                continue
            clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(after) == []


def test_zero_based_index_behind_a_continue_is_tk108_with_the_operator_as_written() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if i % n != 0:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK108", 5)]
    assert _fixes(src)["TK108"].startswith("`(i + 1) % n != 0`")


def test_training_only_every_kth_batch_behind_a_continue_is_not_accumulation() -> None:
    # the backward runs on the same batches as the step: nothing is summed
    src = """
    def train(model, loader, optimizer, k):
        for i, (x, y) in enumerate(loader):
            if i % k != 0:
                continue
            optimizer.zero_grad()
            model(x, y).backward()
            optimizer.step()
    """
    assert _pairs(src) == []


def test_wgan_generator_behind_a_continue_is_not_accumulation() -> None:
    src = """
    def train(generator, discriminator, loader, opt_D, opt_G, n_critic):
        for i, imgs in enumerate(loader):
            opt_D.zero_grad()
            discriminator(imgs).mean().backward()
            opt_D.step()
            if i % n_critic != 0:
                continue
            opt_G.zero_grad()
            (-discriminator(generator(imgs)).mean()).backward()
            opt_G.step()
    """
    assert _pairs(src) == []


# --------------------------------------------------------------------------- named tests (timm)

TIMM = """
def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
    last_idx = len(loader) - 1
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        output = model(input)
        loss = loss_fn(output, target)
        loss.backward()
        if need_update:
            optimizer.step()
        if not need_update:
            continue
        optimizer.zero_grad()
"""


def test_timm_named_test_with_a_last_batch_or_accumulates_tk102() -> None:
    assert _pairs(TIMM) == [("TK102", 9)]


def test_timm_named_test_with_the_loss_divided_by_the_full_count_is_tk110() -> None:
    # `last_batch or ...` also steps on a short last window, whose losses are still divided by accum_steps
    assert _pairs(TIMM.replace("loss = loss_fn(output, target)", "loss = loss_fn(output, target) / accum_steps")) == [
        ("TK110", 8)]


def test_timm_named_test_with_the_count_set_for_the_last_window_is_clean() -> None:
    # timm's own loop: accum_steps becomes the last window's size before that window starts
    src = """
    def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
        last_accum_steps = len(loader) % accum_steps
        last_idx = len(loader) - 1
        last_idx_to_accum = len(loader) - last_accum_steps
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_idx
            need_update = last_batch or (batch_idx + 1) % accum_steps == 0
            if batch_idx >= last_idx_to_accum:
                accum_steps = last_accum_steps
            loss = loss_fn(model(input), target) / accum_steps
            loss.backward()
            if not need_update:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_zero_grad_every_micro_batch_with_the_step_behind_not_need_update_continue_is_tk103() -> None:
    src = """
    def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
        for batch_idx, (input, target) in enumerate(loader):
            need_update = (batch_idx + 1) % accum_steps == 0
            optimizer.zero_grad()
            loss = loss_fn(model(input), target) / accum_steps
            loss.backward()
            if not need_update:
                continue
            optimizer.step()
    """
    assert _pairs(src) == [("TK103", 5)]
    assert "below `if not need_update: continue` (line 8) with the step" in _fixes(src)["TK103"]
    fixed = """
    def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
        for batch_idx, (input, target) in enumerate(loader):
            need_update = (batch_idx + 1) % accum_steps == 0
            loss = loss_fn(model(input), target) / accum_steps
            loss.backward()
            if not need_update:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(fixed) == []


def test_named_zero_based_test_is_tk108_at_the_assignment() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for step, (x, y) in enumerate(loader):
            do_step = step % n == 0
            (model(x, y) / n).backward()
            if do_step:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK108", 4)]


def test_a_name_bound_twice_in_the_iteration_is_not_followed() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            need_update = (i + 1) % n == 0
            model(x, y).backward()
            need_update = True
            if need_update:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


# --------------------------------------------------------------------------- near-misses

def test_a_data_filter_continue_does_not_make_a_loop_accumulate() -> None:
    src = """
    def train(model, loader, optimizer, loss_fn):
        for i, (x, y) in enumerate(loader):
            if x is None:
                continue
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_a_data_filter_continue_does_not_hide_a_wiping_zero_grad() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            if x is None:
                continue
            optimizer.zero_grad()
            (model(x, y) / n).backward()
            if (i + 1) % n == 0:
                optimizer.step()
    """
    assert _pairs(src) == [("TK103", 6)]


def test_an_eval_loop_with_a_continue_is_not_a_training_loop() -> None:
    src = """
    import torch
    def evaluate(model, loader, log_every):
        with torch.no_grad():
            for i, (x, y) in enumerate(loader):
                if x is None:
                    continue
                out = model(x)
                if i % log_every != 0:
                    continue
                print(out.shape)
    """
    assert _pairs(src) == []


def test_a_periodic_continue_after_the_step_is_not_accumulation() -> None:
    src = """
    def train(model, loader, optimizer, log_every, log):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if i % log_every != 0:
                continue
            log(i)
    """
    assert _pairs(src) == []


def test_a_sync_behind_a_periodic_continue_is_logging_not_tk302() -> None:
    src = """
    import torch
    def train(model, loader, optimizer, log_every):
        for i, (x, y) in enumerate(loader):
            loss = model(x.cuda(), y.cuda())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if i % log_every != 0:
                continue
            print(f"{i}: {loss.item()}")
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("i % log_every != 0", "x is None")) == [("TK302", 11)]
