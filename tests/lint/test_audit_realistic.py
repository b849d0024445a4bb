"""Regressions from an audit on realistic training scripts (tutorial, nanoGPT, HF, GAN, Trainer styles).

Each snippet is a loop written the way such scripts write it; the comment says what the linter
said and what it should say.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source))]


# --------------------------------------------------------------------------- TK103

# The "seven speed techniques" article (seed 002) zeroes gradients by setting them to None,
# `for param in model.parameters(): param.grad = None`. Written at the top of every micro-batch
# of a hand-written accumulation, it wipes the window's sum just as `optimizer.zero_grad()` does,
# but nothing was reported (only TK112, which already read `p.grad = None` as a zeroing).
GRADS_TO_NONE_EVERY_MICRO_BATCH = """
import torch
def train(model, loader, optimizer, accum):
    for i, (x, y) in enumerate(loader):
        for param in model.parameters():
            param.grad = None
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
"""


def test_grads_set_to_none_on_every_micro_batch_is_reported() -> None:
    assert _pairs(GRADS_TO_NONE_EVERY_MICRO_BATCH) == [("TK103", 6), ("TK112", 9)]


def test_grads_set_to_none_with_the_step_is_not_reported() -> None:
    src = """
    import torch
    def train(model, loader, optimizer, accum, epochs):
        for epoch in range(epochs):
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y) / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    for param in model.parameters():
                        param.grad = None
            if (i + 1) % accum != 0:
                optimizer.step()
                for param in model.parameters():
                    param.grad = None
    """
    assert _pairs(src) == []


def test_grads_set_to_none_with_an_undivided_loss_asks_for_both_fixes() -> None:
    # TK102 reads the wipe too: dividing alone would make the update `accum` times too small
    src = GRADS_TO_NONE_EVERY_MICRO_BATCH.replace(" / accum", "")
    found = lint_source(textwrap.dedent(src), select="TK102")
    assert [(f.code, f.line) for f in found] == [("TK102", 8)]
    assert "wipes the sum (TK103)" in found[0].message


# The DCGAN tutorial zeroes each half through its model (`netD.zero_grad()`, `netG.zero_grad()`),
# not its optimizer. With the generator accumulated over `accum` batches and the discriminator
# stepped on every batch, `netD.zero_grad()` at the top of each batch zeroes only D's gradients;
# G's running sum survives. It was reported as TK103 (wiping the accumulated gradients).
DCGAN_G_ACCUMULATED = """
import torch
import torch.optim as optim
netG = Generator().cuda()
netD = Discriminator().cuda()
optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
for epoch in range(num_epochs):
    for i, real in enumerate(dataloader, 1):
        netD.zero_grad()
        errD = criterion(netD(real.cuda()), ones) + criterion(netD(netG(noise()).detach()), zeros)
        errD.backward()
        optimizerD.step()
        errG = criterion(netD(netG(noise())), ones) / accum
        errG.backward()
        if i % accum == 0:
            optimizerG.step()
            netG.zero_grad()
    optimizerG.step()
    netG.zero_grad()
"""


def test_the_other_models_zero_grad_in_a_gan_is_not_reported() -> None:
    assert _pairs(DCGAN_G_ACCUMULATED) == []


def test_the_accumulated_models_zero_grad_in_a_gan_is_reported() -> None:
    # `netG.zero_grad()` at the top of each batch does wipe G's window
    src = DCGAN_G_ACCUMULATED.replace("        netD.zero_grad()\n",
                                      "        netD.zero_grad()\n        netG.zero_grad()\n")
    assert _pairs(src) == [("TK103", 11)]


def test_a_model_shared_by_both_optimizers_is_reported() -> None:
    # the accumulated optimizer holds that model's parameters too: its zero_grad wipes the window
    src = DCGAN_G_ACCUMULATED.replace(
        "optimizerG = optim.Adam(netG.parameters(),",
        "optimizerG = optim.Adam(list(netG.parameters()) + list(netD.parameters()),")
    assert _pairs(src) == [("TK103", 10)]


# --------------------------------------------------------------------------- TK202

# A GAN trained with mixed precision on one half only: the discriminator's loss goes through the
# scaler (`scaler.step(opt_d)`), the generator's is plain, after `opt_g.zero_grad()`. The plain
# `opt_g.step()` steps gradients its own unscaled backward made on freshly zeroed parameters, yet it
# was reported as stepping scaled gradients.
GAN_D_SCALED_G_PLAIN = """
import torch
scaler = torch.amp.GradScaler("cuda")
def train(G, D, loader, opt_g, opt_d):
    for real in loader:
        opt_d.zero_grad()
        with torch.autocast("cuda"):
            d_loss = D.loss(real, G.sample())
        scaler.scale(d_loss).backward()
        scaler.step(opt_d)
        scaler.update()
        opt_g.zero_grad()
        g_loss = G.loss(D)
        g_loss.backward()
        opt_g.step()
"""


def test_a_plain_step_after_its_own_zero_grad_and_plain_backward_is_not_reported() -> None:
    assert _pairs(GAN_D_SCALED_G_PLAIN) == []


def test_a_plain_step_first_in_the_iteration_after_its_zero_grad_is_not_reported() -> None:
    # the plain half first: the scaled backward of the previous iteration is zeroed before it
    src = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    def train(G, D, loader, opt_g, opt_d):
        for real in loader:
            opt_d.zero_grad()
            d_loss = D.loss(real, G.sample().detach())
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            with torch.autocast("cuda"):
                g_loss = G.loss(D)
            scaler.scale(g_loss).backward()
            scaler.step(opt_g)
            scaler.update()
    """
    assert _pairs(src) == []


def test_a_plain_step_after_a_scaled_backward_following_its_zero_grad_is_reported() -> None:
    # the generator's loss scaled too: its plain step takes scaled gradients
    src = GAN_D_SCALED_G_PLAIN.replace("        g_loss.backward()", "        scaler.scale(g_loss).backward()")
    assert _pairs(src) == [("TK202", 15)]


def test_a_plain_step_zeroed_only_after_it_is_reported() -> None:
    # zero_grad after the step: the scaled backward of the other half (through D into G's
    # parameters) is still in G's gradients when the next iteration's plain step runs
    src = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    def train(G, D, loader, opt_g, opt_d):
        for real in loader:
            g_loss = G.loss(D)
            g_loss.backward()
            opt_g.step()
            opt_g.zero_grad()
            with torch.autocast("cuda"):
                d_loss = D.loss(real, G.sample())
            scaler.scale(d_loss).backward()
            scaler.step(opt_d)
            scaler.update()
            opt_d.zero_grad()
    """
    assert _pairs(src) == [("TK202", 8)]


def test_the_other_models_zero_grad_does_not_throw_the_leftover_window_away() -> None:
    # without the flush after the batch loop TK112 fires; `netD.zero_grad()` zeroes D only, so G's
    # leftover micro-batches are carried into the next pass's first window, not thrown away by it
    src = DCGAN_G_ACCUMULATED.replace("    optimizerG.step()\n    netG.zero_grad()\n", "")
    found = lint_source(textwrap.dedent(src))
    assert [(f.code, f.line) for f in found] == [("TK112", 16)]
    assert "netD.zero_grad()" not in found[0].message
    assert "carried into the next epoch" in found[0].message


def test_a_plain_step_after_its_models_zero_grad_is_not_reported() -> None:
    # the DCGAN tutorial zeroes through the model: `netG.zero_grad()` wipes what the scaled
    # discriminator loss left in G's parameters (G is the only model optimizerG is built on)
    src = """
    import torch
    import torch.optim as optim
    netG, netD = Generator().cuda(), Discriminator().cuda()
    optimizerD = optim.Adam(netD.parameters(), lr=2e-4)
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4)
    scaler = torch.amp.GradScaler("cuda")
    for real in dataloader:
        netD.zero_grad()
        with torch.autocast("cuda"):
            errD = criterion(netD(real), ones) + criterion(netD(netG(noise())), zeros)
        scaler.scale(errD).backward()
        scaler.step(optimizerD)
        scaler.update()
        netG.zero_grad()
        errG = criterion(netD(netG(noise())), ones)
        errG.backward()
        optimizerG.step()
    """
    assert _pairs(src) == []
    # zeroing only one of two models the optimizer is built on leaves the other's scaled gradients
    shared = src.replace("optim.Adam(netG.parameters(), lr=2e-4)",
                         "optim.Adam([*netG.parameters(), *netD.parameters()], lr=2e-4)")
    assert _pairs(shared) == [("TK202", 18)]
