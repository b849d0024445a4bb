"""TK113 (gradients zeroed between backward() and the step they feed) and TK114 (never zeroed).

Each planted mistake is found at its line; each correct variant (GANs, Hugging Face's loop,
L-BFGS closures, accumulation, batches thrown away on purpose, helpers) gets nothing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import pytest

from tests.lint._helpers import REPO_ROOT
from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), select="TK113,TK114")]


# --------------------------------------------------------------------------- TK113: found

WIPED = """
import torch
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = crit(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
"""


def test_zero_grad_between_backward_and_step_is_reported_at_the_zero_grad() -> None:
    (finding,) = lint_source(textwrap.dedent(WIPED))
    assert (finding.code, finding.line, finding.severity) == ("TK113", 8, "error")
    assert "after the backward on line 7 and before `optimizer.step()` on line 9" in finding.message
    assert finding.fix.startswith("move `optimizer.zero_grad()` after `optimizer.step()`")


@pytest.mark.parametrize("zeroing", ["model.zero_grad()", "optimizer.zero_grad(set_to_none=False)",
                                     "for p in model.parameters():\n        p.grad = None"])
def test_the_models_zero_grad_and_grads_set_to_none_are_reported(zeroing: str) -> None:
    assert _pairs(WIPED.replace("optimizer.zero_grad()", zeroing)) == [("TK113", 8 + zeroing.count("\n"))]


def test_a_scaled_backward_and_scaler_step_are_reported() -> None:
    src = """
    for x, y in loader:
        scaler.scale(crit(model(x), y)).backward()
        optimizer.zero_grad()
        scaler.step(optimizer)
        scaler.update()
    """
    assert _pairs(src) == [("TK113", 4)]


def test_zeroed_under_the_steps_own_if_wipes_the_window() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        (crit(model(x), y) / 4).backward()
        if (i + 1) % 4 == 0:
            optimizer.zero_grad()
            optimizer.step()
    """
    assert _pairs(src) == [("TK113", 5)]


def test_inside_a_step_function_called_by_the_loop_once_with_where() -> None:
    src = """
    def train_step(model, batch, opt):
        loss = model(*batch)
        loss.backward()
        opt.zero_grad()
        opt.step()
        return loss
    for batch in loader:
        loss = train_step(model, batch, optimizer)
    """
    found = lint_source(textwrap.dedent(src), select="TK113")
    assert [(f.code, f.line) for f in found] == [("TK113", 5)]
    assert "in `train_step()`, which runs on every iteration" in found[0].message


def test_inside_a_method_no_loop_of_the_file_calls() -> None:
    src = """
    class Trainer:
        def training_step(self, batch):
            loss = self.model(**batch).loss
            loss.backward()
            self.optimizer.zero_grad()
            self.optimizer.step()
    """
    assert _pairs(src) == [("TK113", 6)]


def test_inside_a_helper_defined_in_the_loop_body() -> None:
    src = """
    for x, y in loader:
        def _backward(_loss):
            _loss.backward()
            optimizer.zero_grad()
            optimizer.step()
        _backward(crit(model(x), y))
    """
    assert _pairs(src) == [("TK113", 5)]


def test_zeroed_after_a_micro_batch_loop_and_before_its_step() -> None:
    src = """
    while True:
        for micro in range(accum):
            (model(next(it)) / accum).backward()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
    """
    assert _pairs(src) == [("TK113", 5)]


# --------------------------------------------------------------------------- TK113: correct loops


@pytest.mark.parametrize("src", [
    # zeroed at the top, before the backward; and after the step
    "for x in data:\n    optimizer.zero_grad()\n    model(x).backward()\n    optimizer.step()\n",
    "for x in data:\n    model(x).backward()\n    optimizer.step()\n    optimizer.zero_grad()\n",
    # a GAN: the other optimizer's gradients
    "for x in data:\n    lossD(x).backward()\n    optG.zero_grad()\n    optD.step()\n"
    "    lossG(x).backward()\n    optG.step()\n    optD.zero_grad()\n",
    # the step in the other arm
    "for x in data:\n    model(x).backward()\n    if warmup:\n        optimizer.zero_grad()\n"
    "    else:\n        optimizer.step()\n",
    # a bad batch thrown away on purpose, behind a condition of its own or a continue
    "for x in data:\n    loss = model(x)\n    loss.backward()\n    if not torch.isfinite(loss):\n"
    "        optimizer.zero_grad()\n    optimizer.step()\n    optimizer.zero_grad()\n",
    "for x in data:\n    try:\n        model(x).backward()\n    except RuntimeError:\n"
    "        optimizer.zero_grad()\n    optimizer.step()\n    optimizer.zero_grad()\n",
    "for x in data:\n    model(x).backward()\n    with guard():\n        optimizer.zero_grad()\n"
    "        continue\n    optimizer.step()\n",
    # an L-BFGS closure zeroes and runs its own backward inside the step
    "for x in data:\n    aux(x).backward()\n    optimizer.zero_grad()\n    optimizer.step(closure)\n",
    # gradients written by hand after the zeroing
    "for x in data:\n    aux(x).backward()\n    optimizer.zero_grad()\n"
    "    for p, g in zip(params, torch.autograd.grad(model(x), params)):\n        p.grad = g\n"
    "    optimizer.step()\n",
    # accumulation: zeroed at a window's start (TK103's territory) or after its step
    "for i, x in enumerate(data):\n    if i % 4 == 0:\n        optimizer.zero_grad()\n"
    "    (model(x) / 4).backward()\n    if (i + 1) % 4 == 0:\n        optimizer.step()\n",
])
def test_correct_placements_are_not_reported(src: str) -> None:
    assert _pairs(src) == []


def test_tk103s_zero_grad_on_every_micro_batch_is_reported_once() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        (crit(model(x), y) / 4).backward()
        optimizer.zero_grad()
        if (i + 1) % 4 == 0:
            optimizer.step()
    """
    assert [(f.code, f.line) for f in lint_source(textwrap.dedent(src), select="TK103,TK113")] == [("TK103", 4)]


def test_the_dcgan_tutorial_and_hugging_faces_loop() -> None:
    dcgan = """
    import torch
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    for real, _ in dataloader:
        netD.zero_grad()
        errD_real = criterion(netD(real).view(-1), ones)
        errD_real.backward()
        fake = netG(noise)
        criterion(netD(fake.detach()).view(-1), zeros).backward()
        netG.zero_grad()
        optimizerD.step()
        criterion(netD(fake).view(-1), ones).backward()
        optimizerG.step()
    """
    assert _pairs(dcgan) == []
    hf = """
    model.zero_grad()
    for step, batch in enumerate(train_dataloader):
        loss = model(**batch).loss / args.gradient_accumulation_steps
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
    """
    assert _pairs(hf) == []


def test_a_model_zero_grad_whose_optimizer_the_file_does_not_tie_to_it_is_not_reported() -> None:
    # `optimizer` passed in: `model` may hold other parameters (a GAN's other half), so no error is claimed
    src = "def fit(model, data, optimizer):\n    for x in data:\n        model(x).backward()\n" \
          "        model.zero_grad()\n        optimizer.step()\n"
    assert _pairs(src) == []
    assert _pairs(src.replace("    for x", "    optimizer = Adam(model.parameters())\n    for x")) == [("TK113", 5)]


# --------------------------------------------------------------------------- TK114: found

NEVER = """
def train(model, loader, optimizer):
    for x, y in loader:
        loss = crit(model(x), y)
        loss.backward()
        optimizer.step()
"""


def test_a_loop_that_never_zeroes_is_reported_at_the_step() -> None:
    (finding,) = lint_source(textwrap.dedent(NEVER))
    assert (finding.code, finding.line, finding.severity) == ("TK114", 6, "error")
    assert "nothing in the file zeroes its gradients" in finding.message
    assert finding.fix.startswith("call `optimizer.zero_grad()` once per step")


def test_the_gan_half_nobody_zeroes_is_reported() -> None:
    src = """
    import torch
    optD = torch.optim.Adam(netD.parameters())
    optG = torch.optim.Adam(netG.parameters())
    for real in loader:
        netD.zero_grad()
        fake = netG(noise)
        (crit(netD(real), ones) + crit(netD(fake.detach()), zeros)).backward()
        optD.step()
        crit(netD(fake), ones).backward()
        optG.step()
    """
    assert _pairs(src) == [("TK114", 11)]
    # a function of another module handed the generator may zero it: not reported
    assert _pairs(src.replace("netG(noise)", "generate(netG, noise)")) == []


@pytest.mark.parametrize("step", ["scaler.step(optimizer)", "amp.step(optimizer, clip_grad_norm=1.0)"])
def test_steps_through_a_scaler_or_trainkits_amp_are_reported(step: str) -> None:
    assert _pairs(NEVER.replace("optimizer.step()", step)) == [("TK114", 6)]


def test_a_step_function_called_by_the_loop_is_read() -> None:
    src = """
    def train_step(batch):
        model(*batch).backward()
        optimizer.step()
    for batch in loader:
        train_step(batch)
    """
    assert _pairs(src) == [("TK114", 4)]


# --------------------------------------------------------------------------- TK114: correct or unseen


@pytest.mark.parametrize("zeroing", [
    "optimizer.zero_grad()", "model.zero_grad()", "optimizer.zero_grad(set_to_none=True)",
    "for p in model.parameters():\n            p.grad = None",
    "for p in model.parameters():\n            p.grad.zero_()",
    "for p in model.parameters():\n            p.grad.data.zero_()",
    "for p in model.parameters():\n            del p.grad",
    "torch._foreach_zero_([p.grad for p in model.parameters()])",
    "zero_grads(model)", "set_grads_to_none(model)", "reset_gradients(model)",  # another module's helper
    "utils.before_step(model)", "trainer.on_step_end(optimizer)", "optimizer.clear_grad_buffers()",
])
def test_zeroing_in_any_shape_keeps_it_quiet(zeroing: str) -> None:
    assert _pairs(NEVER.replace("optimizer.step()", "optimizer.step()\n        " + zeroing)) == []


def test_zeroing_anywhere_in_the_file_keeps_it_quiet() -> None:
    helper = "def clear(m):\n    for p in m.parameters():\n        p.grad = None\n"
    assert _pairs(helper + NEVER.replace("optimizer.step()", "optimizer.step()\n        clear(model)")) == []
    hook = "hooks.append(optimizer.zero_grad)\n"  # a callback that zeroes, run where it cannot be seen
    assert _pairs(NEVER + hook) == []
    # a helper of this file that passes the model on to another module's
    relay = "def after(m):\n    external.tidy(m)\n"
    assert _pairs(relay + NEVER.replace("optimizer.step()", "optimizer.step()\n        after(model)")) == []
    # but one that only logs hides nothing
    logs = "def show(loss):\n    print(loss.item())\n"
    assert _pairs(logs + NEVER.replace("optimizer.step()", "optimizer.step()\n        show(loss)")) == [("TK114", 8)]


def test_accumulate_blocks_closures_and_fresh_optimizers_are_not_reported() -> None:
    block = "import trainkit as tk\nwith tk.accumulate(4, optimizer):\n    for x in data:\n" \
            "        model(x).backward()\n        optimizer.step()\n"
    assert _pairs(block) == []
    assert _pairs(block.replace("tk.accumulate(4, optimizer)", "accelerator.accumulate(model)")) == []
    lbfgs = "for x in data:\n    model(x).backward()\n    optimizer.step(closure)\n"
    assert _pairs(lbfgs) == []
    meta = "import torch\nfor task in tasks:\n    learner = clone(model)\n" \
           "    opt = torch.optim.SGD(learner.parameters())\n    learner(task).backward()\n    opt.step()\n"
    assert _pairs(meta) == []


def test_nanogpts_loop_and_an_accumulation_zeroing_after_the_step() -> None:
    nanogpt = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    """
    assert _pairs(nanogpt) == []
    accumulating = """
    for i, (x, y) in enumerate(loader):
        (crit(model(x), y) / n).backward()
        if (i + 1) % n == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(accumulating) == []


def test_a_deepspeed_engine_step_is_no_optimizer_step() -> None:
    # the engine zeroes the gradients itself
    assert _pairs("for batch in loader:\n    engine.backward(engine(batch))\n    engine.step()\n") == []


# --------------------------------------------------------------------------- the CLI: select, ignore, JSON


def test_select_ignore_comments_and_json(tmp_path: Path) -> None:
    wiped, never = tmp_path / "wiped.py", tmp_path / "never.py"
    wiped.write_text(textwrap.dedent(WIPED), encoding="utf-8")
    never.write_text(textwrap.dedent(NEVER), encoding="utf-8")
    run = [sys.executable, "-m", "trainkit.lint", "--format", "json", str(wiped), str(never)]

    def found(*options: str) -> List[Tuple[str, str, int, str]]:
        out = subprocess.run(run + list(options), capture_output=True, text=True, cwd=REPO_ROOT, check=False)
        assert out.returncode == (1 if json.loads(out.stdout) else 0), out.stderr
        return [(Path(f["path"]).name, f["code"], f["line"], f["severity"]) for f in json.loads(out.stdout)]

    assert found("--select", "TK113") == [("wiped.py", "TK113", 8, "error")]
    assert found("--select", "TK114") == [("never.py", "TK114", 6, "error")]
    assert found("--ignore", "TK113,TK114") == []
    wiped.write_text(textwrap.dedent(WIPED).replace("optimizer.zero_grad()", "optimizer.zero_grad()  # trainkit: "
                                                    "ignore[TK113]"), encoding="utf-8")
    never.write_text(textwrap.dedent(NEVER).replace("optimizer.step()", "optimizer.step()  # trainkit: ignore[TK114]"),
                     encoding="utf-8")
    assert found() == []
