"""Host syncs (TK302), version-compatible imports (TK401) and loader advice (TK5xx).

``.item()``, ``float()`` and ``.cpu().numpy()`` reported once and worded for a script that never
mentions CUDA, tensors made on the CPU that are no sync, ``# trainkit: ignore`` on either line of
a multi-line call, a fallback import of ``torch.cuda.amp`` and datasets already on the GPU. Each
correct loop here was once reported as a mistake (or a mistake was missed); the planted-mistake
variants next to them keep the rules from going quiet.
"""
from __future__ import annotations

import textwrap

from tests.lint._loop_analysis_helpers import _pairs
from trainkit.lint import lint_source


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
        optimizer.step(); optimizer.zero_grad()
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
        optimizer.step(); optimizer.zero_grad()
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
        optimizer.step(); optimizer.zero_grad()
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
        optimizer.step(); optimizer.zero_grad()
        preds = logits.argmax(1).cpu().numpy()
    """
    assert _pairs(src) == [("TK302", 6)]


def test_a_bare_numpy_is_no_sync_but_numpy_force_is() -> None:
    """``.numpy()`` refuses a GPU tensor, so where it runs its tensor is on the host: it was
    reported all the same; ``.numpy(force=True)`` copies a GPU tensor to the host, and was not."""
    src = """
    for x, y in loader:
        logits = model(x)
        criterion(logits, y).backward()
        optimizer.step(); optimizer.zero_grad()
        labels = y.numpy()
        probs = logits.detach().numpy(force=True)
        same = logits.detach().numpy(force=False)
    """
    assert _pairs(src) == [("TK302", 7)]


def test_ignore_comment_on_the_first_or_last_line_of_a_multi_line_call() -> None:
    src = """
    for batch in loader:
        loss = model(batch)
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
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
