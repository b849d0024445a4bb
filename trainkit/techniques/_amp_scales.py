"""One GradScaler shared by accumulate blocks whose windows do not step together.

A GAN's loop with ``tk.accumulate`` around both optimizers and one GradScaler: at each
micro-batch the discriminator's backward and ``amp.step``, then the generator's. The
discriminator's last micro-batch steps its window and updates the scale, while the generator's
window is open: its earlier micro-batches were scaled by the old scale, its later ones by the
new one, and one scale unscaled them all (the earlier ones weighed 2x after a growth, 1/2x after
a backoff, which comes at every inf early in fp16 training).

So the gradients of an open window are kept at the scale in force: an accumulate block notes,
at its window's first ``amp.step``, which scaler's update its gradients are scaled at
(``gate._grads_at``), and an update of that scaler made by another block's ``amp.step``
multiplies them by the new scale over the old one (a power of two: exact, no sync). The scales
of the last few updates are kept (copies of the scale tensor ``amp.step`` makes anyway) for a
micro-batch whose backward ran before an update its block had not noted yet (its first).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List

from ._accumulate_args import grad_marks, warn_once
from .accumulate import _grads

#: GradScaler -> {update count: a copy of its scale at that count}, the last few
_scales: "weakref.WeakKeyDictionary[Any, Dict[int, Any]]" = weakref.WeakKeyDictionary()
_KEPT = 4


def updated(scaler: Any, count: int, before: Any, blocks: List[Any], stepping: Any) -> None:
    """``scaler`` was updated from count ``count`` (its scale then: ``before``) to ``count + 1``
    by ``stepping``'s ``amp.step``: the other open blocks' windows it scaled follow its scale."""
    kept = _scales.setdefault(scaler, {})
    kept[count] = before
    for old in [c for c in kept if c <= count - _KEPT]:
        del kept[old]
    for block in blocks:
        at = getattr(block, "_grads_at", None)
        if block is not stepping and at is not None and at[0] is scaler:
            _rescale(block, scaler, at[1], count + 1)


def align(block: Any, scaler: Any, backward_at: int, now: int, optimizer: Any) -> bool:
    """At ``amp.step``: ``block``'s window gradients at ``scaler``'s scale in force (update count
    ``now``); this micro-batch's backward ran at ``backward_at``. False (and a warning) where
    they cannot be: the scale they were scaled by is no longer known, or another scaler's."""
    at = block._grads_at
    if at is None:  # the window's first amp.step: its gradients are this backward's
        block._grads_at = (scaler, backward_at)
        at = block._grads_at
    if at[0] is not scaler:
        return _mixed(block, optimizer)
    return _rescale(block, scaler, at[1], now) or _mixed(block, optimizer)


def _rescale(block: Any, scaler: Any, at: int, now: int) -> bool:
    """Multiply ``block``'s gradients from the scale at count ``at`` to that at ``now``."""
    if at == now:
        return True
    old = _scales.get(scaler, {}).get(at)
    if old is None:
        return False
    import torch

    ratio = scaler._scale / old  # on the scale's device: no sync
    by_device: Dict[Any, List[Any]] = {}
    for g in _grads(block.optimizer):
        by_device.setdefault(g.device, []).append(g)
    for device, same in by_device.items():
        torch._foreach_mul_(same, ratio.to(device))
    block._grads_at = (scaler, now)
    if block._marks:  # the window's sum, only rescaled: no gradients added (check_added_grads)
        block._marks = grad_marks(block.optimizer)
    return True


def _mixed(block: Any, optimizer: Any) -> bool:
    warn_once(block, "scales",
        f"tk.accumulate({block.n}, {type(optimizer).__name__}): the GradScaler's scale changed "
        f"inside this window (another optimizer's amp.step updated it) in a way trainkit could "
        f"not follow, so its micro-batches were scaled by different scales and are unscaled by "
        f"one: the earlier ones weigh 2x or 1/2x. Give each accumulated optimizer its own "
        f"GradScaler (e.g. autocast_scaled(scaler_d) for the discriminator, "
        f"autocast_scaled(scaler_g) for the generator), or run all backwards of a micro-batch "
        f"before its amp.step calls")
    return False

