"""What the compiled-step tests share: a fresh dynamo around each test, and the skip for moving
Adam betas on a CPU torch too old for them."""
from __future__ import annotations

import pytest
import torch

from trainkit.techniques import _hyper

#: OneCycleLR moves Adam's betas, which a compiled step holds as tensors: CPU needs torch >= 2.5.
moving_betas = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split(".")[:2]) < _hyper.TENSOR_BETAS_ON_CPU,
    reason="a compiled CPU Adam step with moving betas needs torch >= 2.5 (refused below)")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Autouse in a test module that imports it: each test compiles from scratch."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
