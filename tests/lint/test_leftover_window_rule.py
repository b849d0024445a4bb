"""TK112: the step runs only under `%`, so a pass's last `len(loader) % n` micro-batches are never stepped."""
from __future__ import annotations

import textwrap
from typing import List, Tuple

import pytest

from trainkit.lint import RULES, Finding, lint_source


def _found(source: str, **kwargs: object) -> List[Finding]:
    return [f for f in lint_source(textwrap.dedent(source), **kwargs) if f.code == "TK112"]  # type: ignore[arg-type]


def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in _found(source)]


def _text(source: str) -> str:
    (finding,) = _found(source)
    return f"{finding.message}; fix: {finding.fix}"


HF_STYLE = """
def train(model, loader, optimizer, epochs, n):
    for epoch in range(epochs):
        for i, batch in enumerate(loader):
            loss = model(**batch).loss / n
            loss.backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_the_tutorial_shape_is_a_warning_on_the_if_of_the_step_with_the_leftovers_carried() -> None:
    (finding,) = _found(HF_STYLE)
    assert (finding.code, finding.line, finding.severity) == ("TK112", 7, "warning")
    assert RULES["TK112"].severity == "warning"
    text = _text(HF_STYLE)
    assert "line 8" in text and "`(i + 1) % n == 0`" in text
    assert "the last `len(loader) % n` micro-batches of each pass of the loop (line 4)" in text
    assert "carried into the next epoch's first window" in text and "`n` + k micro-batches" in text
    assert "after the last epoch they are never stepped" in text
    assert "harmless when the length is a multiple of `n`" in text
    assert "`if (i + 1) % n != 0:` then `optimizer.step()` and `optimizer.zero_grad()`" in text
    assert "`or i + 1 == len(loader)`" in text and "see TK110" in text
    assert "`with tk.accumulate(n, optimizer):`" in text


@pytest.mark.parametrize("zeroing", [
    "optimizer.zero_grad()",
    "optimizer.zero_grad(set_to_none=True)",
    "model.zero_grad()",
    "for p in model.parameters():\n            p.grad = None",
])
def test_a_zero_grad_in_the_epoch_loop_throws_the_leftovers_away(zeroing: str) -> None:
    src = HF_STYLE.replace("        for i, batch", f"        {zeroing}\n        for i, batch")
    text = _text(src)
    assert "thrown away by `" in text and "never train the model" in text and "carried" not in text
    # after the batch loop, before the next pass, all the same
    after = HF_STYLE + "        " + zeroing.replace("\n", "\n    ") + "\n"
    assert "thrown away" in _text(after)


def test_a_zero_grad_before_the_first_backward_of_the_batch_loop_throws_them_away() -> None:
    src = HF_STYLE.replace("            loss = model",
                           "            if i % n == 0:\n                optimizer.zero_grad()\n            loss = model")
    assert "thrown away by `optimizer.zero_grad()` (line 6)" in _text(src)


def test_another_optimizers_zero_grad_does_not_throw_them_away() -> None:
    src = HF_STYLE.replace("        for i, batch", "        opt_d.zero_grad()\n        for i, batch")
    assert "carried" in _text(src)


def test_a_function_without_an_epoch_loop_and_a_single_pass_at_module_level() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    text = _text(src)
    assert "if `train` runs once per epoch" in text and "carried" in text
    zeroed = src.replace("    for i, (x, y)", "    optimizer.zero_grad()\n        for i, (x, y)")
    assert "thrown away by `optimizer.zero_grad()`" in _text(zeroed)
    module = """
    for i, (x, y) in enumerate(loader):
        (model(x, y) / n).backward()
        if (i + 1) % n == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert "never stepped: the loop ends with them still in `.grad`" in _text(module)


@pytest.mark.parametrize("header", [
    "for i, batch in enumerate(tqdm(loader)):",
    "for i, batch in tqdm(enumerate(loader), total=len(loader)):",
    "for i, batch in enumerate(self.train_loader):",
    "for i, batch in enumerate(loader, start=0):",
])
def test_loaders_behind_tqdm_or_an_attribute(header: str) -> None:
    src = HF_STYLE.replace("for i, batch in enumerate(loader):", header)
    assert _pairs(src) == [("TK112", 7)]


def test_scaler_step_and_a_one_based_index() -> None:
    src = """
    def train(model, loader, optimizer, scaler, n):
        for step, (x, y) in enumerate(loader, 1):
            scaler.scale(model(x, y) / n).backward()
            if step % n == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """
    text = _text(src)
    assert _pairs(src) == [("TK112", 5)]
    assert "the step (`scaler.step(optimizer)`, line 6)" in text and "`len(loader) % n`" in text
    assert "`or step == len(loader)`" in text and "then `scaler.step(optimizer)`" in text


def test_an_early_exit_before_the_step() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n != 0:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    text = _text(src)
    assert _pairs(src) == [("TK112", 5)]
    assert "runs only where `(i + 1) % n != 0` is false" in text and "`if (i + 1) % n != 0:` then" in text
    named = src.replace("            if (i + 1) % n != 0:", "            need_update = (i + 1) % n == 0\n"
                                                             "            if not need_update:")
    assert _pairs(named) == [("TK112", 6)]


def test_a_counter_reset_for_each_pass() -> None:
    src = """
    def train(model, loader, optimizer, epochs, n):
        for epoch in range(epochs):
            seen = 0
            for batch in loader:
                (model(batch) / n).backward()
                seen += 1
                if seen % n == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK112", 8)]
    assert "`or seen == len(loader)`" in _text(src)


def test_a_zero_based_test_says_which_batches_without_claiming_len_mod_n() -> None:
    src = HF_STYLE.replace("(i + 1) % n == 0", "i % n == 0")
    found = [(f.code, f.line) for f in lint_source(textwrap.dedent(src))]
    assert ("TK108", 7) in found and ("TK112", 7) in found
    text = _text(src)
    assert "ends on a batch that test steps at" in text and "len(loader) % n" not in text
    assert "`if i % n != 0:` then" in text
    assert "`len(loader) % n`" in _text(HF_STYLE.replace("(i + 1) % n == 0", "i % n == n - 1"))


def test_the_finding_can_be_silenced_on_its_line() -> None:
    assert _pairs(HF_STYLE.replace("if (i + 1) % n == 0:", "if (i + 1) % n == 0:  # trainkit: ignore[TK112]")) == []


# --------------------------------------------------------------------------- not reported

FLUSHES = {
    "unguarded": "        optimizer.step()\n        optimizer.zero_grad()\n",
    "guarded": "        if (i + 1) % n != 0:\n            optimizer.step()\n            optimizer.zero_grad()\n",
    "by_length": "        if len(loader) % n:\n            optimizer.step()\n",
    "scaler": "        scaler.step(optimizer)\n        scaler.update()\n",
    "step_function": "        flush(optimizer)\n",
}


@pytest.mark.parametrize("flush", sorted(FLUSHES))
def test_a_step_after_the_batch_loop_in_the_epoch_loop_flushes(flush: str) -> None:
    src = HF_STYLE + FLUSHES[flush]
    if flush == "step_function":
        src += "def flush(optimizer):\n    optimizer.step()\n"
    assert _pairs(src) == []


def test_a_flush_before_the_next_pass_a_for_else_or_after_the_loop_of_a_function() -> None:
    before = HF_STYLE.replace("        for i, batch",
                              "        if epoch:\n            optimizer.step()\n        for i, batch")
    assert _pairs(before) == []
    for_else = HF_STYLE + "        else:\n            optimizer.step()\n"
    assert _pairs(for_else) == []
    function = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
        if (i + 1) % n:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(function) == []
    # a step before the loop of a function is no flush of its own pass
    early = function.replace("        if (i + 1) % n:\n            optimizer.step()\n"
                             "            optimizer.zero_grad()\n", "")
    early = early.replace("    for i, (x, y)", "    optimizer.step()\n        for i, (x, y)")
    assert _pairs(early) == [("TK112", 6)]


def test_another_batch_loop_or_another_optimizer_is_no_flush() -> None:
    second = HF_STYLE + (
        "        for j, batch in enumerate(other_loader):\n"
        "            (model(**batch).loss / n).backward()\n"
        "            if (j + 1) % n == 0:\n"
        "                optimizer.step()\n"
        "                optimizer.zero_grad()\n")
    assert _pairs(second) == [("TK112", 7), ("TK112", 12)]
    assert _pairs(HF_STYLE + "        opt_d.step()\n") == [("TK112", 7)]


def test_a_step_on_the_last_batch_in_the_loop_steps_the_short_window() -> None:
    src = HF_STYLE.replace("                optimizer.zero_grad()\n",
                           "                optimizer.zero_grad()\n"
                           "            if i + 1 == len(loader):\n"
                           "                optimizer.step()\n")
    assert _pairs(src) == []


@pytest.mark.parametrize("test", [
    "(i + 1) % n == 0 or i + 1 == len(loader)",
    "(i + 1) % n == 0 or i == len(loader) - 1",
    "(i + 1) % n == 0 or is_last",
    "(i + 1) % n == 0 or force_step",
    "((i + 1) % n == 0 or i + 1 == len(loader)) and not skip",
])
def test_a_last_batch_alternative_or_any_other_or_is_not_reported(test: str) -> None:
    assert _pairs(HF_STYLE.replace("(i + 1) % n == 0", test)) == []


def test_an_early_exit_with_a_last_batch_alternative_and_timms_loop() -> None:
    exit_ = """
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n != 0 and i + 1 != len(loader):
                continue
            optimizer.step()
    """
    assert _pairs(exit_) == []
    timm = """
    def train_one_epoch(model, loader, optimizer, loss_fn, accum_steps=4):
        last_batch_idx = len(loader) - 1
        last_accum_steps = len(loader) % accum_steps
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_batch_idx
            need_update = last_batch or (batch_idx + 1) % accum_steps == 0
            if batch_idx >= last_batch_idx - last_accum_steps:
                accum_steps = last_accum_steps
            loss = loss_fn(model(input), target) / accum_steps
            loss.backward()
            if not need_update:
                continue
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(timm) == []


def test_inside_tk_accumulate_or_accelerate() -> None:
    tk_block = """
    import trainkit as tk
    def train(model, loader, optimizer, n):
        with tk.accumulate(n, optimizer):
            for i, (x, y) in enumerate(loader):
                model(x, y).backward()
                if (i + 1) % n == 0:
                    optimizer.step()
    """
    assert _pairs(tk_block) == []
    accelerate = """
    def train(accelerator, model, loader, optimizer, n):
        for i, batch in enumerate(loader):
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss / n)
                if (i + 1) % n == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert _pairs(accelerate) == []


def test_loops_over_steps_endless_loaders_and_counters_that_run_across_epochs() -> None:
    over_range = """
    def train(model, it, optimizer, max_steps, n):
        for step in range(max_steps):
            (model(next(it)) / n).backward()
            if (step + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(over_range) == []
    cycled = """
    import itertools
    def train(model, loader, optimizer, n):
        batches = itertools.cycle(loader)
        for i, batch in enumerate(batches):
            (model(batch) / n).backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
            if i > 1000:
                break
    """
    assert _pairs(cycled) == []
    while_loop = """
    def train(model, it, optimizer, max_steps, n):
        step = 0
        while True:
            (model(next(it)) / n).backward()
            step += 1
            if step % n == 0:
                optimizer.step()
                optimizer.zero_grad()
            if step >= max_steps:
                break
    """
    assert _pairs(while_loop) == []
    global_step = """
    def train(model, loader, optimizer, epochs, n):
        global_step = 0
        for epoch in range(epochs):
            for batch in loader:
                (model(batch) / n).backward()
                global_step += 1
                if global_step % n == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert _pairs(global_step) == []
    micro_batches = """
    def train(model, batches, optimizer, n):
        for batch in batches:
            chunks = batch.chunk(n)
            for i, chunk in enumerate(chunks):
                (model(chunk) / n).backward()
                if (i + 1) % n == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert _pairs(micro_batches) == []
    assert _pairs(micro_batches.replace("chunks = batch.chunk(n)", "parts = batch.split(size)")
                  .replace("enumerate(chunks)", "enumerate(parts)")) == []
    assert _pairs(micro_batches.replace("chunks = batch.chunk(n)\n            ", "").replace("enumerate(chunks)",
                                                                                 "enumerate(micro_batches)")) == []
    plain_target = """
    def train(model, steps, optimizer, n):
        for step in steps:
            (model(step) / n).backward()
            if (step + 1) % n == 0:
                optimizer.step()
    """
    assert _pairs(plain_target) == []


def test_a_window_of_one_a_literal_multiple_and_a_loop_that_does_not_accumulate() -> None:
    assert _pairs(HF_STYLE.replace("(i + 1) % n == 0", "(i + 1) % 1 == 0")) == []
    literal = """
    loader = [b1, b2, b3, b4]
    for i, batch in enumerate(loader):
        (model(batch) / 2).backward()
        if (i + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(literal) == []
    assert _pairs(literal.replace("(i + 1) % 2", "(i + 1) % 3").replace("/ 2", "/ 3")) == [("TK112", 5)]
    every_batch = """
    for i, batch in enumerate(loader):
        model(batch).backward()
        optimizer.step()
        optimizer.zero_grad()
        if (i + 1) % 100 == 0:
            print(i)
    """
    assert _pairs(every_batch) == []


def test_the_flush_after_a_batch_loop_does_not_make_its_function_a_step_function() -> None:
    # The fix asks for a step after the batch loop, outside any loop of the function: that function
    # is still a whole epoch, and the epoch loop calling it no training loop (no TK301/TK302 there).
    src = """
    import torch
    def train_epoch(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / n
            loss.backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
        if (i + 1) % n != 0:
            optimizer.step()
            optimizer.zero_grad()
        return loss

    for epoch in range(10):
        loss = train_epoch(model, loader, optimizer, 4)
        print(f"epoch {epoch} loss {loss.item()}")
        torch.cuda.empty_cache()
    """
    assert [(f.code, f.line) for f in lint_source(textwrap.dedent(src))] == []
    # a step function with a critic's loop of its own still is one
    gan = """
    import torch
    def train_step(x, opt_d, opt_g, n_critic):
        for _ in range(n_critic):
            d_loss(x).backward()
            opt_d.step(); opt_d.zero_grad()
        g_loss(x).backward()
        opt_g.step(); opt_g.zero_grad()

    for x in loader:
        train_step(x, opt_d, opt_g, 5)
        torch.cuda.empty_cache()
    """
    assert [(f.code, f.line) for f in lint_source(textwrap.dedent(gan))] == [("TK301", 12)]


def test_the_flush_in_the_epoch_loop_does_not_make_its_once_per_epoch_calls_per_step() -> None:
    src = """
    import torch
    for epoch in range(10):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / n
            loss.backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
        if (i + 1) % n != 0:
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch} loss {loss.item()}")
        torch.cuda.empty_cache()
    """
    assert [(f.code, f.line) for f in lint_source(textwrap.dedent(src))] == []
    # the batch loop's own per-step calls still are
    per_step = src.replace("            loss.backward()\n",
                           "            loss.backward()\n            torch.cuda.empty_cache()\n")
    assert [(f.code, f.line) for f in lint_source(textwrap.dedent(per_step))] == [("TK301", 7)]
