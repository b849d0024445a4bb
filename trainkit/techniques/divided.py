"""A loss divided by ``n`` inside ``tk.accumulate(n, ...)``, which divides the gradients itself.

Such a loss cannot be told from the gradients (a gradient scaled by ``1/n`` looks like a smaller
one). It can be seen where the loss passes through trainkit: ``amp.backward(loss)`` looks at the
loss's last autograd node, and a literal ``loss / n`` (or ``loss * (1 / n)``) with the open
window's ``n`` gets one warning per block. A plain ``loss.backward()`` is left to
``trainkit lint`` (TK104), which finds the division in the source.
"""
from __future__ import annotations

import warnings
from typing import Any

from .accumulate import _open


def warn_if_divided(loss: Any) -> None:
    """Warn once per block when ``loss`` is literally ``x / n`` or ``x * (1 / n)`` for this ``n``.

    Reads only the loss's last autograd node and its saved CPU scalar (no device sync).
    """
    if not _open:
        return
    acc = _open[-1]
    if acc.normalize != "mean" or acc.n == 1 or acc._warned_divided:
        return
    fn = getattr(loss, "grad_fn", None)
    if fn is None:
        return
    name = fn.name()
    if not (name.startswith("DivBackward") or name.startswith("MulBackward")):
        return
    try:
        other = fn._saved_other
    except (AttributeError, RuntimeError):  # not saved, or already freed
        return
    import torch

    if not isinstance(other, torch.Tensor) or other.numel() != 1 or other.device.type != "cpu":
        return
    value = float(other)
    divided = value == acc.n if name.startswith("Div") else abs(value * acc.n - 1.0) < 1e-9
    if divided:
        acc._warned_divided = True
        warnings.warn(
            f"the loss is divided by {acc.n} inside tk.accumulate({acc.n}, ...), which already "
            f"divides the gradients by the micro-batches in each window: the update is {acc.n}x "
            f"too small. Drop the division (pass the plain per-micro-batch mean loss)",
            UserWarning, stacklevel=3)
