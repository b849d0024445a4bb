"""TK1xx and TK2xx read the body of a same-file step function a training loop calls every iteration.

``def train_step(x, y): loss = crit(model(x), y); loss.backward()`` called by a loop that steps
under ``if (i + 1) % 4 == 0:`` accumulates without dividing the loss (TK102); the backward is in
the function, the step in the loop, so neither alone shows it. The function's body is read at the
call, its parameters named as the call's arguments; findings keep its lines and say which loop
calls it. Each silent case also checks the variant that is read is reported, so that the shape,
not a blind spot, is what keeps it quiet.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str, select: str = "TK1,TK2") -> List[Tuple[str, int]]:
    return sorted((f.code, f.line) for f in lint_source(textwrap.dedent(source), select=select))


ACCUMULATE = """
def train_step(x, y):
    loss = crit(model(x), y)
    loss.backward()
    return loss

for i, (x, y) in enumerate(loader):
    train_step(x, y)
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
"""
# TK102 at the backward in the function; TK112 at the step's `if` (no short last window is stepped)
FOUND = [("TK102", 4), ("TK112", 9)]


def test_an_undivided_loss_in_a_step_function_is_reported_in_it() -> None:
    assert _pairs(ACCUMULATE) == FOUND
    tk102 = [f for f in lint_source(textwrap.dedent(ACCUMULATE), select="TK102")]
    assert len(tk102) == 1 and "`loss.backward()`" in tk102[0].message
    assert tk102[0].message.endswith(", in `train_step()`, which runs on every iteration because the training "
                                     "loop on line 7 calls it on line 8"), tk102[0].message


def test_a_divided_loss_in_the_function_is_not_reported() -> None:
    src = ACCUMULATE.replace("    loss = crit(model(x), y)\n", "    loss = crit(model(x), y) / 4\n")
    assert src != ACCUMULATE and _pairs(src) == [("TK112", 9)]


def test_the_result_assigned_and_the_parameters_named_as_the_arguments() -> None:
    # `loss = train_step(batch)`: `return loss` binds the loop's `loss`; `batch[0]` stands for `inp`
    src = """
    def train_step(inp, target):
        out = model(inp)
        loss = crit(out, target)
        loss.backward()
        return loss

    for i, batch in enumerate(loader):
        loss = train_step(batch[0], batch[1])
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == [("TK102", 5), ("TK112", 10)]


def test_a_method_and_an_inherited_method() -> None:
    src = """
    class Base:
        def train_step(self, batch):
            loss = self.model(*batch)
            loss.backward()

    class Trainer(Base):
        def fit(self):
            for i, batch in enumerate(self.loader):
                self.train_step(batch)
                if (i + 1) % self.accum == 0:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK102", 5), ("TK112", 11)]
    # a method of another object is not read
    other = src.replace("self.train_step(batch)", "self.helper.train_step(batch)")
    assert other != src and _pairs(other) == []


def test_a_scaled_backward_in_the_function_and_a_plain_step_in_the_loop() -> None:
    src = """
    import torch
    scaler = torch.amp.GradScaler()
    def train_step(x, y):
        with torch.autocast("cuda"):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()

    for x, y in loader:
        train_step(x, y)
        optimizer.step()
        optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK202", 11)]


def test_a_scaler_step_in_the_function_without_an_update_anywhere() -> None:
    src = """
    import torch
    scaler = torch.amp.GradScaler()
    def train_step(x, y):
        loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        optimizer.zero_grad()

    for x, y in loader:
        train_step(x, y)
    """
    found = lint_source(textwrap.dedent(src), select="TK1,TK2")
    assert [(f.code, f.line) for f in found] == [("TK201", 7)]
    assert "in `train_step()`, which runs on every iteration because the training loop on line 10 calls it on line " \
           "11" in found[0].message
    # the update after the call, in the loop, runs with each step: fine
    assert _pairs(src.replace("        train_step(x, y)\n", "        train_step(x, y)\n        scaler.update()\n")) == []


def test_a_function_called_from_two_loops_is_reported_once_naming_the_first() -> None:
    src = ACCUMULATE + "for i, (x, y) in enumerate(loader2):\n    train_step(x, y)\n" \
                       "    if (i + 1) % 8 == 0:\n        opt.step()\n        opt.zero_grad()\n"
    found = [f for f in lint_source(textwrap.dedent(src), select="TK102")]
    assert [(f.code, f.line) for f in found] == [("TK102", 4)]
    assert "the training loop on line 7 calls it on line 8" in found[0].message


def test_near_misses_are_not_read() -> None:
    assert _pairs(ACCUMULATE) == FOUND
    silent: List[Tuple[str, int]] = []  # the loop runs no backward of its own: it does not accumulate
    # decorated: a decorator may change what runs
    assert _pairs(ACCUMULATE.replace("def train_step", "@torch.compile\ndef train_step")) == []
    # imported: not read (the local def is gone)
    imported = ACCUMULATE.replace("def train_step(x, y):", "from lib import train_step\ndef other(x, y):")
    assert imported != ACCUMULATE and _pairs(imported) == []
    # called under a condition of the loop, in a comprehension, or inside another call
    assert _pairs(ACCUMULATE.replace("    train_step(x, y)\n", "    if x is not None:\n        train_step(x, y)\n")) \
        == []
    assert _pairs(ACCUMULATE.replace("    train_step(x, y)\n", "    [train_step(a, b) for a, b in zip(x, y)]\n")) \
        == silent
    assert _pairs(ACCUMULATE.replace("    train_step(x, y)\n", "    log(train_step(x, y))\n")) == silent
    # *args, an early return
    assert _pairs(ACCUMULATE.replace("def train_step(x, y):", "def train_step(x, *y):")) == silent
    early = ACCUMULATE.replace("    loss.backward()\n", "    if loss is None:\n        return None\n    loss.backward()\n")
    assert early != ACCUMULATE and _pairs(early) == []


def test_a_function_holding_its_own_batch_loop_is_not_read() -> None:
    # a whole epoch: the epoch loop calling it is no training loop, and its loop is read on its own
    src = """
    def train_epoch(loader):
        for x, y in loader:
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    for epoch in range(10):
        train_epoch(loader)
    """
    assert _pairs(src) == []


def test_an_eval_call_with_training_switched_off_is_not_read() -> None:
    src = """
    def step(x, y, train=True):
        loss = crit(model(x), y)
        if train:
            loss.backward()
        return loss

    for i, (x, y) in enumerate(loader):
        step(x, y, train=False)
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    """
    # the loop steps without any backward of its own: nothing is accumulated, nothing reported
    assert _pairs(src) == []
    assert _pairs(src.replace("train=False", "train=True")) == [("TK102", 5), ("TK112", 10)]


def test_a_literal_argument_takes_its_branch() -> None:
    # `use_amp=False` never runs the scaled backward: the loop's plain step is right
    src = """
    import torch
    scaler = torch.amp.GradScaler()
    def train_step(x, y, use_amp=True):
        loss = crit(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()

    for x, y in loader:
        train_step(x, y, use_amp=False)
        optimizer.step()
        optimizer.zero_grad()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("use_amp=False)", "use_amp=True)")) == [("TK202", 13)]
    assert _pairs(src.replace("use_amp=False)", ")")) == [("TK202", 13)]  # the default
    assert _pairs(src.replace("use_amp=False)", "use_amp=flag)")) == [("TK202", 13)]


def test_two_calls_in_one_iteration_are_read_each_with_its_own_locals() -> None:
    # accelerate's test_sync.py shape: one function called for two models in an iteration, the
    # first dividing its loss, the second under `accelerator.accumulate`; written into one iteration
    # with one `loss`, the first's division would count for the second's backward (a false TK104):
    # the second copy's `loss` gets a name of its own
    src = """
    def step_model(model, x, y, divide=False):
        loss = crit(model(x), y)
        if divide:
            loss /= accum_steps
        loss.backward()

    for i, (x, y) in enumerate(loader):
        step_model(model, x, y, True)
        with accelerator.accumulate(ddp_model):
            step_model(ddp_model, x, y)
            ddp_opt.step()
            ddp_opt.zero_grad()
        if (i + 1) % 2 == 0 or (i + 1) == len(loader):
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == []
    # both calls are read: the first's loss left undivided is reported
    assert _pairs(src.replace("loss /= accum_steps", "pass")) == [("TK102", 6)]
    # the same function called twice, neither dividing: read at both calls, reported once
    twice = ACCUMULATE.replace("    train_step(x, y)\n", "    train_step(x, y)\n    train_step(y, x)\n")
    assert twice != ACCUMULATE and _pairs(twice) == [("TK102", 4), ("TK112", 10)]


def test_a_gan_s_two_calls_the_second_undivided() -> None:
    src = """
    def half_step(model, x, y, divide=False):
        loss = crit(model(x), y)
        if divide:
            loss = loss / 4
        loss.backward()
        return loss.detach()

    for i, (x, y) in enumerate(loader):
        d_loss = half_step(D, x, y, True)
        g_loss = half_step(G, x, y)
        if (i + 1) % 4 == 0 or i + 1 == len(loader):
            opt_D.step(); opt_G.step()
            opt_D.zero_grad(); opt_G.zero_grad()
    """
    # the second call's backward is undivided (TK102); the first's fixed `/ 4` misses a short last
    # window (TK110, as it would written in the loop)
    assert _pairs(src) == [("TK102", 6), ("TK110", 5)]
    (found,) = lint_source(textwrap.dedent(src), select="TK102")
    # named as written: the copy's renamed local does not show
    assert "`loss` is never divided" in found.message and "\u2032" not in found.message + found.fix
    assert "calls it on line 11" in found.message
    assert _pairs(src.replace("half_step(G, x, y)", "half_step(G, x, y, True)")) == [("TK110", 5)]


def test_a_local_whose_name_the_loop_also_uses_is_read_apart() -> None:
    # the loop's `loss` is another variable than the function's (Python keeps a function's locals its
    # own): the copy's `loss` is renamed, and the function's undivided backward is read
    src = ACCUMULATE.replace("    train_step(x, y)\n", "    train_step(x, y)\n    print(loss)\n")
    assert src != ACCUMULATE and _pairs(src) == [("TK102", 4), ("TK112", 10)]
    (found,) = lint_source(textwrap.dedent(src), select="TK102")
    assert "`loss` is never divided" in found.message and "\u2032" not in found.message + found.fix
    # the call's own target is the function's result: read, not renamed
    assigned = ACCUMULATE.replace("    train_step(x, y)\n", "    loss = train_step(x, y)\n    print(loss)\n")
    assert _pairs(assigned) == [("TK102", 4), ("TK112", 10)]


def test_the_loop_s_own_division_does_not_count_for_the_function_s_local() -> None:
    # the loop divides its own `loss` (an auxiliary loss); the function's is still undivided
    src = ACCUMULATE.replace("    train_step(x, y)\n",
                             "    train_step(x, y)\n    loss = aux(model, x) / 4\n    loss.backward()\n")
    assert src != ACCUMULATE and _pairs(src) == [("TK102", 4), ("TK112", 11)]
    # both divided: nothing but the short last window
    divided = src.replace("    loss = crit(model(x), y)\n", "    loss = crit(model(x), y) / 4\n")
    assert _pairs(divided) == [("TK112", 11)]


def test_the_function_s_division_does_not_count_for_the_loop_s_loss() -> None:
    # near miss: the function divides its local `loss`, the loop's own `loss` is undivided; read as
    # one variable, the function's division would hide the loop's mistake
    src = ACCUMULATE.replace("    loss = crit(model(x), y)\n", "    loss = crit(model(x), y) / 4\n").replace(
        "    train_step(x, y)\n", "    train_step(x, y)\n    loss = aux(model, x)\n    loss.backward()\n")
    assert _pairs(src) == [("TK102", 10), ("TK112", 11)]
