"""The data of ``trainkit demo``: its training set, how a loader batches it, its validation batches.

Small sizes are made up front (:func:`~trainkit.workloads.mnist.synthetic_mnist`: the numbers the
demo has always given); beyond :data:`EAGER_IMAGES` the images are made a block at a time as they
are asked for (:class:`~trainkit.workloads.mnist.SyntheticMNIST`), training and validation ones
alike, so memory stays a few MB whatever ``train_size`` and ``val_size``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterator, Optional

#: Up to this many images (training and validation together, 200 MB) are made up front.
EAGER_IMAGES = 65536


@dataclasses.dataclass(frozen=True)
class DemoData:
    """What the demo trains and validates on. Example::

        data = demo_data(6400, 2048, 64)
        loader = DataLoader(data.train, **data.batching)
        for x, y in data.val_batches(): ...
    """

    train: Any
    #: the loader's sampler, to be told each epoch (``set_epoch``), or None (a shuffling loader)
    sampler: Optional[Any]
    #: the DataLoader's batching arguments (``batch_size``, ``shuffle``, ``sampler``)
    batching: Dict[str, Any]
    #: a new pass over the validation images, in batches of the training batch size
    val_batches: Callable[[], Iterator[Any]]


def demo_data(train_size: int, val_size: int, batch_size: int, *, seed: int = 0,
              rank: int = 0, world: int = 1, distributed: bool = False) -> DemoData:
    """The demo's data; ``distributed``: ``rank`` of ``world`` trains on its share of it.

    Example::

        data = demo_data(10_000_000, 2048, 64)  # made as it is used: a few MB
    """
    import torch
    from torch.utils.data import TensorDataset

    from .mnist import BlockShuffle, SyntheticMNIST, synthetic_mnist

    n = train_size + val_size
    if n <= EAGER_IMAGES:  # made up front, the numbers of the demo's first versions
        x, y = synthetic_mnist(n, seed=seed)
        train: Any = TensorDataset(x[:train_size], y[:train_size])
        val_x, val_y = x[train_size:], y[train_size:]

        def val_batches() -> Iterator[Any]:
            for i in range(0, val_size, batch_size):
                yield val_x[i:i + batch_size], val_y[i:i + batch_size]

        sampler: Any = None
        if distributed:
            from torch.utils.data.distributed import DistributedSampler

            sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=seed)
        return DemoData(train, sampler, dict(batch_size=batch_size, shuffle=sampler is None,
                                             sampler=sampler), val_batches)
    # made a block at a time as the loader asks: memory stays a few MB
    data = SyntheticMNIST(n, seed=seed)
    sampler = BlockShuffle(train_size, batch_size, seed=seed, rank=rank, world=world)

    def lazy_val_batches() -> Iterator[Any]:
        for i in range(train_size, n, batch_size):
            yield data[torch.arange(i, min(i + batch_size, n))]

    return DemoData(data, sampler, dict(batch_size=None, sampler=sampler), lazy_val_batches)
