"""What ``s.log(name, value)`` accepts: the names it refuses, and values turned into scalars.

The session's fast path (a str name seen before, a CPU tensor) does not come here; the first use
of a name and every other kind of value do. A closed session's buffer refuses what is still logged.
"""
from __future__ import annotations

import decimal
import math
import numbers
from typing import Any

from . import timing
from ._text import brief
from .recorder import OWN_TAGS, PREFIX


def check_log_name(name: Any) -> None:
    """Refuse a name that is no str, is empty, is one of trainkit's own tags, or cannot be
    written as UTF-8 (an event file's tags are: the writer would fail on it, mid-run)."""
    if type(name) is not str or not name:  # a wrong type is a TypeError, an empty str a ValueError
        raise (ValueError if type(name) is str else TypeError)(
            f"log(name={name!r}): name must be a non-empty str, e.g. s.log('loss', loss)")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: os.fsdecode of a non-UTF-8 file name
        fixed = name.encode("utf-8", "replace").decode("utf-8")
        raise ValueError(f"log(name={name!r}): {name[exc.start:exc.end]!r} at {exc.start} cannot be "
                         f"written as UTF-8, which TensorBoard's tags are (a lone surrogate, as "
                         f"os.fsdecode makes of a file name's undecodable bytes); log under a name "
                         f"without it, e.g. s.log({fixed!r}, value)") from None
    if name.startswith(OWN_TAGS):
        other = "my/" + name[len(PREFIX):] if name.startswith(PREFIX) else name.lstrip("\0")
        raise ValueError(f"log(name={name!r}): names under {PREFIX!r} (and names starting with a "
                         f"NUL) are trainkit's own tags, which a value logged under them would "
                         f"corrupt; log yours under another name, e.g. s.log({other or 'x'!r}, value)")


def to_scalar(name: str, value: Any) -> Any:
    """``value`` as what the writer takes: a float, or a pending CUDA value resolved later."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"log({name!r}, tensor of shape {tuple(value.shape)}): only scalars can "
                             f"be logged; reduce it first, e.g. s.log({name!r}, t.mean())")
        if value.is_complex():
            raise TypeError(f"log({name!r}, {value!r}): a complex tensor is no scalar TensorBoard "
                            f"can draw; log its real part or magnitude, e.g. s.log({name!r}, t.abs())")
        if value.is_cuda:
            return timing.pending_copy(value)  # no sync here, nor in the writer
        if value.is_meta:  # item() raised torch's "cannot be called on meta tensors"
            raise ValueError(f"log({name!r}, {brief(value)}): a meta tensor holds no value, "
                             f"only a shape and dtype (a model made on the 'meta' device "
                             f"computes none); log a value computed on a real device, e.g. "
                             f"after model.to_empty(device='cpu') and loading its weights")
        # On the CPU this is a read, not a device sync; reading now (rather than keeping the
        # tensor) also frees the autograd graph the loss still holds.
        return value.item()
    if isinstance(value, numbers.Real):
        return _real(name, value)
    if isinstance(value, decimal.Decimal):  # a numbers.Number, yet no numbers.Real
        # float() reads NaN and +-inf as float's own, and past float's range gives +-inf as
        # _real does; a signaling NaN, which float() refuses, is a NaN all the same.
        return math.nan if value.is_snan() else float(value)
    size = getattr(value, "size", None)  # a numpy scalar (np.bool_ too) or array, and the like
    if isinstance(size, int) and callable(getattr(value, "item", None)):
        if size != 1:
            raise ValueError(f"log({name!r}, array of shape {getattr(value, 'shape', '?')}): only "
                             f"scalars can be logged; reduce it first, e.g. s.log({name!r}, a.mean())")
        item = value.item()
        if isinstance(item, numbers.Real):
            return _real(name, item)
    raise _not_a_scalar(name, value)


def _real(name: str, value: Any) -> float:
    """A real number as the float written: past float's range it is +-inf, as past float32's."""
    try:
        return float(value)
    except OverflowError:  # an int such as 10**400
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):  # a "real" that is no number to draw (np.timedelta64)
        raise _not_a_scalar(name, value) from None


def _not_a_scalar(name: str, value: Any) -> TypeError:
    return TypeError(f"log({name!r}, {brief(value)}): value must be a real number or a "
                     f"one-element tensor or array, e.g. s.log({name!r}, loss)")


class ClosedBuffer:
    """A closed session's buffer: what is still logged into it is refused, not dropped unsaid."""

    def __init__(self, session_repr: str) -> None:
        self._repr = session_repr

    def append(self, record: Any) -> None:
        tag = record[0]
        if tag.__class__ is str and tag.startswith(OWN_TAGS):
            # A technique's record of a call under way when another thread (or a signal
            # handler) closed the session: no session's any more. Raised, it failed the user's
            # optimizer.step() after the step was taken, blaming a log('\x00step', ...).
            return
        raise RuntimeError(f"log({record[0]!r}, ...) after the session was closed ({self._repr}): "
                           f"it would not be written; log inside the `with tk.session(...)` block, "
                           f"or start a new session")
