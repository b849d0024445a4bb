"""Which loops accumulate, which branches exclude each other, which conditions are real.

Each correct loop here was once reported as a mistake (or a mistake was missed); the
planted-mistake variants next to them keep the rules from going quiet.
"""
from __future__ import annotations

import sys
import textwrap
from typing import List, Tuple

import pytest

from trainkit.lint import lint_source

# The lint parses with the running Python's grammar: before 3.10 a ``match`` is a syntax error.
needs_match = pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements need Python 3.10+")


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str, **kwargs: object) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), **{"ignore": "TK112", **kwargs})]  # type: ignore[arg-type]


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
    assert _pairs(src) == [("TK102", 4)]


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


# --------------------------------------------------------------------------- TK202: exclusive branches


AMP_TWO_IFS = """
import torch
def train(model, loader, optimizer, use_amp, accum=4):
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (i + 1) % accum == 0:
            if use_amp:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
"""


def test_optional_amp_in_two_ifs_on_the_same_flag_is_exclusive() -> None:
    assert _pairs(AMP_TWO_IFS) == []


def test_two_ifs_are_not_exclusive_when_the_flag_changes_between_them() -> None:
    changed = AMP_TWO_IFS.replace("        if (i + 1) % accum == 0:\n", "        use_amp = i > 10\n        if (i + 1) % accum == 0:\n")
    assert _pairs(changed) == [("TK202", 17)]
    # A test that calls something may answer differently the second time.
    called = AMP_TWO_IFS.replace("if use_amp:", "if coin():")
    assert _pairs(called) == [("TK202", 16)]


# --------------------------------------------------------------------------- conditions: match, device checks


@needs_match
def test_match_case_bodies_are_conditional() -> None:
    src = """
    import gc
    def train(model, loader, optimizer, phase):
        for batch in loader:
            loss = model(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            match phase:
                case "end_of_epoch":
                    gc.collect()
                case _:
                    pass
    """
    assert _pairs(src) == []


@needs_match
def test_match_on_a_modulo_is_an_accumulation_guard() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        match i % 4:
            case 3:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK102", 4)]


def test_a_device_check_is_not_a_condition() -> None:
    src = """
    import gc
    import torch
    def train(model, loader, optimizer, device):
        for x, y in loader:
            loss = model(x.to(device), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if device.type == "cuda":
                gc.collect()
    """
    assert _pairs(src) == [("TK301", 11), ("TK301", 13)]
    assert _pairs(src.replace('device.type == "cuda"', "step % 100 == 0")) == [("TK301", 11)]


# --------------------------------------------------------------------------- TK201: where update() may be


def test_scaler_step_per_optimizer_with_one_update_in_the_batch_loop() -> None:
    src = """
    import torch
    def train(model, loader, optimizers):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            for opt in optimizers:
                opt.zero_grad()
            scaler.scale(model(x, y)).backward()
            for opt in optimizers:
                scaler.step(opt)
            scaler.update()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("            scaler.update()\n", "")) == [("TK201", 10)]


def test_scaler_step_per_optimizer_in_a_train_step_function() -> None:
    src = """
    def train_step(scaler, loss, optimizers):
        scaler.scale(loss).backward()
        for opt in optimizers:
            scaler.step(opt)
        scaler.update()
    """
    assert _pairs(src) == []


def test_update_once_after_the_whole_batch_loop_is_still_tk201() -> None:
    src = """
    for x, y in loader:
        scaler.scale(model(x, y)).backward()
        scaler.step(optimizer)
    scaler.update()
    """
    assert _pairs(src) == [("TK201", 4)]


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


# --------------------------------------------------------------------------- TK401: version-compatible imports


def test_fallback_import_of_torch_cuda_amp_is_not_tk401() -> None:
    src = """
    try:
        from torch.amp import GradScaler
    except ImportError:
        from torch.cuda.amp import GradScaler
    scaler = GradScaler()
    """
    assert _pairs(src) == []
    # Imported only in the handler, the deprecated name is what the code uses.
    only_there = """
    try:
        import apex
    except ImportError:
        from torch.cuda.amp import GradScaler
    scaler = GradScaler()
    """
    assert _pairs(only_there) == [("TK401", 6)]


# --------------------------------------------------------------------------- TK5xx: datasets already on the GPU


def test_no_pin_memory_or_workers_advice_for_a_dataset_already_on_cuda() -> None:
    src = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    X = torch.randn(10000, 784, device="cuda")
    Y = torch.randint(0, 10, (10000,), device="cuda")
    loader = DataLoader(TensorDataset(X, Y), batch_size=256, shuffle=True)
    dev = torch.device("cuda:0")
    ds = TensorDataset(torch.randn(8, 2).to(dev), torch.randn(8).cuda())
    other = DataLoader(ds, batch_size=4)
    """
    assert _pairs(src) == []
    on_cpu = src.replace('device="cuda"', 'device="cpu"')
    assert _pairs(on_cpu) == [("TK501", 6), ("TK502", 6)]


def test_host_sync_wording_in_a_script_that_never_mentions_cuda() -> None:
    src = """
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    """
    (finding,) = lint_source(textwrap.dedent(src))
    assert finding.code == "TK302"
    assert finding.message.endswith("forces a device sync on every training step (the CPU waits for the GPU when there is one)")
    (on_gpu,) = lint_source(textwrap.dedent(src) + "model.cuda()\n")
    assert "`loss.item()` waits for the GPU on every training step" in on_gpu.message


def test_item_of_a_tensor_made_on_the_cpu_is_no_sync() -> None:
    # A DQN's epsilon-greedy draw: torch.rand without device= makes a CPU tensor.
    src = """
    import torch
    for t in range(total_steps):
        if torch.rand(1).item() < eps:
            action = torch.randint(0, 2, (1,), generator=g).item()
        else:
            action = policy(state)
        state, loss = env_step(action)
        loss.backward()
        optimizer.step()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("torch.rand(1)", 'torch.rand(1, device="cuda")')) == [("TK302", 4)]
    assert _pairs(src.replace("torch.rand(1)", "torch.rand_like(x)")) == [("TK302", 4)]
    assert _pairs(src.replace("torch.rand(1)", "torch.tensor([0.5, -1])")) == []
    # torch.tensor of a tensor is made on that tensor's device: maybe a GPU
    assert _pairs(src.replace("torch.rand(1)", "torch.tensor(q_values)")) == [("TK302", 4)]
    moved = src.replace("import torch", 'import torch\n    torch.set_default_device("cuda")')
    assert _pairs(moved) == [("TK302", 5), ("TK302", 6)]


def test_float_of_the_loss_is_a_sync_as_item_is() -> None:
    # torch's FAQ writes `total_loss += float(loss)` (to drop the graph): a host read all the same.
    src = """
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += float(loss)
        right = int(logits.argmax())
        fine = float(total_loss) + int(x.shape[0]) + float(lr)
        once = float(loss.item())
    """
    assert _pairs(src) == [("TK302", 7), ("TK302", 8), ("TK302", 10)]
    (finding, *_) = lint_source(textwrap.dedent(src))
    assert finding.message.startswith("`float(loss)` reads a tensor on the host, as `.item()` does")


# --------------------------------------------------------------------------- one report, silenced where written


def test_cpu_numpy_chain_is_one_sync() -> None:
    src = """
    for x, y in loader:
        logits = model(x)
        criterion(logits, y).backward()
        optimizer.step()
        preds = logits.argmax(1).cpu().numpy()
    """
    assert _pairs(src) == [("TK302", 6)]


def test_ignore_comment_on_the_first_or_last_line_of_a_multi_line_call() -> None:
    src = """
    for batch in loader:
        loss = model(batch)
        loss.backward()
        optimizer.step()
        print(  # trainkit: ignore[TK302]
            loss.item(),
        )
        print(
            loss.tolist(),
        )  # trainkit: ignore[TK302]
        print(
            loss.cpu(),
        )  # trainkit: ignore[TK101]
    """
    assert _pairs(src) == [("TK302", 13)]


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
