"""TK110: the step also runs on a short last window whose losses are divided by the full n.

Each snippet is linted with every rule, so a finding list also shows that no other rule fires
on the otherwise correct loop.
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, Tuple

import pytest

from trainkit.lint import RULES, lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _texts(source: str) -> Dict[int, str]:
    return {f.line: f"{f.message}; fix: {f.fix}" for f in lint_source(textwrap.dedent(source), select="TK110")}


# --------------------------------------------------------------------------- found

TUTORIAL = """
def train(model, data_loader, criterion, optimizer, accumulation_steps):
    for batch_idx, (inputs, targets) in enumerate(data_loader):
        loss = criterion(model(inputs), targets)
        loss = loss / accumulation_steps
        loss.backward()
        if ((batch_idx + 1) % accumulation_steps == 0) or (batch_idx + 1 == len(data_loader)):
            optimizer.step()
            optimizer.zero_grad()
"""


def test_the_tutorial_shape_is_found_on_the_division_line() -> None:
    assert _pairs(TUTORIAL) == [("TK110", 5)]
    (finding,) = lint_source(textwrap.dedent(TUTORIAL))
    assert finding.severity == "warning" and RULES["TK110"].severity == "warning"
    assert finding.col == 9


def test_the_message_names_the_lines_the_consequence_in_numbers_and_the_fix() -> None:
    text = _texts(TUTORIAL)[5]
    assert text.startswith("`loss = loss / accumulation_steps` divides each micro-batch's loss by `accumulation_steps`, "
                           "but the step (line 8) also runs on the last batch (`batch_idx + 1 == len(data_loader)`, "
                           "line 7)")
    assert "the last window holds k < `accumulation_steps` micro-batches" in text
    assert "its update is only k/`accumulation_steps` of a full one" in text
    assert ("with 10 batches and `accumulation_steps` = 4 the last window holds 2 and its update is half as large"
            in text)
    assert "harmless when the length is a multiple of `accumulation_steps`" in text
    assert ("fix: divide by `min(accumulation_steps, len(data_loader) - (batch_idx // accumulation_steps) * "
            "accumulation_steps)` instead of `accumulation_steps`") in text
    assert "`with tk.accumulate(n, optimizer):`, which divides by the micro-batches actually in each window" in text


@pytest.mark.parametrize(
    ("n", "example"),
    [
        ("4", "with 10 batches the last window holds 2 and its update is half as large"),
        ("8", "with 20 batches the last window holds 4 and its update is half as large"),
        ("3", "with 7 batches the last window holds 1 and its update is 1/3 of a full one"),
    ],
)
def test_a_literal_count_gives_its_own_numbers(n: str, example: str) -> None:
    src = f"""
    def train(model, loader, optimizer):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / {n}
            loss.backward()
            if (i + 1) % {n} == 0 or i == len(loader) - 1:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK110", 4)]
    text = _texts(src)[4]
    assert example in text and f"divide by `min({n}, len(loader) - (i // {n}) * {n})`" in text


LAST_INDEX_NAME = """
def train(model, loader, optimizer, n):
    last_idx = len(loader) - 1
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0 or i == last_idx:
            optimizer.step()
            optimizer.zero_grad()
"""

TIMM_NAMED_TEST = """
def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
    last_batch_idx = len(loader) - 1
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        loss = loss_fn(model(input), target)
        loss /= accum_steps
        loss.backward()
        if not need_update:
            continue
        optimizer.step()
        optimizer.zero_grad()
"""

EARLY_EXIT_DE_MORGAN = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) * (1 / n)
        loss.backward()
        if (i + 1) % n != 0 and i + 1 != len(loader):
            continue
        optimizer.step()
        optimizer.zero_grad()
"""

SCALED = """
import torch

def train(model, loader, optimizer, n):
    scaler = torch.amp.GradScaler("cuda")
    for i, (x, y) in enumerate(loader):
        scaler.scale(model(x, y) / n).backward()
        if (i + 1) % n == 0 or (i + 1) >= len(loader):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
"""

LAST_FLAG = """
def train(model, batches, optimizer, n):
    for i, (x, is_last) in enumerate(batches):
        loss = model(x) / n
        loss.backward()
        if (i + 1) % n == 0 or is_last:
            optimizer.step()
            optimizer.zero_grad()
"""

# transformers' run_glue.py (2019-20): a last step only for an epoch shorter than one window
SHORT_EPOCH = """
def train(model, epoch_iterator, optimizer, args):
    for step, batch in enumerate(epoch_iterator):
        loss = model(**batch)[0]
        loss = loss / args.gradient_accumulation_steps
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0 or (
            len(epoch_iterator) <= args.gradient_accumulation_steps and (step + 1) == len(epoch_iterator)
        ):
            optimizer.step()
            model.zero_grad()
"""


def test_other_last_batch_tests_and_divisions_are_found() -> None:
    assert _pairs(LAST_INDEX_NAME) == [("TK110", 5)]
    assert "`i == last_idx`, line 6" in _texts(LAST_INDEX_NAME)[5]
    assert _pairs(TIMM_NAMED_TEST) == [("TK110", 8)]
    assert "(`batch_idx == last_batch_idx`, line 5)" in _texts(TIMM_NAMED_TEST)[8]
    assert _pairs(EARLY_EXIT_DE_MORGAN) == [("TK110", 4)]
    assert _pairs(SCALED) == [("TK110", 7)]
    assert _pairs(LAST_FLAG) == [("TK110", 4)]
    assert "divide by `min(n, len(batches) - (i // n) * n)`" in _texts(LAST_FLAG)[4]
    assert _pairs(SHORT_EPOCH) == [("TK110", 5)]


def test_a_count_from_one_and_an_unknown_counter_shape_the_fix() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for step, (x, y) in enumerate(loader, 1):
            (model(x, y) / n).backward()
            if step % n == 0 or step == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK110", 4)]
    assert "divide by `min(n, len(loader) - ((step - 1) // n) * n)`" in _texts(src)[4]
    src = """
    def train(model, loader, optimizer, n, num_batches):
        it = iter(loader)
        i = 0
        while i < num_batches:
            x, y = next(it)
            (model(x, y) / n).backward()
            if (i + 1) % n == 0 or i + 1 == num_batches:
                optimizer.step()
                optimizer.zero_grad()
            i += 1
    """
    assert _pairs(src) == [("TK110", 7)]
    assert "divide by the micro-batches actually in the window (`n`, or fewer in the last one)" in _texts(src)[7]


def test_with_tk108_both_are_reported() -> None:
    # `step % n == 0` from enumerate: a first window of one (TK108) and a short last one (TK110)
    src = """
    def train(model, loader, optimizer, n):
        for step, batch in enumerate(loader):
            loss = model(batch) / n
            loss.backward()
            if step % n == 0 or step == len(loader) - 1:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK110", 4), ("TK108", 6)]


# --------------------------------------------------------------------------- clean

REAL_SIZE_INLINE = """
def train(model, data_loader, criterion, optimizer, accumulation_steps):
    for batch_idx, (inputs, targets) in enumerate(data_loader):
        loss = criterion(model(inputs), targets)
        loss = loss / min(accumulation_steps, len(data_loader) - (batch_idx // accumulation_steps) * accumulation_steps)
        loss.backward()
        if ((batch_idx + 1) % accumulation_steps == 0) or (batch_idx + 1 == len(data_loader)):
            optimizer.step()
            optimizer.zero_grad()
"""

REAL_SIZE_PER_WINDOW = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        if i % n == 0:
            window = min(n, len(loader) - i)
        (model(x, y) / window).backward()
        if (i + 1) % n == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""

COUNT_SET_FOR_THE_LAST_WINDOW = """
def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
    last_accum_steps = len(loader) % accum_steps
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps
        loss = loss_fn(model(input), target) / accum_steps
        loss.backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
"""

NO_LAST_BATCH_ALTERNATIVE = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

OTHER_ALTERNATIVES = """
def train(model, loader, optimizer, n, force_step, is_last_epoch):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0 or force_step:
            optimizer.step()
            optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0 or is_last_epoch or i == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

LAST_BATCH_REQUIRED_TOO = """
def train(model, loader, optimizer, n):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0 and i + 1 != len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""

DIVIDED_BY_SOMETHING_ELSE = """
def train(model, loader, optimizer, n):
    for i, (x, y, mask) in enumerate(loader):
        loss = (model(x, y) * mask).sum() / mask.sum()
        loss.backward()
        if (i + 1) % n == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""

INSIDE_TK_ACCUMULATE = """
import trainkit as tk

def train(model, loader, optimizer, n):
    with tk.accumulate(n, optimizer):
        for i, (x, y) in enumerate(loader):
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    "source",
    [REAL_SIZE_INLINE, REAL_SIZE_PER_WINDOW, COUNT_SET_FOR_THE_LAST_WINDOW, NO_LAST_BATCH_ALTERNATIVE,
     OTHER_ALTERNATIVES, LAST_BATCH_REQUIRED_TOO, DIVIDED_BY_SOMETHING_ELSE, INSIDE_TK_ACCUMULATE],
    ids=["real-size-inline", "real-size-per-window", "count-set-for-last-window", "no-last-batch-alternative",
         "other-alternatives", "last-batch-required-too", "divided-by-something-else", "inside-tk-accumulate"],
)
def test_clean_loops_have_no_findings(source: str) -> None:
    assert _pairs(source) == []


def test_a_division_after_backward_or_none_at_all_is_another_rule() -> None:
    late = TUTORIAL.replace("        loss = loss / accumulation_steps\n        loss.backward()\n",
                            "        loss.backward()\n        loss = loss / accumulation_steps\n")
    assert [c for c, _ in _pairs(late)] == ["TK101"]
    none = TUTORIAL.replace("        loss = loss / accumulation_steps\n", "")
    assert [c for c, _ in _pairs(none)] == ["TK102"]


def test_ignore_comment_on_the_division_line() -> None:
    src = TUTORIAL.replace("loss = loss / accumulation_steps", "loss = loss / accumulation_steps  # trainkit: ignore[TK110]")
    assert _pairs(src) == []


# --------------------------------------------------------------------------- end names, tried on real scripts

# transformers' Trainer spells its last-batch test `steps_in_epoch <= n and (step + 1) == steps_in_epoch`
# (step on the last batch only when the whole pass is shorter than a window). The finding is right,
# but it cited `steps_in_epoch <= n`, reading the accumulation's own `n` as the batch index.
TRAINER_SHAPE = """
def train(model, epoch_iterator, optimizer, n):
    steps_in_epoch = len(epoch_iterator)
    for step, batch in enumerate(epoch_iterator):
        loss = model(**batch).loss / n
        loss.backward()
        short_pass_ends = steps_in_epoch <= n and (step + 1) == steps_in_epoch
        if (step + 1) % n == 0 or short_pass_ends:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_the_last_batch_test_cited_is_the_one_on_the_index_not_on_n() -> None:
    texts = _texts(TRAINER_SHAPE)
    assert list(texts) == [5]
    assert "(`step + 1 == steps_in_epoch`, line 7)" in texts[5]


def test_steps_in_epoch_is_an_end_name_without_a_len_in_sight() -> None:
    src = TRAINER_SHAPE.replace("    steps_in_epoch = len(epoch_iterator)\n", "").replace(
        "def train(model, epoch_iterator, optimizer, n):", "def train(model, epoch_iterator, optimizer, n, steps_in_epoch):")
    assert _pairs(src) == [("TK110", 4)]


@pytest.mark.parametrize("length", ["seq_len", "max_len", "max_length", "context_len", "prompt_len"])
def test_a_sequence_length_is_not_the_end_of_the_pass(length: str) -> None:
    src = f"""
    def train(model, loader, optimizer, n, {length}):
        for step, x in enumerate(loader):
            loss = model(x).loss / n
            loss.backward()
            if (step + 1) % n == 0 or step >= {length}:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


# A loss multiplied by a name bound to `1 / n` was once missed: the divisor came back as the name.
MULTIPLIED_BY_A_NAMED_RECIPROCAL = """
def fit(net, batches, opt, criterion, k):
    weight = 1.0 / k
    for j, (a, b) in enumerate(batches):
        out = criterion(net(a), b)
        out = out * weight
        out.backward()
        if (j + 1) % k == 0 or j + 1 == len(batches):
            opt.step()
            opt.zero_grad()
"""


def test_a_loss_multiplied_by_a_name_bound_to_one_over_n_is_found() -> None:
    assert _pairs(MULTIPLIED_BY_A_NAMED_RECIPROCAL) == [("TK110", 6)]
    assert "`out = out * weight` divides each micro-batch's loss by `k`" in _texts(MULTIPLIED_BY_A_NAMED_RECIPROCAL)[6]
    inline = MULTIPLIED_BY_A_NAMED_RECIPROCAL.replace("out = out * weight", "out = out * (1 / k)")
    assert _pairs(inline) == [("TK110", 6)]


def test_a_named_reciprocal_of_something_else_is_not_n() -> None:
    # bound to another divisor, or to two different ones: not the `k` of the `%` test
    other = MULTIPLIED_BY_A_NAMED_RECIPROCAL.replace("weight = 1.0 / k", "weight = 1.0 / len(batches)")
    assert _pairs(other) == []
    two = MULTIPLIED_BY_A_NAMED_RECIPROCAL.replace(
        "    weight = 1.0 / k\n", "    weight = 1.0 / k\n    if len(batches) < k:\n        weight = 1.0 / len(batches)\n")
    assert _pairs(two) == []
