"""Which loops accumulate (TK102, TK103), and the loss followed to its division (TK101, TK102).

A WGAN's generator stepped every n critic batches, a DQN trained every k environment steps and
optimizers named or built in unusual ways; apex's ``scale_loss``, divisions spelled as calls or a
precomputed reciprocal, and divisions after ``backward()`` that only log. Each correct loop here
was once reported as a mistake (or a mistake was missed); the planted-mistake variants next to
them keep the rules from going quiet.
"""
from __future__ import annotations

import textwrap

from tests.lint._loop_analysis_helpers import _pairs
from trainkit.lint import lint_source


# --------------------------------------------------------------------------- TK102/TK103: who accumulates

WGAN = """
import torch
def train(generator, discriminator, dataloader, n_critic=5):
    optimizer_G = torch.optim.RMSprop(generator.parameters(), lr=5e-5)
    optimizer_D = torch.optim.RMSprop(discriminator.parameters(), lr=5e-5)
    for i, (imgs, _) in enumerate(dataloader):
        optimizer_D.zero_grad()
        fake_imgs = generator(torch.randn(imgs.shape[0], 100)).detach()
        loss_D = -torch.mean(discriminator(imgs)) + torch.mean(discriminator(fake_imgs))
        loss_D.backward()
        optimizer_D.step()
        if i % n_critic == 0:
            optimizer_G.zero_grad()
            loss_G = -torch.mean(discriminator(generator(torch.randn(8, 100))))
            loss_G.backward()
            optimizer_G.step()
"""


def test_wgan_generator_every_n_critic_batches_is_not_accumulation() -> None:
    assert _pairs(WGAN) == []


def test_wgan_with_the_generator_zeroed_after_its_step_is_not_accumulation() -> None:
    src = """
    def train(netD, netG, loader, opt_D, opt_G, n_critic):
        for i, x in enumerate(loader):
            opt_D.zero_grad()
            netD(x).mean().backward()
            opt_D.step()
            if i % n_critic == 0:
                netG(x).mean().backward()
                opt_G.step()
                opt_G.zero_grad()
    """
    assert _pairs(src) == []


def test_dqn_training_every_k_env_steps_is_not_accumulation() -> None:
    src = """
    import torch.nn.functional as F
    def train(args, envs, q_network, rb, optimizer, obs):
        for global_step in range(args.total_timesteps):
            next_obs, rewards, terminations, truncations, infos = envs.step(q_network(obs).argmax(dim=1))
            if global_step > args.learning_starts:
                if global_step % args.train_frequency == 0:
                    data = rb.sample(args.batch_size)
                    loss = F.mse_loss(data.rewards, q_network(data.observations))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
    """
    assert _pairs(src) == []


def test_one_optimizer_accumulating_next_to_one_stepping_every_batch_is_still_reported() -> None:
    src = """
    def train(loader, opt_D, opt_G, k):
        for i, x in enumerate(loader):
            opt_D.zero_grad()
            loss_D = d_loss(x)
            loss_D.backward()
            opt_D.step()
            loss_G = g_loss(x)
            loss_G.backward()
            if (i + 1) % k == 0:
                opt_G.step()
                opt_G.zero_grad()
    """
    # opt_D.zero_grad() on every batch is opt_D's own: not TK103.
    assert _pairs(src) == [("TK102", 9)]


def test_zero_grad_before_a_step_with_no_backward_in_between_still_accumulates() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.zero_grad()
            optimizer.step()
    """
    # and the zero_grad between the backwards and the step wipes the window it steps (TK113)
    assert _pairs(src) == [("TK102", 4), ("TK113", 6)]
    # TK102 said "the update is `4` times too large", false while the step finds no gradient
    (tk102,) = [f for f in lint_source(textwrap.dedent(src)) if f.code == "TK102"]
    assert "too large" not in tk102.message.split("once that is fixed")[0]
    assert "`optimizer.zero_grad()` on line 6 wipes the window before the step (TK113)" in tk102.message
    assert "fix both together" in tk102.fix
    (tk113,) = [f for f in lint_source(textwrap.dedent(src)) if f.code == "TK113"]
    assert "every window's gradients are thrown away" in tk113.message  # not "every batch's"


def test_optimizers_named_optd_and_optg_are_recognised() -> None:
    src = """
    def train(netD, loader, optD, crit, k):
        for i, (x, y) in enumerate(loader):
            errD = crit(netD(x), y)
            errD.backward()
            if (i + 1) % k == 0:
                optD.step()
                optD.zero_grad()
    """
    assert _pairs(src) == [("TK102", 5)]
    assert _pairs(src.replace("optD", "optG")) == [("TK102", 5)]
    # Names that merely start with "opt" are not optimizers.
    assert _pairs(src.replace("optD", "options")) == []


def test_optimizers_built_by_unpacking_a_tuple_are_known_by_construction() -> None:
    # `gen` and `disc` are no optimizers' names: only their constructors say so
    src = """
    import torch
    def train(g_net, d_net, loader, n):
        gen, disc = torch.optim.Adam(g_net.parameters()), torch.optim.Adam(d_net.parameters())
        for i, x in enumerate(loader):
            g_net.loss(d_net, x).backward()
            if (i + 1) % n == 0:
                gen.step()
                gen.zero_grad()
    """
    assert _pairs(src) == [("TK102", 6)]


# --------------------------------------------------------------------------- following the loss


def test_apex_scale_loss_follows_the_loss_it_scales() -> None:
    src = """
    for step, batch in enumerate(loader):
        loss = model(**batch)[0]
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            model.zero_grad()
    """
    assert _pairs(src) == []
    undivided = src.replace("loss = loss / args.gradient_accumulation_steps", "pass")
    findings = lint_source(textwrap.dedent(undivided), ignore="TK112")
    assert [(f.code, f.line) for f in findings] == [("TK102", 8), ("TK102", 10)]
    assert "`loss` is never divided" in findings[0].message


def test_divisions_spelled_as_calls_or_a_precomputed_reciprocal() -> None:
    src = """
    def a(loader, accum):
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y).div(accum)
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    def b(loader, accum):
        loss_scale = 1.0 / accum
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) * loss_scale
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    def c(loader, accum):
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.div_(accum)
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_a_name_that_is_not_only_a_reciprocal_does_not_normalise() -> None:
    src = """
    loss_scale = 1.0 / accum
    loss_scale = 2.0
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) * loss_scale
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK102", 6)]


def test_in_place_division_after_backward_is_tk101() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        loss.div_(accum)
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK101", 5)]


def test_logging_division_of_a_detached_all_reduced_loss_is_not_tk101() -> None:
    src = """
    import torch.distributed as dist
    def train(model, loader, optimizer, criterion, world_size, writer):
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss = loss.detach()
            dist.all_reduce(loss)
            loss /= world_size
            writer.add_scalar("loss", loss, step)
    """
    assert _pairs(src) == []
    # Even in an accumulating loop: the name was rebound before the division.
    accumulating = src.replace("            optimizer.step()\n", "            if step % 4 == 3:\n                optimizer.step()\n")
    accumulating = accumulating.replace("criterion(model(x), y)", "criterion(model(x), y) / 4")
    assert _pairs(accumulating) == [("TK103", 6)]


def test_division_after_backward_in_a_loop_that_does_not_accumulate_is_not_tk101() -> None:
    src = """
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        loss = loss / len(x)
        optimizer.step()
        optimizer.zero_grad()
    """
    assert _pairs(src) == []
