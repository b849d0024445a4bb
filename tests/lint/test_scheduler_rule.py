"""TK109: an LR scheduler stepped at every micro-batch of an accumulation (hand-written or tk.accumulate).

Each snippet is linted with every rule, so a finding list also shows that no other rule fires
on the otherwise correct loop.
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _texts(source: str) -> Dict[int, str]:
    return {f.line: f"{f.message}; fix: {f.fix}" for f in lint_source(textwrap.dedent(source), select="TK109")}


# --------------------------------------------------------------------------- hand-written: found

AFTER_THE_IF = """
from transformers import get_linear_schedule_with_warmup

def train(model, loader, optimizer, accum_steps):
    scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
"""


def test_hand_written_scheduler_after_the_steps_if_is_found() -> None:
    assert _pairs(AFTER_THE_IF) == [("TK109", 12)]
    text = _texts(AFTER_THE_IF)[12]
    assert "`scheduler.step()` runs on every micro-batch but the step (line 10) runs every `accum_steps`" in text
    assert "runs `accum_steps` times too fast" in text and "is over after K/`accum_steps`" in text
    assert "fix: move `scheduler.step()` under the same `if` as the step, right after it" in text
    assert "if acc.stepped: scheduler.step()" in text


BEFORE_AN_EARLY_EXIT = """
import torch

def train(model, loader, optimizer):
    sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=1000)
    for i, (x, y) in enumerate(loader):
        (model(x, y) / 4).backward()
        sched.step()
        if (i + 1) % 4 != 0:
            continue
        optimizer.step()
        optimizer.zero_grad()
"""


def test_hand_written_scheduler_before_an_early_exit_is_found_and_told_to_go_below_it() -> None:
    assert _pairs(BEFORE_AN_EARLY_EXIT) == [("TK109", 8)]
    text = _texts(BEFORE_AN_EARLY_EXIT)[8]
    assert "runs 4 times too fast: a warm-up or decay planned over K updates is over after K/4" in text
    assert "move `sched.step()` below `if (i + 1) % 4 != 0: continue` (line 9) with the step" in text


BY_NAME_UNDER_A_NONE_CHECK = """
def train(self, loader, n):
    for step, batch in enumerate(loader, 1):
        loss = self.model(batch) / n
        loss.backward()
        if step % n == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
"""


def test_scheduler_known_by_name_under_an_if_about_itself_is_found() -> None:
    # `if self.lr_scheduler is not None:` takes the same branch at every micro-batch
    assert _pairs(BY_NAME_UNDER_A_NONE_CHECK) == [("TK109", 10)]


# --------------------------------------------------------------------------- hand-written: clean

UNDER_THE_SAME_IF = """
from transformers import get_cosine_schedule_with_warmup

def train(model, loader, optimizer, accum_steps):
    scheduler = get_cosine_schedule_with_warmup(optimizer, 100, 1000)
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
"""

BELOW_THE_EARLY_EXIT = """
def train(model, loader, optimizer, scheduler):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / 4).backward()
        if (i + 1) % 4 != 0:
            continue
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
"""

UNDER_A_NAMED_TEST = """
def train(model, loader, optimizer, lr_scheduler, n):
    last = len(loader) - 1
    for i, (x, y) in enumerate(loader):
        need_update = i == last or (i + 1) % n == 0
        (model(x, y) / n).backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
            lr_scheduler.step()
"""

ONCE_PER_EPOCH = """
import torch

def train(model, loader, optimizer, epochs):
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / 4).backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        scheduler.step()
"""

PLATEAU_AFTER_VALIDATION = """
import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau

def train(model, loader, val_loader, optimizer, epochs):
    scheduler = ReduceLROnPlateau(optimizer, "min")
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / 4).backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        with torch.no_grad():
            val_loss = sum(model(x, y) for x, y in val_loader)
        scheduler.step(val_loss)
"""

NO_ACCUMULATION = """
import torch

def train(model, loader, optimizer):
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=1000)
    for x, y in loader:
        model(x, y).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
"""

OTHER_SCHEDULES = """
def train(model, loader, optimizer, noise_scheduler, beta_scheduler, scheduler, n):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        beta_scheduler.step()
        scheduler.step(i // n)
        if (i + 1) % n == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

GAN_DISCRIMINATOR_EVERY_BATCH = """
import torch

def train(G, D, loader, opt_G, opt_D, n):
    sched_D = torch.optim.lr_scheduler.StepLR(opt_D, step_size=10)
    sched_G = torch.optim.lr_scheduler.StepLR(opt_G, step_size=10)
    for i, x in enumerate(loader):
        opt_D.zero_grad()
        D(x).mean().backward()
        opt_D.step()
        sched_D.step()
        (G(x).mean() / n).backward()
        if (i + 1) % n == 0:
            opt_G.step()
            sched_G.step()
            opt_G.zero_grad()
"""


def test_hand_written_clean_cases_have_no_findings() -> None:
    for source in (UNDER_THE_SAME_IF, BELOW_THE_EARLY_EXIT, ONCE_PER_EPOCH,
                   PLATEAU_AFTER_VALIDATION, NO_ACCUMULATION, OTHER_SCHEDULES, GAN_DISCRIMINATOR_EVERY_BATCH):
        assert _pairs(source) == [], source
    # the schedule is stepped right; the short last window divided by the full n is TK110's
    assert _pairs(UNDER_A_NAMED_TEST) == [("TK110", 6)]


def test_a_gan_generator_schedule_at_every_batch_is_still_found() -> None:
    # sched_G belongs to opt_G, which steps every n batches: stepping it at every batch is TK109
    source = GAN_DISCRIMINATOR_EVERY_BATCH.replace(
        "        sched_D.step()\n", "        sched_D.step()\n        sched_G.step()\n")
    assert _pairs(source) == [("TK109", 12)]


# --------------------------------------------------------------------------- tk.accumulate: found

TK_EVERY_MICRO_BATCH = """
import trainkit as tk

def train(model, loader, optimizer, scheduler):
    with tk.accumulate(4, optimizer) as acc:
        for x, y in loader:
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
"""


def test_scheduler_at_every_micro_batch_inside_tk_accumulate_is_found() -> None:
    assert _pairs(TK_EVERY_MICRO_BATCH) == [("TK109", 10)]
    text = _texts(TK_EVERY_MICRO_BATCH)[10]
    assert "`scheduler.step()` runs at every micro-batch inside `tk.accumulate(4, ...)` (line 5)" in text
    assert "`optimizer.step()` (line 8) really steps only at the end of each window of `4` micro-batches" in text
    assert "runs 4 times too fast" in text
    assert "fix: step it only when a window ended: `if acc.stepped: scheduler.step()` right after `optimizer.step()`" in text


TK_UNBOUND_WITH_AMP = """
import torch
from trainkit import accumulate, autocast_scaled

def train(model, loader, optimizer, scaler, steps):
    lr_sched = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=steps)
    with accumulate(8, optimizer):
        for x, y in loader:
            with autocast_scaled(scaler) as amp:
                loss = model(x, y)
            amp.backward(loss)
            amp.step(optimizer)
            optimizer.zero_grad()
            if lr_sched is not None:
                lr_sched.step()
"""


def test_scheduler_inside_an_unbound_accumulate_block_with_amp_step_is_found() -> None:
    assert _pairs(TK_UNBOUND_WITH_AMP) == [("TK109", 15)]
    text = _texts(TK_UNBOUND_WITH_AMP)[15]
    assert "inside `accumulate(8, ...)` (line 7), where `amp.step(optimizer)` (line 12)" in text
    assert "`if acc.stepped: lr_sched.step()`" in text and "binding the block with `with accumulate(...) as acc:`" in text


# --------------------------------------------------------------------------- tk.accumulate: clean

TK_UNDER_STEPPED = """
import trainkit as tk

def train(model, loader, optimizer, scheduler):
    with tk.accumulate(4, optimizer) as acc:
        for x, y in loader:
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if acc.stepped:
                scheduler.step()
"""

TK_BOUNDARY_BEFORE_THE_STEP = """
import trainkit as tk

def train(model, loader, optimizer, scheduler):
    with tk.accumulate(4, optimizer) as acc:
        for x, y in loader:
            model(x, y).backward()
            if acc.boundary:
                scheduler.step()
            optimizer.step()
            optimizer.zero_grad()
"""

TK_ONCE_PER_EPOCH = """
import trainkit as tk

def train(model, loader, optimizer, scheduler, epochs):
    for epoch in range(epochs):
        with tk.accumulate(4, optimizer):
            for x, y in loader:
                model(x, y).backward()
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()
"""

ACCELERATE_ACCUMULATE = """
def train(accelerator, model, loader, optimizer, lr_scheduler):
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x, y))
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
"""


def test_tk_accumulate_clean_cases_have_no_findings() -> None:
    # accelerate's prepared scheduler steps only where the gradients are synced
    for source in (TK_UNDER_STEPPED, TK_BOUNDARY_BEFORE_THE_STEP, TK_ONCE_PER_EPOCH, ACCELERATE_ACCUMULATE):
        assert _pairs(source) == [], source


def test_scheduler_finding_can_be_silenced() -> None:
    source = AFTER_THE_IF.replace("        scheduler.step()\n", "        scheduler.step()  # trainkit: ignore[TK109]\n")
    assert _pairs(source) == []


def test_a_scheduler_built_with_an_annotation_is_known_by_construction() -> None:
    # `warm` is no scheduler's name: only its constructor says so, once read through `x: T = ...` too
    src = AFTER_THE_IF.replace("    scheduler = get_", "    warm: LambdaLR = get_").replace("scheduler.step()", "warm.step()")
    assert "warm: LambdaLR" in src and "warm.step()" in src
    assert _pairs(src) == [("TK109", 12)]
