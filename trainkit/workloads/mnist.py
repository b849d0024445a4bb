"""The built-in workload: the MNIST CNN of the seed article, on MNIST-shaped data made locally.

Nothing is downloaded: each class is a fixed random 28x28 "glyph" plus per-sample noise, so the CNN has something real to learn (accuracy climbs well above chance) while the
tensors have MNIST's shapes, dtype and normalisation. :func:`synthetic_mnist` makes all the images
at once (3,136 bytes each); :class:`SyntheticMNIST` makes the same kind of images a block at a time
as they are asked for, so a data set of any size takes a few MB.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Tuple

#: images per block of :class:`SyntheticMNIST`: made together, from one seed (3 MB).
BLOCK = 1024
#: the largest number of images :class:`SyntheticMNIST` numbers (int64 indices, with room).
MAX_IMAGES = 2 ** 62


def simple_cnn() -> Any:
    """Two conv blocks and two linear layers, 28x28x1 -> 10 classes (~420k parameters).

    Example::

        model = simple_cnn(); logits = model(torch.zeros(64, 1, 28, 28))
    """
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def _glyphs(g: Any, separation: float) -> Any:
    """The 10 class glyphs (10, 1, 28, 28), from the first draws of ``g``."""
    import torch

    # Smooth glyphs: a pattern shared by all classes plus a faint upsampled 7x7 pattern per class
    # (``separation``), so that the classes overlap under the noise like real digits do.
    patterns = torch.rand(11, 1, 7, 7, generator=g)
    return torch.nn.functional.interpolate(patterns[:1] + separation * patterns[1:], size=(28, 28),
                                           mode="bilinear", align_corners=False)


def _images(glyphs: Any, labels: Any, g: Any, noise: float) -> Any:
    """Images of ``labels``: their glyph plus uniform noise from ``g``, normalised like MNIST."""
    import torch

    # In place (one image-sized tensor at a time): the same numbers as the expression
    # ((glyph + noise * u) / max).clamp(0, 1) then (x - 0.5) / 0.5, in about half the time.
    images = torch.rand(len(labels), 1, 28, 28, generator=g).mul_(noise).add_(glyphs[labels])
    images.div_(images.amax(dim=(1, 2, 3), keepdim=True)).clamp_(0, 1)
    return images.sub_(0.5).div_(0.5)


def _check_n(n: Any, where: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{where}(n={n!r}): n must be a positive int, e.g. 12800")


def synthetic_mnist(n: int, *, seed: int = 0, noise: float = 1.0,
                    separation: float = 0.15) -> Tuple[Any, Any]:
    """``(images, labels)``: ``n`` images of shape (1, 28, 28), normalised like MNIST to [-1, 1].

    All of them at once: 3,136 bytes an image (and a few times that while they are made); for
    more than fit in memory, :class:`SyntheticMNIST`.

    Example::

        x, y = synthetic_mnist(1024); x.shape == (1024, 1, 28, 28)
    """
    import torch

    _check_n(n, "synthetic_mnist")
    g = torch.Generator().manual_seed(seed)
    glyphs = _glyphs(g, separation)
    labels = torch.randint(0, 10, (n,), generator=g)
    return _images(glyphs, labels, g, noise), labels


def _mix(*values: int) -> int:
    """A 64-bit seed from ints (splitmix64 steps): neighbouring blocks get unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


class SyntheticMNIST:
    """``n`` images like :func:`synthetic_mnist`'s (the same glyphs, labels and noise
    distribution), each made when it is asked for: images ``BLOCK * k`` to ``BLOCK * (k+1) - 1``
    come from one seed (``seed`` and ``k``), so an image is the same whenever it is made, and
    memory is a few blocks (3 MB each) whatever ``n``. Not the same numbers as
    ``synthetic_mnist(n, seed=seed)``, which draws all the labels first.

    ``ds[indices]`` (a sequence or 1-D tensor of ints) is ``(images, labels)``, the batch in that
    order: a map-style data set for ``DataLoader(ds, batch_size=None, sampler=BlockShuffle(...))``.

    Example::

        ds = SyntheticMNIST(10_000_000); x, y = ds[[0, 5, 9_999_999]]; x.shape == (3, 1, 28, 28)
    """

    def __init__(self, n: int, *, seed: int = 0, noise: float = 1.0, separation: float = 0.15,
                 cached_blocks: int = 2) -> None:
        import torch

        _check_n(n, "SyntheticMNIST")
        if n > MAX_IMAGES:
            raise ValueError(f"SyntheticMNIST(n={n!r}): at most 2**62 images (int64 indices)")
        self.n, self.seed, self.noise = n, seed, noise
        self.glyphs = _glyphs(torch.Generator().manual_seed(seed), separation)
        self._cache: "dict[int, Tuple[Any, Any]]" = {}
        self._cached_blocks = cached_blocks

    def __len__(self) -> int:
        return self.n

    def block(self, k: int) -> Tuple[Any, Any]:
        """``(images, labels)`` of block ``k`` (the last block may be short)."""
        import torch

        got = self._cache.pop(k, None)
        if got is None:
            size = min(BLOCK, self.n - k * BLOCK)
            if not 0 <= k or size < 1:
                raise IndexError(f"SyntheticMNIST: block {k} is out of range for n={self.n}")
            g = torch.Generator().manual_seed(_mix(self.seed, k))
            labels = torch.randint(0, 10, (size,), generator=g)
            got = (_images(self.glyphs, labels, g, self.noise), labels)
        self._cache[k] = got  # most recent last
        while len(self._cache) > self._cached_blocks:
            del self._cache[next(iter(self._cache))]
        return got

    def __getitem__(self, indices: Any) -> Tuple[Any, Any]:
        import torch

        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            raise IndexError(f"SyntheticMNIST: indices must be in [0, {self.n})")
        blocks = idx // BLOCK
        if len(idx) and int(blocks[0]) == int(blocks[-1]) and bool((blocks == blocks[0]).all()):
            x, y = self.block(int(blocks[0]))  # a batch of one block: most of them
            at = idx - int(blocks[0]) * BLOCK
            return x[at], y[at]
        images = torch.empty(len(idx), 1, 28, 28)
        labels = torch.empty(len(idx), dtype=torch.int64)
        for k in torch.unique(blocks).tolist():
            where = (blocks == k).nonzero().squeeze(1)
            x, y = self.block(k)
            at = idx[where] - k * BLOCK
            images[where] = x[at]
            labels[where] = y[at]
        return images, labels

    def __getstate__(self) -> dict:  # DataLoader workers get no cache
        return {**self.__dict__, "_cache": {}}


class BlockShuffle:
    """The batches (1-D int64 tensors of indices) of one pass over ``range(n)``, in a new order
    each epoch (:meth:`set_epoch`), for data made a block at a time (:class:`SyntheticMNIST`):
    the blocks in a shuffled order (an affine permutation, no list of them), the images of a
    block shuffled together, so a pass makes each block once and memory stays O(``BLOCK``).

    Like ``DistributedSampler``, ``rank`` of ``world`` takes its own ``ceil(n / world)``
    positions of the pass, the last one's padded from the start. Example::

        loader = DataLoader(SyntheticMNIST(n), batch_size=None, sampler=BlockShuffle(n, 64))
    """

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world: int = 1) -> None:
        _check_n(n, "BlockShuffle")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world = rank, world
        self.per_rank = -(-n // world)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        import torch

        full = self.n // BLOCK  # the short last block, if any, stays last
        h = _mix(self.seed, self.epoch, 1)
        a, b = 1, 0  # slot -> block (a * slot + b) % full: a permutation when gcd(a, full) = 1
        if full > 1:
            a, b = h % full, (h >> 32) % full
            while math.gcd(a, full) != 1:
                a = (a + 1) % full
        perms: "dict[int, Any]" = {}

        def index(positions: Any) -> Any:
            slots = positions // BLOCK
            out = torch.empty_like(positions)
            for slot in torch.unique(slots).tolist():
                block = (a * slot + b) % full if slot < full else slot
                perm = perms.get(block)
                if perm is None:
                    perms.clear()
                    size = min(BLOCK, self.n - block * BLOCK)
                    g = torch.Generator().manual_seed(_mix(self.seed, self.epoch, 2, block))
                    perm = perms[block] = torch.randperm(size, generator=g) + block * BLOCK
                where = slots == slot
                out[where] = perm[positions[where] - slot * BLOCK]
            return out

        start = self.rank * self.per_rank
        for lo in range(start, start + self.per_rank, self.batch_size):
            hi = min(lo + self.batch_size, start + self.per_rank)
            yield index(torch.arange(lo, hi, dtype=torch.int64) % self.n)
