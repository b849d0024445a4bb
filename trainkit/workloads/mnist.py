"""The built-in workload: the MNIST CNN of the seed article, on MNIST-shaped data made locally.

Nothing is downloaded: each class is a fixed random 28x28 "glyph" plus per-sample noise, so the CNN has something real to learn (accuracy climbs well above chance) while the
tensors have MNIST's shapes, dtype and normalisation.
"""
from __future__ import annotations

from typing import Any, Tuple


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


def synthetic_mnist(n: int, *, seed: int = 0, noise: float = 1.0,
                    separation: float = 0.15) -> Tuple[Any, Any]:
    """``(images, labels)``: ``n`` images of shape (1, 28, 28), normalised like MNIST to [-1, 1].

    Example::

        x, y = synthetic_mnist(1024); x.shape == (1024, 1, 28, 28)
    """
    import torch

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"synthetic_mnist(n={n!r}): n must be a positive int, e.g. 12800")
    g = torch.Generator().manual_seed(seed)
    # Smooth glyphs: a pattern shared by all classes plus a faint upsampled 7x7 pattern per class
    # (``separation``), so that the classes overlap under the noise like real digits do.
    patterns = torch.rand(11, 1, 7, 7, generator=g)
    glyphs = torch.nn.functional.interpolate(patterns[:1] + separation * patterns[1:], size=(28, 28),
                                             mode="bilinear", align_corners=False)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = glyphs[labels] + noise * torch.rand(n, 1, 28, 28, generator=g)
    images = (images / images.amax(dim=(1, 2, 3), keepdim=True)).clamp(0, 1)
    return (images - 0.5) / 0.5, labels
