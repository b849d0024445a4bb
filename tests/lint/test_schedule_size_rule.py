"""TK111: an LR schedule sized in micro-batches (``epochs * len(loader)``) but stepped once per update.

The inverse of TK109: stepped with the step of an accumulation over ``n`` micro-batches, a schedule
planned over ``len(loader)`` steps per epoch runs ``n`` times too slow. Each snippet is linted with
every rule, so a finding list also shows that no other rule fires on the otherwise correct loop.
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, Tuple

from trainkit.lint import RULES, lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _texts(source: str) -> Dict[int, str]:
    return {f.line: f"{f.message}; fix: {f.fix}" for f in lint_source(textwrap.dedent(source), select="TK111")}


# --------------------------------------------------------------------------- hand-written: found

# HuggingFace-style: the schedule counts batches, the scheduler steps under the step's `if`
HF_STYLE = """
from transformers import get_linear_schedule_with_warmup

def train(model, train_loader, optimizer, epochs, warmup, accum):
    num_training_steps = epochs * len(train_loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)
    for epoch in range(epochs):
        for i, batch in enumerate(train_loader):
            loss = model(**batch).loss / accum
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
"""


def test_a_schedule_sized_in_batches_stepped_with_the_step_is_found_at_its_len() -> None:
    assert RULES["TK111"].severity == "error"
    assert _pairs(HF_STYLE) == [("TK111", 5)]
    text = _texts(HF_STYLE)[5]
    assert ("the LR schedule `scheduler` (line 6) is sized in micro-batches: `num_training_steps = epochs * "
            "len(train_loader)` counts the batches of `train_loader`") in text
    assert ("but `scheduler.step()` (line 13) runs only with the step (line 12), once per update of `accum` "
            "micro-batches, so it runs `accum` times too slow") in text
    assert "so it runs `accum` times too slow: training ends 1/`accum` of the way through it" in text
    assert "warm-up" not in text  # `warmup` is a plain count: it lasts as many updates as it says
    assert ("fix: size it in updates: `math.ceil(len(train_loader) / accum)` in place of `len(train_loader)` "
            "(the updates per epoch, transformers' `num_update_steps_per_epoch`), or `len(train_loader) // accum`") in text


GET_SCHEDULER_INLINE = """
from transformers import get_scheduler

def train(model, train_dataloader, optimizer, args):
    lr_scheduler = get_scheduler(
        "linear",
        optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=args.num_train_epochs * len(train_dataloader),
    )
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader, 1):
            loss = model(**batch).loss / args.n
            loss.backward()
            if step % args.n == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
"""


def test_a_size_written_in_the_constructor_is_shown_with_its_keyword() -> None:
    assert _pairs(GET_SCHEDULER_INLINE) == [("TK111", 9)]
    text = _texts(GET_SCHEDULER_INLINE)[9]
    assert "`num_training_steps=args.num_train_epochs * len(train_dataloader)` counts the batches" in text
    assert "once per update of `args.n` micro-batches" in text and "`math.ceil(len(train_dataloader) / args.n)`" in text


ONE_CYCLE_BELOW_AN_EARLY_EXIT = """
import torch
from tqdm import tqdm

def train(model, loader, optimizer, epochs):
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=epochs, steps_per_epoch=len(loader))
    for epoch in range(epochs):
        for i, (x, y) in enumerate(tqdm(loader)):
            (model(x, y) / 4).backward()
            if (i + 1) % 4 != 0:
                continue
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
"""

COSINE_UNDER_A_NAMED_TEST = """
import torch

def train(model, loader, optimizer, epochs, n):
    total: int = epochs * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            update = (i + 1) % n == 0
            (model(x, y) / n).backward()
            if update:
                optimizer.step()
                optimizer.zero_grad()
                sched.step()
"""

SAME_TEST_TWICE = """
from transformers import get_cosine_schedule_with_warmup

def train(model, loader, optimizer, epochs, accum_steps):
    total = len(loader) * epochs
    scheduler = get_cosine_schedule_with_warmup(optimizer, total // 10, total)
    for i, (x, y) in enumerate(loader):
        (model(x, y) / accum_steps).backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
        if (i + 1) % accum_steps == 0:
            scheduler.step()
"""

ON_SELF = """
from transformers import get_linear_schedule_with_warmup

class Trainer:
    def __init__(self, model, optimizer, train_loader, epochs, accum):
        self.model, self.optimizer, self.train_loader, self.accum = model, optimizer, train_loader, accum
        self.lr_scheduler = get_linear_schedule_with_warmup(optimizer, 0, epochs * len(self.train_loader))

    def epoch(self):
        for i, batch in enumerate(self.train_loader):
            (self.model(batch) / self.accum).backward()
            if (i + 1) % self.accum == 0:
                self.optimizer.step()
                self.lr_scheduler.step()
                self.optimizer.zero_grad()
"""


def test_other_schedules_and_spellings_of_the_step_are_found() -> None:
    assert _pairs(ONE_CYCLE_BELOW_AN_EARLY_EXIT) == [("TK111", 6)]
    assert "runs 4 times too slow" in _texts(ONE_CYCLE_BELOW_AN_EARLY_EXIT)[6]
    assert "`steps_per_epoch=len(loader)` counts the batches of `loader`" in _texts(ONE_CYCLE_BELOW_AN_EARLY_EXIT)[6]
    assert _pairs(COSINE_UNDER_A_NAMED_TEST) == [("TK111", 5)]
    assert "`total: int = epochs * len(loader)`" in _texts(COSINE_UNDER_A_NAMED_TEST)[5]
    # one finding for the one `len(loader)`, though two sizes read it; the warm-up counts batches too
    assert _pairs(SAME_TEST_TWICE) == [("TK111", 5)]
    assert ("runs `accum_steps` times too slow: its warm-up lasts `accum_steps` times longer than planned and "
            "training ends 1/`accum_steps` of the way through it") in _texts(SAME_TEST_TWICE)[5]
    assert _pairs(ON_SELF) == [("TK111", 7)]
    assert "`self.lr_scheduler` (line 7)" in _texts(ON_SELF)[7]


# --------------------------------------------------------------------------- tk.accumulate: found

TK_STEPPED = """
import trainkit as tk
from transformers import get_linear_schedule_with_warmup

def train(model, loader, optimizer, epochs):
    scheduler = get_linear_schedule_with_warmup(optimizer, 100, epochs * len(loader))
    with tk.accumulate(8, optimizer) as acc:
        for epoch in range(epochs):
            for x, y in loader:
                model(x, y).backward()
                optimizer.step()
                optimizer.zero_grad()
                if acc.stepped:
                    scheduler.step()
"""


def test_tk_accumulate_with_a_schedule_sized_in_batches_is_found() -> None:
    assert _pairs(TK_STEPPED) == [("TK111", 6)]
    text = _texts(TK_STEPPED)[6]
    assert ("but `if acc.stepped: scheduler.step()` (line 14) inside `tk.accumulate(8, ...)` (line 7) steps it at "
            "each window's end, once per update of 8 micro-batches, so it runs 8 times too slow") in text
    assert "`math.ceil(len(loader) / 8)` in place of `len(loader)`" in text
    boundary = TK_STEPPED.replace("if acc.stepped:", "if acc.boundary and scheduler is not None:")
    assert _pairs(boundary) == [("TK111", 6)]


# --------------------------------------------------------------------------- clean

def _swap(old: str, new: str, source: str = HF_STYLE) -> str:
    assert old in source
    return source.replace(old, new)


def test_a_size_counted_in_updates_is_not_reported() -> None:
    for size in ("epochs * (len(train_loader) // accum)", "epochs * math.ceil(len(train_loader) / accum)",
                 "len(train_loader) // accum * epochs", "epochs * len(train_loader) // accum"):
        assert _pairs(_swap("epochs * len(train_loader)", size)) == [], size
    # transformers' no_trainer scripts
    no_trainer = _swap("    num_training_steps = epochs * len(train_loader)\n",
                       "    num_update_steps_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)\n"
                       "    num_training_steps = epochs * num_update_steps_per_epoch\n")
    assert _pairs(no_trainer) == []
    # divided by the `%`'s own count, whatever its name, or by any name (it may be the count)
    renamed = _swap("accum", "k")
    assert _pairs(renamed) == [("TK111", 5)]
    assert _pairs(_swap("epochs * len(train_loader)", "epochs * len(train_loader) // k", renamed)) == []
    assert _pairs(_swap("epochs * len(train_loader)", "epochs * len(train_loader) // world_size")) == []


def test_a_size_divided_later_or_of_unknown_unit_is_not_reported() -> None:
    line = "    num_training_steps = epochs * len(train_loader)\n"
    later = [
        line + "    num_training_steps //= accum\n",
        line + "    if accum > 1:\n        num_training_steps = num_training_steps // accum\n",
        "    num_training_steps = epochs * len(train_dataset) // batch_size\n",  # samples / batch size: which batch?
        "    num_training_steps = min(max_steps, epochs * len(train_loader))\n",
        "    num_training_steps = epochs * len(val_loader)\n",  # another loader's batches
        "    num_training_steps = epochs * len(train_loader) * len(train_loader)\n",
        "    num_training_steps = epochs * len(train_loader) * (1 / n)\n",
    ]
    for text in later:
        assert _pairs(_swap(line, text)) == [], text


def test_a_warm_up_alone_in_batches_is_not_reported() -> None:
    # one epoch of warm-up over a total counted in updates (or of unknown unit) may be meant
    for total in ("max_steps", "len(train_loader) // accum * epochs"):
        src = _swap("get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)",
                    f"get_linear_schedule_with_warmup(optimizer, num_training_steps, {total})")
        assert _pairs(src) == [], total
    src = _swap("get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)",
                "get_scheduler('linear', optimizer, num_training_steps, max_steps)")
    assert _pairs(src) == []
    src = _swap("get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)",
                "get_scheduler('linear', optimizer, num_warmup_steps=num_training_steps, num_training_steps=max_steps)")
    assert _pairs(src) == []


def test_sizes_the_linter_cannot_read_are_not_reported() -> None:
    for text in ("cfg['total_steps']", "args.max_train_steps", "1000", "total_steps(train_loader)"):
        assert _pairs(_swap("    num_training_steps = epochs * len(train_loader)\n", f"    num_training_steps = {text}\n")) == []
    # an argument
    assert _pairs(_swap("    num_training_steps = epochs * len(train_loader)\n", "").replace(
        "epochs, warmup, accum)", "epochs, warmup, accum, num_training_steps)")) == []
    # a scheduler built elsewhere (passed in), or built twice in the file
    passed = _swap("    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)\n", "")
    assert _pairs(passed) == []
    twice = _swap("    for epoch", "    if warmup == 0:\n        scheduler = get_linear_schedule_with_warmup(optimizer, 0, 10)\n"
                  "    for epoch")
    assert _pairs(twice) == []


def test_a_module_level_size_is_not_read_for_an_argument_of_the_same_name() -> None:
    src = """
    from transformers import get_linear_schedule_with_warmup
    num_training_steps = EPOCHS * len(train_loader)

    def train(model, train_loader, optimizer, accum, num_training_steps):
        scheduler = get_linear_schedule_with_warmup(optimizer, 0, num_training_steps)
        for i, batch in enumerate(train_loader):
            (model(batch) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []
    # without the argument, the module's name is the one read
    assert _pairs(src.replace(", num_training_steps):", "):")) == [("TK111", 3)]


def test_a_scheduler_built_by_a_helper_of_its_own_is_not_read() -> None:
    # another function's `scheduler` is an LR scheduler, but this one comes from a helper that may divide
    src = _swap("    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, num_training_steps)\n",
                "    scheduler = make_scheduler(optimizer, warmup, num_training_steps)\n")
    src += "\ndef other(optimizer):\n    scheduler = get_linear_schedule_with_warmup(optimizer, 0, 10)\n"
    assert _pairs(src) == []


def test_a_scheduler_of_the_same_name_in_another_function_is_another_variable() -> None:
    other = HF_STYLE + "\ndef evaluate(optimizer):\n    scheduler = get_linear_schedule_with_warmup(optimizer, 0, 10)\n"
    assert _pairs(other) == [("TK111", 5)]
    # but an attribute is one object wherever it is bound
    on_self = ON_SELF + "\n    def reset(self):\n        self.lr_scheduler = get_linear_schedule_with_warmup(self.optimizer, 0, 10)\n"
    assert _pairs(on_self) == []


def test_loops_that_do_not_accumulate_or_step_per_epoch_are_not_reported() -> None:
    plain = """
    from transformers import get_linear_schedule_with_warmup
    def train(model, loader, optimizer, epochs):
        scheduler = get_linear_schedule_with_warmup(optimizer, 100, epochs * len(loader))
        for epoch in range(epochs):
            for batch in loader:
                model(batch).backward()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    """
    per_epoch = """
    import torch
    def train(model, loader, optimizer, epochs, accum):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=len(loader))
        for epoch in range(epochs):
            for i, batch in enumerate(loader):
                (model(batch) / accum).backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            scheduler.step()
    """
    # a schedule of its own condition under the step: stepped at epochs' ends, not per update
    own_condition = _swap("                scheduler.step()\n",
                          "                if i + 1 == len(train_loader):\n                    scheduler.step()\n")
    # stepped `accum` times per update: at the pace of micro-batches it was planned for
    catch_up = _swap("                scheduler.step()\n",
                     "                for _ in range(accum):\n                    scheduler.step()\n")
    for source in (plain, per_epoch, own_condition, catch_up):
        assert _pairs(source) == [], source


def test_a_schedule_sized_in_batches_stepped_at_every_micro_batch_is_neither_tk109_nor_tk111() -> None:
    # it walks the schedule at the pace it was planned for (TK109's exception)
    every_micro_batch = _swap("                scheduler.step()\n", "").replace(
        "            loss.backward()\n", "            loss.backward()\n            scheduler.step()\n")
    assert _pairs(every_micro_batch) == []
    # sized in updates and stepped at every micro-batch: TK109, not TK111
    too_fast = every_micro_batch.replace("epochs * len(train_loader)", "epochs * math.ceil(len(train_loader) / accum)")
    assert _pairs(too_fast) == [("TK109", 11)]


def test_tk_accumulate_clean_cases_are_not_reported() -> None:
    for src in (TK_STEPPED.replace("epochs * len(loader)", "epochs * math.ceil(len(loader) / 8)"),
                TK_STEPPED.replace("epochs * len(loader)", "epochs * 1000"),
                # at every micro-batch inside the block: the schedule keeps its planned pace (TK109's exception)
                TK_STEPPED.replace("                if acc.stepped:\n                    scheduler.step()\n",
                                   "                scheduler.step()\n"),
                # once per epoch, after the loop
                TK_STEPPED.replace("                if acc.stepped:\n                    scheduler.step()\n",
                                   "            scheduler.step()\n"),
                # a condition that is not the window's end
                TK_STEPPED.replace("if acc.stepped:", "if acc.stepped and epoch > 0:")):
        assert _pairs(src) == [], src


# accelerate: the prepared scheduler steps only where the gradients sync (`num_processes` times, each
# process having 1/num_processes of the batches `len(train_dataloader)` counted before `prepare`)
ACCELERATE = """
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

def train(model, train_dataloader, optimizer, num_epochs):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 100, len(train_dataloader) * num_epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
    for epoch in range(num_epochs):
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
"""


def test_accelerate_accumulate_with_a_schedule_sized_before_prepare_is_found() -> None:
    assert _pairs(ACCELERATE) == [("TK111", 7)]
    text = _texts(ACCELERATE)[7]
    assert ("`len(train_dataloader) * num_epochs` counts the batches of `train_dataloader`, but `lr_scheduler.step()` "
            "(line 14) inside `accelerator.accumulate(model)` (line 11) steps it only where the gradients sync "
            "(accelerate's prepared scheduler; `len(train_dataloader)` was read before `accelerator.prepare` (line 8), "
            "so it counts the batches of all processes), once per update of 4 micro-batches, so it runs 4 times too "
            "slow") in text
    assert "`math.ceil(len(train_dataloader) / 4)` in place of `len(train_dataloader)`" in text
    # stepped under `if accelerator.sync_gradients:` after the block (transformers' no_trainer scripts' shape)
    synced = _swap("                lr_scheduler.step()\n                optimizer.zero_grad()\n",
                   "                optimizer.zero_grad()\n            if accelerator.sync_gradients:\n"
                   "                lr_scheduler.step()\n", ACCELERATE)
    assert _pairs(synced) == [("TK111", 7)]
    assert "under `if accelerator.sync_gradients:` (line 15)" in _texts(synced)[7]


def test_a_scheduler_prepared_on_its_own_is_followed() -> None:
    prepare = "    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)\n"
    alone = _swap(prepare, prepare.replace(", lr_scheduler = ", " = ").replace(", lr_scheduler)", ")")
                  + "    lr_scheduler = accelerator.prepare(lr_scheduler)\n", ACCELERATE)
    assert _pairs(alone) == [("TK111", 7)]


def test_accelerate_cases_the_linter_cannot_tell_are_not_reported() -> None:
    prepare = "    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)\n"
    build = "    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 100, len(train_dataloader) * num_epochs)\n"
    for src in (
        # sized in updates
        _swap("len(train_dataloader) * num_epochs",
              "math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps) * num_epochs", ACCELERATE),
        # the length read after `prepare`: one process's batches, and the scheduler steps `num_processes` times
        _swap(build + prepare, prepare.replace(", lr_scheduler = ", " = ").replace(", lr_scheduler)", ")") + build
              + "    lr_scheduler = accelerator.prepare(lr_scheduler)\n", ACCELERATE),
        # not prepared: it steps at every micro-batch, at the pace it was planned for
        _swap(prepare, prepare.replace(", lr_scheduler = ", " = ").replace(", lr_scheduler)", ")"), ACCELERATE),
        # a scheduler stepped at every call, or an accumulation the file does not say
        _swap("Accelerator(gradient_accumulation_steps=4)",
              "Accelerator(gradient_accumulation_steps=4, step_scheduler_with_optimizer=False)", ACCELERATE),
        _swap("Accelerator(gradient_accumulation_steps=4)", "Accelerator(**config)", ACCELERATE),
        _swap("Accelerator(gradient_accumulation_steps=4)", "Accelerator(gradient_accumulation_steps=1)", ACCELERATE),
        # a condition of its own
        _swap("                lr_scheduler.step()\n", "                if epoch > 0:\n                    lr_scheduler.step()\n",
              ACCELERATE),
    ):
        assert _pairs(src) == [], src


def test_the_finding_can_be_silenced_on_its_line() -> None:
    src = _swap("    num_training_steps = epochs * len(train_loader)\n",
                "    num_training_steps = epochs * len(train_loader)  # trainkit: ignore[TK111]\n")
    assert _pairs(src) == []
