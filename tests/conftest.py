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


@pytest.fixture(autouse=True)
def _no_session_leak():
    yield
    from trainkit.patch import _patched, unpatch

    for opt in list(_patched):  # a patched optimizer changes how loaders count steps
        unpatch(opt)
    s = _active_session()
    if s is not None:
        s.close()
        pytest.fail(f"a test left a session open: {s!r}")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
