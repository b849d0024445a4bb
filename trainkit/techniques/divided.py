"""A loss divided by ``n`` inside ``tk.accumulate(n, ...)``, which divides the gradients itself.

Such a loss cannot be told from the gradients (a gradient scaled by ``1/n`` looks like a smaller
one). It can be seen where the loss passes through trainkit: ``amp.backward(loss)`` looks at the
loss's last autograd node, and a literal ``loss / n`` (or ``loss * (1 / n)``) with the open
window's ``n`` gets one warning per block. It is said at the micro-batch's ``step()``, and only
when every ``amp.backward`` of that micro-batch was so divided: in a loop with several losses
(``amp.backward(ce); amp.backward(0.5 * aux)`` under ``accumulate(2, ...)``) a factor of 1/n on
one of them is its weight. A sum divided by ``n`` (``loss_sum / len(x)`` on micro-batches of
``n`` items) is a mean over the micro-batch, and no warning. A plain ``loss.backward()`` is left
to ``trainkit lint`` (TK104), which finds the division in the source.
"""
from __future__ import annotations

from typing import Any

from ._accumulate_args import warn_once
from .accumulate import _open

_SAID = "divided"  # warned once a block (Accumulator._said)


def warn_if_divided(loss: Any) -> None:
    """Note whether ``loss`` is literally ``x / n`` or ``x * (1 / n)`` for this ``n``: the
    micro-batch's ``step()`` warns (:func:`check_micro_batch`), once per block, when every
    backward of the micro-batch was.

    Reads only the loss's last autograd node and its saved CPU scalar (no device sync).
    """
    if not _open:
        return
    acc = _open[-1]
    if acc.normalize != "mean" or acc.n == 1 or _SAID in acc._said:
        return
    acc._backwards += 1
    if _divided_by(loss, acc.n):
        acc._divided_backwards += 1


def _divided_by(loss: Any, n: int) -> bool:
    fn = getattr(loss, "grad_fn", None)
    if fn is None:
        return False
    name = fn.name()
    if not (name.startswith("DivBackward") or name.startswith("MulBackward")):
        return False
    try:
        other = fn._saved_other
    except (AttributeError, RuntimeError):  # not saved, or already freed
        return False
    import torch

    if not isinstance(other, torch.Tensor) or other.numel() != 1 or other.device.type != "cpu":
        return False
    value = float(other)
    if not (value == n if name.startswith("Div") else abs(value * n - 1.0) < 1e-9):
        return False
    return not _a_sum(fn)


def _a_sum(fn: Any) -> bool:
    """Whether the divided value is a sum (``.sum()``, a loss with ``reduction="sum"``): then the
    division is a mean over a micro-batch of ``n`` items (``loss_sum / len(x)``), which is right,
    not the accumulation's ``loss / n`` (a mean loss divided again)."""
    try:
        node = fn.next_functions[0][0]
    except (AttributeError, IndexError, RuntimeError):
        return False
    if node is None:
        return False
    if node.name().startswith("SumBackward"):
        return True
    try:
        return int(node._saved_reduction) == 2  # torch's Reduction::Sum
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return False


def check_micro_batch(acc: Any) -> None:
    """At a micro-batch's ``step()``: warn when each of its ``amp.backward`` losses was divided
    by ``n`` (one of several, a loss's weight, is not), and count the next micro-batch's."""
    backwards, divided = acc._backwards, acc._divided_backwards
    acc._backwards = acc._divided_backwards = 0
    if divided and divided == backwards:
        warn_once(acc, _SAID,
            f"the loss is divided by {acc.n} inside tk.accumulate({acc.n}, ...), which already "
            f"divides the gradients by the micro-batches in each window: the update is {acc.n}x "
            f"too small. Drop the division (pass the plain per-micro-batch mean loss)",
            UserWarning)
