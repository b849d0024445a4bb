"""The demo's data: the numbers of synthetic_mnist as they were, and the block-at-a-time data set
of any size (same distribution, each image the same whenever made, every image once a pass)."""
from __future__ import annotations

import pytest
import torch

from trainkit.workloads.mnist import BLOCK, BlockShuffle, SyntheticMNIST, synthetic_mnist


def _as_before(n, seed=0, noise=1.0, separation=0.15):
    """synthetic_mnist as first written (the demo's default numbers come from it)."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.rand(11, 1, 7, 7, generator=g)
    glyphs = torch.nn.functional.interpolate(patterns[:1] + separation * patterns[1:], size=(28, 28),
                                             mode="bilinear", align_corners=False)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = glyphs[labels] + noise * torch.rand(n, 1, 28, 28, generator=g)
    images = (images / images.amax(dim=(1, 2, 3), keepdim=True)).clamp(0, 1)
    return (images - 0.5) / 0.5, labels


@pytest.mark.parametrize("n,seed,noise", [(8448, 0, 1.0), (300, 7, 0.3)])
def test_synthetic_mnist_gives_the_same_numbers_as_before(n, seed, noise):
    x, y = synthetic_mnist(n, seed=seed, noise=noise)
    old_x, old_y = _as_before(n, seed, noise)
    assert torch.equal(x, old_x) and torch.equal(y, old_y)


def test_block_data_is_the_same_kind_and_the_same_whenever_made():
    n = 10_000_000
    ds = SyntheticMNIST(n, seed=3)
    x, y = ds[[n - 1, 5, 2 * BLOCK + 1, 5]]
    assert x.shape == (4, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x[1], x[3])
    again = SyntheticMNIST(n, seed=3)
    for i, k in enumerate((n - 1, 5, 2 * BLOCK + 1)):
        one_x, one_y = again[[k]]
        assert torch.equal(one_x[0], x[i]) and one_y[0] == y[i]
    # The glyphs of synthetic_mnist, its noise and normalisation: the same class means.
    a, la = synthetic_mnist(8192, seed=3)
    b, lb = SyntheticMNIST(8192, seed=3)[torch.arange(8192)]
    assert torch.equal(ds.glyphs, SyntheticMNIST(10, seed=3).glyphs)
    assert b.min() >= -1 and b.max() <= 1 and b.amax(dim=(1, 2, 3)).eq(1).all()
    for c in range(10):
        assert abs(a[la == c].mean() - b[lb == c].mean()) < 0.01, c
    assert abs(lb.float().mean() - 4.5) < 0.15


@pytest.mark.parametrize("n", [1, 700, BLOCK, 3 * BLOCK + 5, 9 * BLOCK])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_block_shuffle_is_one_pass_a_new_order_each_epoch(n, world):
    passes = []
    for epoch in (0, 1):
        seen = []
        for rank in range(world):
            s = BlockShuffle(n, 100, seed=1, rank=rank, world=world)
            s.set_epoch(epoch)
            batches = list(s)
            assert len(batches) == len(s) and all(0 < len(b) <= 100 for b in batches)
            seen += torch.cat(batches).tolist()
        assert len(seen) == world * -(-n // world)  # padded like DistributedSampler
        assert set(seen) == set(range(n))
        passes.append(seen)
    if n > 1:
        assert passes[0] != passes[1]


def test_a_loader_over_block_data_batches_it():
    from torch.utils.data import DataLoader

    ds = SyntheticMNIST(5000, seed=2)
    loader = DataLoader(ds, batch_size=None, sampler=BlockShuffle(5000, 64, seed=2))
    xb, yb = next(iter(loader))
    assert xb.shape == (64, 1, 28, 28) and yb.shape == (64,) and len(loader) == 79
