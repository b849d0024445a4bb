"""Regressions from linting real training scripts (steps and schedules: TK202, TK109).

Like test_real_scripts.py: each snippet is a minimal rewrite, in our own words, of the shape
found in the cited script; the comment says where, what the linter said, and what it should say.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


# --------------------------------------------------------------------------- TK202

# A multi-task text classifier found by code search: `if scaler.is_enabled(): scaler.scale(l).backward()
# else: l.backward()`, then, under the step's `if`, `if scaler.is_enabled(): scaler.step(opt) ...
# else: optimizer.step()`. Two `if`s on one call were never taken as the same test, so the plain
# `optimizer.step()` was reported as stepping scaled gradients.
def test_two_ifs_on_scaler_is_enabled_are_the_same_test() -> None:
    src = """
    def train(model, loader, optimizer, scaler):
        for x, y in loader:
            loss = model(x, y)
            if scaler.is_enabled():
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if scaler.is_enabled():
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_two_ifs_on_a_call_with_arguments_are_not_the_same_test() -> None:
    src = """
    def train(model, loader, optimizer, scaler, use_scaler):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y)
            if use_scaler(i):
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if use_scaler(i):
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
    """
    assert [code for code, _ in _pairs(src)] == ["TK202"]


# --------------------------------------------------------------------------- TK109

# A student's ML2022 HW7 (BERT question answering) found by code search: accumulation over `accum_iter`
# batches, `scheduler.step()` after the step's `if`, at every batch; but the schedule was built with
# `training_step = num_epoch * (len(train_set) // train_batch_size)`, a count of micro-batches. It
# is walked at the pace it was planned for (the LR only matters at the updates), so nothing runs
# too fast. It was reported as running the schedule `accum_iter` times too fast.
HW7_SHAPE = """
from transformers import get_linear_schedule_with_warmup
def train(model, dataset, loader, optimizer, epochs, batch_size, accum):
    total = epochs * (len(dataset) // batch_size)
    scheduler = get_linear_schedule_with_warmup(optimizer, total // 10, total)
    for i, (x, y) in enumerate(loader):
        (model(x, y) / accum).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
"""


def test_a_schedule_sized_in_micro_batches_stepped_at_every_micro_batch_is_not_reported() -> None:
    assert _pairs(HW7_SHAPE) == []


def test_a_schedule_sized_in_updates_is_still_reported() -> None:
    # transformers' no_trainer scripts: updates per epoch = ceil(len(loader) / n)
    src = HW7_SHAPE.replace("total = epochs * (len(dataset) // batch_size)",
                            "total = epochs * math.ceil(len(loader) / accum)")
    assert _pairs(src) == [("TK109", 11)]


def test_a_schedule_sized_through_an_attribute_named_for_accumulation_is_still_reported() -> None:
    src = """
    import math
    from transformers import get_scheduler
    def train(args, model, loader, optimizer):
        updates_per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)
        args.max_train_steps = args.num_train_epochs * updates_per_epoch
        lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                     num_warmup_steps=args.num_warmup_steps, num_training_steps=args.max_train_steps)
        for step, batch in enumerate(loader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
            lr_scheduler.step()
    """
    assert _pairs(src) == [("TK109", 15)]


def test_a_schedule_of_unknown_size_is_still_reported() -> None:
    src = HW7_SHAPE.replace("total = epochs * (len(dataset) // batch_size)", "total = epochs * 1000")
    assert _pairs(src) == [("TK109", 11)]


def test_a_one_cycle_schedule_over_len_loader_inside_tk_accumulate_is_not_reported() -> None:
    src = """
    import trainkit as tk
    from torch.optim.lr_scheduler import OneCycleLR
    def train(model, loader, optimizer, epochs):
        scheduler = OneCycleLR(optimizer, max_lr=0.1, epochs=epochs, steps_per_epoch=len(loader))
        with tk.accumulate(4, optimizer):
            for x, y in loader:
                model(x, y).backward()
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
    """
    assert _pairs(src) == []


def test_a_size_bound_with_an_annotation_or_by_unpacking_is_followed() -> None:
    # `total: int = ...`, `total, warm = ..., ...` and `scheduler: LRScheduler = ...` were not read as
    # assignments: the size was unknown, and the schedule reported as running `accum` times too fast
    line = "    total = epochs * (len(dataset) // batch_size)\n"
    annotated = HW7_SHAPE.replace(line, "    total: int = epochs * (len(dataset) // batch_size)\n")
    unpacked = HW7_SHAPE.replace(line, "    total, warm = epochs * (len(dataset) // batch_size), 100\n")
    typed = HW7_SHAPE.replace("    scheduler = get_", "    scheduler: LambdaLR = get_")
    for src in (annotated, unpacked, typed):
        assert src != HW7_SHAPE
        assert _pairs(src) == [], src
    # sized in updates, however it is bound: still reported
    updates = annotated.replace("(len(dataset) // batch_size)", "math.ceil(len(loader) / accum)")
    assert updates != annotated and _pairs(updates) == [("TK109", 11)]
    updates = unpacked.replace("(len(dataset) // batch_size)", "math.ceil(len(loader) / accum)")
    assert updates != unpacked and _pairs(updates) == [("TK109", 11)]
