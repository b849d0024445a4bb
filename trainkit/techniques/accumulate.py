"""``tk.accumulate``: gradient accumulation that equals the big batch, the last window included.

The user's loop stays as it is (``loss.backward(); optimizer.step(); optimizer.zero_grad()``).
The accumulator is the *gate* of the patched optimizer (see :mod:`trainkit.patch`): every
``optimizer.step()`` call is one micro-batch; the n-th call of a window really steps, after the
summed gradients were divided by the number of micro-batches in the window (or by the items
counted with ``acc.add_items``), so the loss is the plain per-micro-batch mean and needs no
``/ n``. ``zero_grad()`` is a no-op while a window is open.

A loss that the user ALSO divides by ``n`` is looked for where it passes through trainkit
(:mod:`trainkit.techniques.divided`).

With ``model=`` (DDP, FSDP2), gradient sync runs only at a window's last micro-batch; how,
and how a partial last window is synced on exit, is :mod:`trainkit.techniques.data_parallel`.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .._wrapped import inner_optimizer
from ..patch import optimizer_patch, patch as _patch_opt, wrap_zero_grad
from . import _accumulate_model, data_parallel as dp
from ._accumulate_args import Normalize, check_added_grads, check_args, check_item_calls, \
    grad_marks, items_value, refuse_user_scaler_step, warn_scaled_step

#: The accumulate blocks open right now, innermost last: the state of the ``with`` blocks, as
#: autocast keeps its own; amp.backward reads it to spot a loss divided by n a second time.
_open: List["Accumulator"] = []


def _is_user_scaler_step() -> bool:
    """True when an enabled GradScaler's ``step`` is what called ``optimizer.step()``.

    Walks a few frames up (~1 us: done on non-boundary micro-batches, and once a real step).
    """
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return False
        if f.f_code.co_name == "_maybe_opt_step":
            scaler = f.f_locals.get("self")
            return bool(getattr(scaler, "is_enabled", lambda: False)())
        f = f.f_back
    return False


class Accumulator:
    """The state of one ``tk.accumulate`` block; the optimizer's gate while the block runs.

    Attributes:
        n: micro-batches per window.
        micro_batches: ``optimizer.step()`` calls so far in the current window.
        steps: real optimizer steps so far.
        items: items added with :meth:`add_items` in the current window.
        stepped: whether the last ``optimizer.step()`` (or ``amp.step``) call ended a window (it
            stepped, or GradScaler skipped the step for an inf/nan gradient): where a per-step
            LR scheduler steps, ``if acc.stepped: scheduler.step()``, not at every micro-batch.
            After the block, whether its exit stepped a short last window (False when the last
            window was full): ``if acc.stepped: scheduler.step()`` after it steps for that one.
    """

    def __init__(self, n: int, optimizer: Any, model: Any, normalize: Normalize,
                 clip_grad_norm: Optional[float] = None) -> None:
        self.n = n
        self.optimizer = optimizer
        self.model = model
        self.normalize: Normalize = normalize
        self.clip_grad_norm = clip_grad_norm  # checked by accumulate() (a float, or None)
        #: the total gradient norm of the last real step, before clipping (a tensor, not read:
        #: reading it on a GPU would wait for it); None without ``clip_grad_norm``.
        self.grad_norm: Any = None
        self.micro_batches = 0
        self.steps = 0
        self.items = 0.0
        self._adds = 0  # add_items calls in the current window
        self._scaled = False  # amp.backward scaled a loss in the current window
        #: (GradScaler, its update count) whose scale this window's gradients are at (_amp_scales)
        self._grads_at: Optional[Tuple[Any, int]] = None
        self._said: set = set()  # what this block warned of, once each (warn_once)
        self.stepped = False
        self._prepared = False  # the current window's gradients are synced and divided
        self._force = False  # the exit's step of a partial window
        self._unsynced = False  # the window's last backward ran with DDP/FSDP2 sync off
        self._sync = True  # what the forward pre-hook last set
        #: this micro-batch's amp.backward calls, and those whose loss was divided by n
        self._backwards = 0
        self._divided_backwards = 0
        #: set by ``amp.step``: performs the window's step through the GradScaler.
        self.amp_step: Optional[Callable[[], Any]] = None
        self._amp_stepping = False  # amp.step's own scaler.step is under way
        #: a zero_grad() was held after the window's last step() call: the exit's step of a
        #: partial window does it (else that window's gradients would start the next block)
        self._zero_held = False
        #: the window's gradients (tensor, version) at its last step() call: a held zero_grad()
        #: after more were added says so (check_added_grads)
        self._marks: List[Tuple[Any, int]] = []

    # -- public --------------------------------------------------------------------------------
    @property
    def boundary(self) -> bool:
        """True when the next ``optimizer.step()`` call really steps."""
        return self._force or self.micro_batches + 1 >= self.n

    def add_items(self, k: Any) -> None:
        """Count ``k`` items (tokens, samples) of this micro-batch, for ``normalize="items"``.

        Example::

            loss = F.cross_entropy(logits, y, reduction="sum"); acc.add_items(y.numel())
        """
        self.items += items_value(self, k)
        self._adds += 1

    # -- the gate protocol (trainkit.patch) ------------------------------------------------------
    def should_step(self) -> bool:
        if self._backwards:  # amp.backward saw this micro-batch's losses: one divided by n?
            from .divided import check_micro_batch

            check_micro_batch(self)
        if not self.boundary:
            if _is_user_scaler_step():
                refuse_user_scaler_step(self.n, boundary=False)
            self.micro_batches += 1
            self._marks = grad_marks(self.optimizer)
            self._unsynced = self._sync_off()
            self._zero_held = False
            self.stepped = False
            return False
        if not self._amp_stepping and (self.n > 1 or self._scaled):
            by_scaler = _is_user_scaler_step()  # once: a walk up the stack
            if by_scaler and self.n > 1:
                refuse_user_scaler_step(self.n, boundary=True)
            if self._scaled and not by_scaler:
                warn_scaled_step(self)  # a warning: that loss may have been another optimizer's
        self.prepare()
        if self.clip_grad_norm is not None:
            self.clip()
        self.end_window(stepped=True)
        return True

    def hold_zero_grad(self) -> bool:
        if self.micro_batches > 0:
            if self._marks:
                check_added_grads(self)
            self._zero_held = True
            return True
        return False

    # -- for amp.step and the exit ---------------------------------------------------------------
    def prepare(self) -> None:
        """Sync (partial last window under DDP) and divide the window's gradients, once."""
        if self._prepared:
            return
        grads = _grads(self.optimizer)
        if self.normalize == "items":
            check_item_calls(self, self.micro_batches + (0 if self._force else 1))
            # Every data-parallel rank takes part, one with no items too (its tokens all padding):
            # only a window with none on any rank is refused, on every rank alike, before
            # anything is synced or divided (one rank raising alone would leave the others
            # waiting in their all-reduce).
            total = dp.global_items(self.items, grads, self.model)
            if total <= 0:
                where = "" if dp.dp_world(self.model) == 1 else f" on any rank ({total!r} in all)"
                raise ValueError(f"accumulate(normalize='items'): no items were counted in this "
                                 f"window{where} (acc.items={self.items!r}); call "
                                 f"acc.add_items(k) once per micro-batch, e.g. "
                                 f"acc.add_items(y.numel())")
        self._prepared = True
        world = dp.manual_allreduce(self.model) if self._force and self._unsynced else None
        if world is not None:
            grads = _grads(self.optimizer)  # a parameter another rank used has one now too
        if self.normalize == "items":
            divisor = total
        else:
            # The boundary call itself is not counted yet (the exit's step is no micro-batch).
            divisor = float(self.micro_batches + (0 if self._force else 1))
        if world is None:
            world = dp.dp_world(self.model)
        # DDP averages over ranks; items normalisation wants the sum over ranks / total items.
        divisor = divisor / world if self.normalize == "items" else divisor
        if divisor != 1.0 and grads:
            import torch

            torch._foreach_div_(grads, divisor)

    def clip(self) -> None:
        """Clip the window's gradient (divided, synced, unscaled by now) to ``clip_grad_norm``."""
        self.grad_norm = dp.clip_grad_norm(self.optimizer, self.clip_grad_norm, self.model)

    def end_window(self, *, stepped: bool) -> None:
        """The window ends: its step ran (``stepped``), or GradScaler skipped it, or none is due."""
        self.stepped = True  # for a scheduler, a skipped step ends its window as a real one does
        self.micro_batches = 0
        self._zero_held = False
        self.items = 0.0
        self._adds = 0
        self._scaled = False
        self._grads_at = None
        self._prepared = False
        self._unsynced = False
        self._marks = []
        if stepped:
            self.steps += 1

    def _sync_off(self) -> bool:
        """Whether the backward just run was unsynced (set by the forward pre-hook)."""
        m = self.model
        if m is None:
            return False
        if dp.is_fsdp2(m):
            return not self._sync
        return not getattr(m, "require_backward_grad_sync", True)

    def forward_pre_hook(self, module: Any, args: Any) -> None:
        # Decided at the forward, before backward: only the window's last micro-batch syncs.
        self._sync = self.micro_batches + 1 >= self.n
        dp.set_sync(self.model, self._sync)  # the module torch.compile wrapped, if it is one

    def flush(self) -> None:
        """Step once for a partial last window (at least one micro-batch with gradients).

        After it ``stepped`` says whether this exit's step ended a window (True) or none was open
        (False), so that ``if acc.stepped: scheduler.step()`` after the block steps a per-step
        scheduler for the short last window, and only for it."""
        self.stepped = False
        if self.micro_batches == 0:
            return
        if self._unsynced and dp.is_fsdp2(self.model):
            dp.fsdp2_reduce_held_back(self.model)  # every rank gets here (a normal exit)
            self._unsynced = False
            if not _grads(self.optimizer):
                import torch

                raise RuntimeError(
                    f"accumulate({self.n}, ...): the last, partial window ({self.micro_batches} "
                    f"micro-batches) of this FSDP2 model was not reduce-scattered by FSDP's "
                    f"end-of-backward step on this torch ({torch.__version__}), so it was not "
                    f"stepped; make the micro-batches a multiple of {self.n}, or pass no model= "
                    f"(FSDP then syncs at every micro-batch)")
        if not _grads(self.optimizer):  # nothing to step on: close the empty window
            self.end_window(stepped=False)
            return
        zero = self._zero_held  # the loop's zero_grad() after the last micro-batch, held
        self._force = True
        try:
            if self.amp_step is not None:
                self.amp_step()
            else:
                self.optimizer.step()
        finally:
            self._force = False
        if self.micro_batches:  # a skipped AMP step does not reach the gate
            self.end_window(stepped=False)
        if zero:  # as after a full window: the next block starts from no gradients
            p = optimizer_patch(self.optimizer)
            args, kwargs = p.held_zero_grad
            p.orig_zero_grad(*args, **p.zero_grad_kwargs(args, kwargs))

    def discard(self) -> None:
        """Drop a partial window's gradients (the block left with an exception), also those of
        a first micro-batch whose backward ran before the exception came (no step() call yet)."""
        optimizer_patch(self.optimizer).orig_zero_grad(set_to_none=True)
        if (self._unsynced or not self._sync) and dp.is_fsdp2(self.model):
            dp.fsdp2_drop_held_back(self.model)
        self.end_window(stepped=False)
        self.stepped = False

    def __repr__(self) -> str:
        return (f"<trainkit.accumulate n={self.n} micro_batches={self.micro_batches} "
                f"steps={self.steps} normalize={self.normalize!r}>")


def _grads(optimizer: Any) -> List[Any]:
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


class _Block(contextlib._GeneratorContextManager):
    """``tk.accumulate(...)``: a ``with`` block around the loop, and no decorator. As one (which
    ``contextlib.contextmanager`` allows), each call of the step function was a block of its own:
    a window of one micro-batch that stepped at once, so nothing accumulated, and nothing said."""

    def __call__(self, fn: Any) -> Any:
        n = self.args[0] if self.args else self.kwds.get("n", "n")
        raise TypeError(f"tk.accumulate({n!r}, optimizer) goes around the loop, not on a "
                        f"function: each call would be a block of its own, a window of one "
                        f"micro-batch stepped at once (nothing accumulated); e.g. with "
                        f"tk.accumulate({n!r}, optimizer): for batch in loader: train_step(batch)")


def _block(func: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    """``contextlib.contextmanager``, whose managers refuse to decorate (:class:`_Block`)."""

    @functools.wraps(func)
    def helper(*args: Any, **kwargs: Any) -> _Block:
        return _Block(func, args, kwargs)

    return helper


@_block
def accumulate(n: int, optimizer: Any, *, model: Any = None, normalize: Normalize = "mean",
               clip_grad_norm: Optional[float] = None) -> Iterator[Accumulator]:
    """Accumulate gradients over ``n`` micro-batches per optimizer step, around the whole loop.

    Inside the block ``optimizer.step()`` really steps on every n-th call, after dividing the
    gradients by the micro-batches actually in that window (``normalize="mean"``: the loss is the
    usual per-micro-batch mean; do NOT divide it by ``n`` yourself: ``amp.backward`` warns once
    when it sees ``loss / n``, and ``trainkit lint`` finds it in the source) or by the items counted with
    ``acc.add_items`` (``normalize="items"``; losses use ``reduction="sum"``). ``zero_grad()``
    is a no-op inside a window. On a normal exit a partial last window steps once more (and the
    ``zero_grad()`` the loop called after its last micro-batch is done then, so the next block
    starts clean); when the block exits with an exception that partial window is discarded (its
    gradients are set to None) and the exception propagates. ``optimizer.step(closure)`` works
    too: each call is a micro-batch, its closure run at once and its loss returned (LBFGS, which
    re-evaluates its closure within a step, is refused). With ``model=`` (DDP, FSDP2) gradient
    sync runs only on a window's last micro-batch (FSDP1 is left to sync at every one). Use ``amp.step`` (not
    ``scaler.step``) for AMP inside the block. Clip with ``clip_grad_norm=``, not by hand: a
    ``clip_grad_norm_`` before ``optimizer.step()`` would clip each micro-batch's running,
    undivided sum (``trainkit lint`` reports it, TK105).

    Args:
        n: micro-batches per optimizer step (a positive int).
        optimizer: the optimizer; patched with :func:`trainkit.patch` if it is not already.
            accelerate's prepared one too (its inner optimizer is gated), with
            ``gradient_accumulation_steps=1`` and no GradScaler (fp16): double accumulation, or
            a scaler unscaling every micro-batch, is refused.
        model: the model (the DDP-wrapped one, or the FSDP2 root given to ``fully_shard``; or
            ``torch.compile`` of either), to
            skip gradient sync on non-boundary micro-batches; its ``zero_grad()`` is held inside
            a window too. Without it, call ``optimizer.zero_grad()``, not ``model.zero_grad()``,
            which would wipe the window's running sum.
        normalize: ``"mean"`` (divide by micro-batches) or ``"items"`` (by ``acc.add_items``).
        clip_grad_norm: max norm of the window's gradient, clipped once per real step after it was
            divided (and synced, and unscaled under ``amp.step``), as ``clip_grad_norm_`` after a
            big batch's backward; the norm before clipping is kept as ``acc.grad_norm``.

    Example::

        with tk.accumulate(4, optimizer, model=model) as acc:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); optimizer.step(); optimizer.zero_grad()
                if acc.stepped:
                    scheduler.step()
    """
    n, max_norm = check_args(n, optimizer, model, normalize, clip_grad_norm)
    # accelerate's prepared optimizer: tk.patch patches the one inside, whose step() and
    # zero_grad() the wrapper's reach (every call: check_args refused one that accumulates itself)
    optimizer, wrapper = inner_optimizer(optimizer) or optimizer, optimizer
    gate = getattr(optimizer_patch(optimizer), "gate", None)
    if isinstance(gate, Accumulator):
        raise ValueError(f"accumulate({n}, optimizer): this optimizer is already inside "
                         f"accumulate({gate.n}, ...); nest nothing, use one accumulate block")
    _patch_opt(wrapper)  # the inner one, and a GradScaler's saved step repointed
    p = optimizer_patch(optimizer)
    # The data-parallel model itself; the hook and the held zero_grad stay on what the loop
    # calls (a torch.compile wrapper's hooks run outside its graph).
    acc = Accumulator(n, optimizer, dp.unwrap_compiled(model), normalize, max_norm)
    prev_gate = p.gate
    # model.zero_grad() would wipe the window's running sum as surely as the optimizer's.
    unhold = None if model is None else _accumulate_model.hold(acc, model)
    wrap_zero_grad(optimizer)  # zero_grad() must be a no-op inside a window
    p.gate = acc
    _open.append(acc)
    ok = False
    try:
        yield acc
        ok = True
    finally:
        _open.remove(acc)
        try:
            if ok:
                acc.flush()
            else:
                acc.discard()
        finally:
            p.gate = prev_gate
            if unhold is not None:
                unhold()
                dp.set_sync(acc.model, True)
