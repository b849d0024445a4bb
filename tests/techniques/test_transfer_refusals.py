"""tk.to_device refuses a model: it moves batches, and a model given to it was returned as it
was, silently on the host (``model = tk.to_device(model, "cuda")``), with torch's device-mismatch
error only at the first forward, or nothing at all on a CPU run. Refused before anything moved."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def test_to_device_refuses_a_model_naming_model_to(tmp_path):
    model = torch.nn.Linear(2, 2)
    with tk.session(logdir=tmp_path, system_metrics=False):
        with pytest.raises(TypeError, match=r"model\.to\(device\)") as e:
            tk.to_device(model, "meta")
        assert "Linear" in str(e.value)
        batch = tk.to_device({"x": torch.ones(2, 2)}, "meta")  # a batch still moves
    assert model.weight.device.type == "cpu" and batch["x"].device.type == "meta"
    assert [st for st, _ in scalars(tmp_path)["trainkit/h2d_ms"]] == [1]  # the batch's copy only


def test_to_device_without_a_session_refuses_a_model_too():
    with pytest.raises(TypeError, match="a model"):
        tk.to_device(torch.nn.Sequential(torch.nn.Linear(2, 2)), "cpu")


@pytest.mark.parametrize("make", [
    lambda: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2),
    lambda: tk.patch([torch.ones(2, 2)]),
    lambda: (b for b in [torch.ones(2, 2)]),
], ids=["DataLoader", "patched", "generator"])
def test_to_device_refuses_a_loader_naming_the_per_batch_call(tmp_path, make):
    # A loader given to tk.to_device was returned as it was: its batches stayed on the host,
    # without a word (the loop then fed the model host tensors, or the run was CPU-only unawares).
    loader = make()
    with tk.session(logdir=tmp_path, system_metrics=False):
        with pytest.raises(TypeError, match=r"a loader, not a batch.*tk\.to_device\(\(x, y\), device\)"):
            tk.to_device(loader, "meta")
        first = next(iter(loader))  # untouched: still yields its first batch, on the host
    first = first[0] if isinstance(first, (list, tuple)) else first
    assert first.device.type == "cpu"
    assert "trainkit/h2d_ms" not in scalars(tmp_path)
