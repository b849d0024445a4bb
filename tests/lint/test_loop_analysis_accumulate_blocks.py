"""Accumulation blocks, accelerate's and ``tk.accumulate``'s: dividing the loss by the count (TK104)
and a ``zero_grad()`` the block does not hold (TK106).

A masked token mean, a second loss's weight and a block given its model, its own optimizer or
one an outer or sibling block holds. Each correct loop here was once reported as a mistake (or a
mistake was missed); the planted-mistake variants next to them keep the rules from going quiet.
"""
from __future__ import annotations

import textwrap

from tests.lint._loop_analysis_helpers import _pairs
from trainkit.lint import lint_source


# --------------------------------------------------------------------------- TK104: dividing by the count


def test_masked_token_mean_inside_accelerate_accumulate_is_not_tk104() -> None:
    src = """
    import torch
    def train(accelerator, model, loader, optimizer):
        for batch in loader:
            with accelerator.accumulate(model):
                tok = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="none")
                mask = batch["attention_mask"]
                loss = (tok * mask).sum() / mask.sum()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []
    # Dividing by the accumulation count there is still reported, after the mean or instead of it.
    counted = src.replace("accelerator.backward(loss)", "accelerator.backward(loss / args.gradient_accumulation_steps)")
    findings = lint_source(textwrap.dedent(counted))
    assert [(f.code, f.line) for f in findings] == [("TK104", 9)]
    assert "`args.gradient_accumulation_steps` times too small" in findings[0].message


def test_tk104_division_by_the_n_given_to_tk_accumulate() -> None:
    src = """
    import trainkit as tk
    with tk.accumulate(k, optimizer):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss = loss.div(k)
            loss.backward()
            optimizer.step()
    """
    assert _pairs(src) == [("TK104", 6)]
    assert _pairs(src.replace("loss.div(k)", "loss / num_tokens")) == []


def test_tk104_a_second_loss_s_weight_is_no_division_by_the_count() -> None:
    # Two losses, two backward calls, under tk.accumulate(4): `0.1 * aux` (or `aux / 2`) is the
    # aux loss's weight. It was an error: "divides the loss by `0.1` ... `0.1` times too small".
    src = """
    import trainkit as tk
    with tk.accumulate(4, optimizer):
        for x, y in loader:
            h = body(x)
            ce = criterion(head(h), y)
            aux = 0.1 * mse(dec(h), x)
            ce.backward(retain_graph=True)
            aux.backward()
            optimizer.step()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("0.1 * mse(dec(h), x)", "mse(dec(h), x) / 2")) == []
    assert _pairs(src.replace("0.1 * mse(dec(h), x)", "0.25 * mse(dec(h), x)")) == []
    # every loss divided by the count: the mistake, said with the count a multiplier stands for
    both = src.replace("criterion(head(h), y)", "criterion(head(h), y) * 0.25").replace(
        "0.1 * mse(dec(h), x)", "mse(dec(h), x) / 4")
    findings = lint_source(textwrap.dedent(both))
    assert [(f.code, f.line) for f in findings] == [("TK104", 6), ("TK104", 7)]
    assert "divides the loss by `4`" in findings[0].message and "`4` times too small" in findings[0].message
    # one loss: a literal other than the block's count is a scale of its own, not the count
    one = """
    import trainkit as tk
    with tk.accumulate(4, optimizer):
        for x, y in loader:
            loss = criterion(model(x), y) / {k}
            loss.backward()
            optimizer.step()
    """
    assert _pairs(one.format(k=2)) == [] and _pairs(one.format(k=4)) == [("TK104", 5)]
    assert _pairs(one.format(k=0.3)) == []


# --------------------------------------------------------------------------- TK106: zero_grad the block does not hold


_TK106 = """
import trainkit as tk
def train(model, loader, criterion, optimizer):
    with tk.accumulate(4, optimizer):
        for x, y in loader:
            criterion(model(x), y).backward()
            optimizer.step()
            model.zero_grad()
"""


def test_tk106_model_zero_grad_inside_accumulate() -> None:
    findings = lint_source(textwrap.dedent(_TK106))
    assert [(f.code, f.line, f.severity) for f in findings] == [("TK106", 8, "error")]
    assert "wiping the window's running gradient sum at every micro-batch" in findings[0].message
    assert "`optimizer.zero_grad()` instead" in findings[0].fix and "`model=model`" in findings[0].fix
    # Through the imports too: `from trainkit import accumulate as acc`, and a while loop.
    aliased = _TK106.replace("import trainkit as tk", "from trainkit import accumulate as acc").replace(
        "tk.accumulate(", "acc(").replace("for x, y in loader:", "while True:")
    assert _pairs(aliased) == [("TK106", 8)]
    # Not trainkit's: accelerate's accumulate is left alone.
    assert _pairs(_TK106.replace("tk.accumulate(4, optimizer)", "accelerator.accumulate(model)")) == []


def test_tk106_not_reported_when_the_block_is_given_that_model() -> None:
    given = _TK106.replace("tk.accumulate(4, optimizer)", "tk.accumulate(4, optimizer, model=model)")
    assert _pairs(given) == []
    # model= names another object (the DDP wrapper): the bare model's zero_grad() still wipes.
    other = _TK106.replace("tk.accumulate(4, optimizer)", "tk.accumulate(4, optimizer, model=ddp_model)")
    assert _pairs(other) == [("TK106", 8)]


def test_tk106_not_reported_for_the_blocks_own_optimizer() -> None:
    own = _TK106.replace("model.zero_grad()", "optimizer.zero_grad()")
    assert _pairs(own) == []
    keyword = own.replace("tk.accumulate(4, optimizer)", "tk.accumulate(n=4, optimizer=self.opt)").replace(
        "optimizer.step()", "self.opt.step()").replace("optimizer.zero_grad()", "self.opt.zero_grad()")
    assert _pairs(keyword) == []
    assert _pairs(keyword.replace("self.opt.zero_grad()", "self.model.zero_grad()")) == [("TK106", 8)]


def test_tk106_not_reported_for_an_optimizer_an_outer_or_sibling_block_holds() -> None:
    # A GAN accumulating both halves: each zero_grad() is held by one of the two blocks (only the
    # first block of the `with` was asked: "`oG.zero_grad()` runs inside `tk.accumulate(...)`, which
    # holds only `oD.zero_grad()`", an error).
    gan = """
    import trainkit as tk
    def train(G, D, loader, oG, oD):
        with tk.accumulate(2, oD), tk.accumulate(2, oG):
            for real in loader:
                D(G(z).detach()).mean().backward()
                oD.step()
                oD.zero_grad()
                (-D(G(z)).mean()).backward()
                oG.step()
                oG.zero_grad()
    """
    assert _pairs(gan) == []
    nested = """
    import trainkit as tk
    def train(G, D, loader, oG, oD):
        with tk.accumulate(2, oD):
            with tk.accumulate(2, oG):
                for real in loader:
                    D(G(z).detach()).mean().backward()
                    oD.step()
                    oD.zero_grad()
                    (-D(G(z)).mean()).backward()
                    oG.step()
                    oG.zero_grad()
    """
    assert _pairs(nested) == []
    # a model neither block was given still wipes
    assert _pairs(gan.replace("oG.zero_grad()", "G.zero_grad()")) == [("TK106", 11)]


def test_tk106_not_reported_outside_the_block_or_before_its_first_backward() -> None:
    after = _TK106.replace("            model.zero_grad()\n", "") + "    model.zero_grad()\n"
    assert _pairs(after) == []
    # A block per epoch: at its start the window is empty (the previous block's exit stepped and zeroed).
    per_epoch = """
    import trainkit as tk
    for epoch in range(3):
        with tk.accumulate(4, optimizer):
            model.zero_grad()
            for x, y in loader:
                criterion(model(x), y).backward()
                optimizer.step()
    """
    assert _pairs(per_epoch) == []
    # A block per batch: after the block's backward it wipes what the exit's step would use.
    per_batch = """
    import trainkit as tk
    for x, y in loader:
        with tk.accumulate(4, optimizer):
            model.zero_grad()
            criterion(model(x), y).backward()
            model.zero_grad()
            optimizer.step()
    """
    assert _pairs(per_batch) == [("TK106", 7)]
