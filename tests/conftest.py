"""Shared fixtures: reading TensorBoard event files back, and no session leaking between tests."""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

import pytest

from trainkit.session import active as _active_session

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scalars(logdir: str) -> Dict[str, List[Tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` as TensorBoard reads the event files in ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


@pytest.fixture(autouse=True, scope="session")
def _no_runs_in_the_checkout():
    """A session without a logdir writes runs/<time>_<host> in the working folder: a test that
    forgets its logdir leaves a run in the checkout (or wherever pytest was started)."""
    def runs() -> set:
        path = os.path.join(os.getcwd(), "runs")
        return set(os.listdir(path)) if os.path.isdir(path) else set()

    before = runs()
    yield
    new = sorted(runs() - before)
    assert not new, f"tests wrote runs into {os.path.join(os.getcwd(), 'runs')}: {new}; give " \
                    f"each session a logdir under tmp_path"


@pytest.fixture(autouse=True)
def _no_session_leak():
    yield
    from trainkit.patch import _patched, optimizer_patch, unpatch

    for opt in list(_patched):  # a patched optimizer changes how loaders count steps
        p = optimizer_patch(opt)
        if p is not None:  # a gate a test set by hand, or left by a block it broke off
            p.gate = None
        unpatch(opt)
    s = _active_session()
    if s is not None:
        s.close()
        pytest.fail(f"a test left a session open: {s!r}")


@pytest.fixture(autouse=True)
def _cuda_as_never_initialised(request, monkeypatch):
    """Tests not marked ``cuda`` run as on a machine where CUDA was never initialised.

    trainkit takes CUDA events, CUDA's memory peak and autocast's device from whether CUDA is
    initialised in the process (``torch.cuda._initialized``, see ``trainkit.timing.cuda_in_use``);
    on a GPU machine the ``cuda`` tests that ran earlier in the same process initialise it, and
    the CPU tests after them would then see the GPU paths (PendingIntervals in the buffer, CUDA's
    peak for ``peak_MB``) instead of the host's that they check.
    """
    import torch

    if "cuda" not in request.keywords and torch.cuda.__dict__.get("_initialized") is True:
        monkeypatch.setattr(torch.cuda, "_initialized", False)
    yield


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def cpu_fused_or_skip() -> None:
    """Skip the test where this torch has no fused optimizer kernels for the CPU (torch 2.3)."""
    from trainkit.techniques import fused

    if "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")


@pytest.fixture
def adagrad_refuses_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This torch's Adagrad refusing fused on the CPU as torch 2.11's refuses it on CUDA: 2.11's
    ``_init_group`` calls ``_device_dtype_check_for_fused(p, cuda_unsupported=True)``, which
    raises this error for a device the list of fused devices names. The list trainkit reads
    (torch.utils._foreach_utils) still names the CPU."""
    import importlib

    import torch

    from trainkit.techniques import fused

    cpu_fused_or_skip()  # torch 2.3: no fused CPU kernels, and no such check to stand in
    adagrad = importlib.import_module("torch.optim.adagrad")
    real = adagrad._device_dtype_check_for_fused

    def check(p: torch.Tensor, cuda_unsupported: bool = False) -> None:
        if p.device.type == "cpu":
            raise RuntimeError("`fused=True` requires all the params to be floating point "
                               f"Tensors of supported devices: ['cuda'] but {p.dtype} and cpu")
        real(p, cuda_unsupported)

    monkeypatch.setattr(adagrad, "_device_dtype_check_for_fused", check)
    assert "cpu" in fused._supported_devices()
