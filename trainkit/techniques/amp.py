"""``tk.autocast_scaled``: autocast with a dtype chosen for the device, and counted skipped steps.

``amp.step(optimizer)`` is ``unscale_ -> optional clip -> scaler.step -> scaler.update``. It knows
whether the step was skipped (an inf/nan gradient) *without adding a device sync*: a GradScaler
already reads its found-inf flag on the host before it decides to call ``optimizer.step()``, so
``amp.step`` only watches, with a step post-hook held for the duration of the call, whether the
optimizer really stepped. Optimizers that take the scaling into their own kernel
(``_step_supports_amp_scaling``: fused Adam/AdamW/SGD) are always called, so for them the
found-inf flags are added up and read with ``.item()`` — one sync per real step on CUDA (however
many devices the parameters are on: each other device's 4-byte flag is a device-to-device copy
queued onto the first one's, which does not wait on the host), the price of the bool
``amp.step`` returns. The scale is recorded as a copy of the scale tensor (resolved by the writer
thread, never read in the step) on CUDA, as a float on the CPU.

Inside ``tk.accumulate`` ``amp.step`` unscales, clips, steps and updates only at a window's last
micro-batch (it asks the optimizer's gate); elsewhere it only counts the micro-batch. A user's own
``scaler.step(optimizer)`` inside ``tk.accumulate`` would unscale the partial sum at every
micro-batch: trainkit raises a ``RuntimeError`` pointing to ``amp.step`` instead of corrupting the
gradients. Outside ``accumulate`` the user's own scaler calls work unchanged, inside or after the
``with`` block.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Literal, Optional, Tuple

from .._text import brief
from .._wrapped import inner_optimizer
from ..patch import optimizer_patch
from . import data_parallel as dp
from . import _amp_scales as scales
from ._accumulate_args import check_clip
from .accumulate import _open as _open_blocks
from .divided import warn_if_divided
from ..session import active as _active_session
from .. import switches, timing
from ..recorder import AMP_SCALE, AMP_SKIPPED


Dtype = Literal["auto", "bf16", "fp16", "fp32"]
#: GradScaler -> steps it skipped so far (inf/nan gradients), across autocast_scaled blocks.
_skipped: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
#: GradScaler -> (updates amp.step made so far, a copy of the scale the backward they followed
#: ran at, and the updates made before that backward): several optimizers stepped on one
#: backward (each amp.step of it after the first) unscale by the backward's scale.
_updates: "weakref.WeakKeyDictionary[Any, Tuple[int, Any, int]]" = weakref.WeakKeyDictionary()
_DTYPES = ("auto", "bf16", "fp16", "fp32")


class Amp:
    """What ``autocast_scaled`` yields: ``backward``, ``step`` and the ``skipped`` count.

    Attributes:
        scaler: the GradScaler (None for bf16/fp32, or when the technique is off).
        dtype: the autocast dtype, or None when autocast is disabled.
        device_type: ``"cuda"`` or ``"cpu"``.
        skipped: optimizer steps skipped so far because of inf/nan gradients, counted per
            scaler: the count goes on across ``with`` blocks (one per iteration, as usual).
    """

    def __init__(self, scaler: Any, dtype: Any, device_type: str) -> None:
        self.scaler = scaler
        self.dtype = dtype
        self.device_type = device_type
        self._backward_at: Optional[int] = None  # the scaler's updates at the last backward

    @property
    def skipped(self) -> int:
        return _skipped.get(self.scaler, 0) if self.scaler is not None else 0

    def _scaling(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def backward(self, loss: Any, **kwargs: Any) -> None:
        """``scaler.scale(loss).backward()`` (a plain ``loss.backward()`` without a scaler).

        Example::

            amp.backward(loss)
        """
        if not _is_tensor(loss):  # (a loss.item()): refused before the window is marked scaled
            raise TypeError(f"amp.backward({brief(loss)}): expected the loss tensor, got "
                            f"{type(loss).__name__} (a loss.item() or a float has no graph to "
                            f"backpropagate); e.g. loss = criterion(model(x), y); "
                            f"amp.backward(loss)")
        warn_if_divided(loss)  # a second division by n inside tk.accumulate
        if self._scaling():
            self._backward_at = _updates.get(self.scaler, (0, None, 0))[0]
            if len(_open_blocks) == 1:  # (with several open, whose gradients it scaled is
                # not known): its window's end must unscale (amp.step), not step as they are
                _open_blocks[0]._scaled = True
        (self.scaler.scale(loss) if self._scaling() else loss).backward(**kwargs)

    def step(self, optimizer: Any, clip_grad_norm: Optional[float] = None) -> bool:
        """Unscale, clip (optional), step and update; False when the step was skipped (inf/nan).

        Inside ``tk.accumulate`` this only counts the micro-batch until the window's last one.
        Several optimizers stepped on one ``amp.backward`` (``amp.step(o1); amp.step(o2)``) make
        one GradScaler update, at the first, as torch's recipe does once after all steps.

        Args:
            optimizer: the optimizer to step.
            clip_grad_norm: max norm for ``torch.nn.utils.clip_grad_norm_`` on the optimizer's
                parameters, applied to the unscaled (and accumulated) gradients; None: no clip.

        Example::

            amp.backward(loss); amp.step(optimizer, clip_grad_norm=1.0); optimizer.zero_grad()
        """
        clip_grad_norm = check_clip(clip_grad_norm, "amp.step(optimizer, ...)")
        _check_optimizer(optimizer)
        inner = inner_optimizer(optimizer)
        if inner is not None and getattr(optimizer_patch(inner), "gate", None) is not None:
            optimizer = inner  # accelerate's prepared one in tk.accumulate (which the gate is on)
        gate = getattr(optimizer_patch(optimizer), "gate", None)
        if clip_grad_norm is not None and getattr(gate, "clip_grad_norm", None) is not None:
            raise ValueError(f"amp.step(optimizer, clip_grad_norm={clip_grad_norm!r}) inside "
                             f"tk.accumulate(..., clip_grad_norm={gate.clip_grad_norm!r}): clip "
                             f"once; drop one of the two (accumulate's clips every real step)")
        if clip_grad_norm is not None and getattr(gate, "model", None) is None \
                and dp.fsdp1_sharded(optimizer):
            raise ValueError(f"amp.step(optimizer, clip_grad_norm={clip_grad_norm!r}): the "
                             f"optimizer's parameters are sharded by FullyShardedDataParallel, "
                             f"whose total norm only the FSDP model can compute; name it: wrap "
                             f"the loop in tk.accumulate(1, optimizer, model=fsdp_model) (or n "
                             f"micro-batches), and amp.step clips through it")
        boundary = getattr(gate, "boundary", True)
        if hasattr(gate, "_grads_at") and self._backward_at is not None:
            # an accumulate block's window: its gradients at the scale in force (_amp_scales)
            scales.align(gate, self.scaler, self._backward_at,
                         _updates.get(self.scaler, (0, None, 0))[0], optimizer)
        if not boundary:  # inside a window: no unscale, no update, the gate counts the call
            optimizer.step()
            gate.amp_step = lambda: self._real_step(optimizer, clip_grad_norm, gate)
            return True
        if gate is not None and hasattr(gate, "amp_step"):
            gate.amp_step = lambda: self._real_step(optimizer, clip_grad_norm, gate)
        return self._real_step(optimizer, clip_grad_norm, gate)

    def _real_step(self, optimizer: Any, clip: Optional[float], gate: Any) -> bool:
        prepare = getattr(gate, "prepare", None)
        if prepare is not None:
            prepare()  # divide the window's sum first, so the clip sees the window's gradient
        scaling = self._scaling()
        s = _active_session()
        step = None if s is None else s.step  # the records below belong to the step in progress
        # A second optimizer stepped on the same backward (`amp.step(o1); amp.step(o2)`): the
        # first's update changed the scale its gradients were scaled by, so they are unscaled
        # by the scale before it, and no second update is made (torch's recipe: one a backward).
        # An accumulate block's window gradients follow the scale (_amp_scales): they are at the
        # scale in force, and only the update is not made again.
        count, before, ran_at = _updates.get(self.scaler, (0, None, 0)) if scaling else (0, None, 0)
        stale = before is not None and self._backward_at == ran_at < count
        current = self.scaler._scale if stale else None
        at = getattr(gate, "_grads_at", None)
        swap = stale and not (at is not None and at[0] is self.scaler and at[1] == count)
        if swap:
            self.scaler._scale = before
        try:
            if scaling:
                self.scaler.unscale_(optimizer)
            return self._unscaled_step(optimizer, clip, gate, s, step, scaling, current)
        finally:
            if swap:
                self.scaler._scale = current

    def _unscaled_step(self, optimizer: Any, clip: Optional[float], gate: Any, s: Any,
                       step: Any, scaling: bool, current: Any) -> bool:
        if clip is not None:  # an FSDP1 model (an accumulate block's) clips through its own
            dp.clip_grad_norm(optimizer, clip, getattr(gate, "model", None))
        if not scaling:
            optimizer.step()
            return True
        acc = gate if hasattr(gate, "amp_step") else None  # an accumulate block's gate
        if acc is not None:
            acc._amp_stepping = True  # this scaler.step is amp.step's, not the user's
        try:
            stepped = _step_watched(self.scaler, optimizer)
        finally:
            if acc is not None:
                acc._amp_stepping = False
        if current is None or not stepped:
            count, backward, ran_at = _updates.get(self.scaler, (0, None, 0))
            if current is None:  # this backward's update
                before = backward = self.scaler._scale.clone()  # no sync: on the scale's device
                ran_at = count
            else:
                # Its update made by another optimizer's step, this step found inf/nan: torch's
                # one update after all steps would have backed the scale off from the backward's
                # (the first update may have grown it, or backed it off already), so this one
                # starts there. The scale swapped in for the unscale is put back first (update
                # works in place); the open windows' gradients are at the first update's scale.
                self.scaler._scale = current
                before = current.clone()
                current.copy_(backward)
            self.scaler.update()
            _updates[self.scaler] = (count + 1, backward, ran_at)
            scales.updated(self.scaler, count, before, _open_blocks, gate)
        else:
            # No second update, and GradScaler keeps this optimizer "stepped" until one: its next
            # unscale_ (the block's exit, its next window) raised "unscale_() is being called
            # after step()" where no other update came between. Ready again, as update leaves it.
            states = getattr(self.scaler, "_per_optimizer_states", None)
            if isinstance(states, dict):
                states.pop(id(optimizer), None)
        if not stepped:
            _skipped[self.scaler] = self.skipped + 1
            # The LR scheduler's "lr_scheduler.step() before optimizer.step()" warning is about a
            # forgotten step; a skipped AMP step is not one.
            optimizer._opt_called = True
            if gate is not None and hasattr(gate, "end_window"):
                gate.end_window(stepped=False)  # the gate never saw this step
        if s is not None:
            step = _step_of(s, step, optimizer)
            scale = self.scaler._scale if current is None else current
            s._buf.append((AMP_SKIPPED, step, float(self.skipped)))
            s._buf.append((AMP_SCALE, step,
                           timing.pending_copy(scale) if scale.is_cuda else float(scale.item())))
        return stepped

    def __repr__(self) -> str:
        return (f"<trainkit.autocast_scaled dtype={self.dtype} device_type={self.device_type!r} "
                f"scaler={'on' if self._scaling() else 'off'} skipped={self.skipped}>")


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _check_optimizer(optimizer: Any) -> None:
    """Refuse what is no optimizer (a model, its parameters, the scaler), before anything is
    unscaled: it failed inside GradScaler with "'Linear' object has no attribute 'param_groups'"."""
    import torch

    if isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, "param_groups"):
        return  # (an optimizer-like object GradScaler can step too)
    what = ("a model (nn.Module)" if isinstance(optimizer, torch.nn.Module)
            else type(optimizer).__name__)
    raise TypeError(f"amp.step({brief(optimizer)}): expected the torch.optim.Optimizer to step, "
                    f"got {what}; e.g. amp.backward(loss); amp.step(optimizer)")


def _step_of(s: Any, before: int, optimizer: Any) -> int:
    """The step an ``amp.step`` files its scale and skip count under: the step in progress when
    it began (the one its optimizer's step ended, or the one a skipped step leaves going on);
    for a second optimizer (a GAN's generator, stepping after the one that counts the steps), the
    step its update went to: that of the batch it trained on, as ``update_ms``, not the step in
    progress, which is the next one (after the last batch, one that never comes)."""
    primary = s._primary
    inner = inner_optimizer(optimizer)  # accelerate's wrapper: the patch is on the one inside
    if primary is None or primary is optimizer_patch(optimizer if inner is None else inner):
        return before
    n = s._batch_step
    return n if n is not None else max(s.step - 1, 1)


def _step_watched(scaler: Any, optimizer: Any) -> bool:
    """``scaler.step(optimizer)``; True when the optimizer really stepped (no extra sync)."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        flags = list(scaler._found_inf_per_device(optimizer).values())
        # One read (see the module docstring): the devices' flags added up on the first one;
        # a copy between two GPUs is queued (no host sync), so only .item() waits.
        bad = sum((f.to(flags[0].device) for f in flags[1:]), flags[0]) if flags else None
        if bad is not None and bad.item():
            # Skipped: not called at all, as GradScaler does for other optimizers. Called, its
            # kernel would skip the update itself, but the call would count as a real step (the
            # session's, an accumulate block's), and update() needs only the flags read here.
            return False
        scaler.step(optimizer)
        return True
    calls = [0]

    def seen(*_: Any) -> None:
        calls[0] += 1

    handle = optimizer.register_step_post_hook(seen)
    try:
        scaler.step(optimizer)
    finally:
        handle.remove()
    return calls[0] > 0


def _resolve_dtype(dtype: str, device_type: str, scaler: Any) -> Any:
    import torch

    if dtype == "fp32":
        return None
    if dtype == "bf16":
        return torch.bfloat16
    if dtype == "fp16":
        return torch.float16
    # A GPU before Ampere: fp16. Without CUDA at all (a GPU script on a CPU machine) there is no
    # GPU to say so of: torch.autocast warns and turns itself off, as for an explicit dtype.
    if device_type == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def _autocast_enabled(torch: Any, device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` here (an enclosing ``with`` block's)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch 2.3: no device argument yet
        return bool(torch.is_autocast_cpu_enabled() if device_type == "cpu"
                    else torch.is_autocast_enabled())


def _scaler_device(scaler: Any) -> Optional[str]:
    """The device a GradScaler was made for, where it says: a GradScaler('cpu') on a machine that
    also uses CUDA is for a loop on the CPU. One for 'cuda' that disabled itself (no CUDA here)
    says nothing (the check that follows names the fix)."""
    where = getattr(scaler, "_device", None)
    if where == "cpu" or (where == "cuda" and callable(getattr(scaler, "is_enabled", None))
                          and scaler.is_enabled()):
        return where
    return None


def _check(scaler: Any, dtype: Any, device_type: Any) -> str:
    if dtype not in _DTYPES:
        raise ValueError(f"autocast_scaled(dtype={dtype!r}): dtype must be one of "
                         f"{', '.join(map(repr, _DTYPES))}, e.g. autocast_scaled(scaler, dtype='bf16')")
    if device_type is None:
        device_type = _scaler_device(scaler) or ("cuda" if timing.cuda_in_use() else "cpu")
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"autocast_scaled(device_type={device_type!r}): device_type must be "
                         f"'cuda', 'cpu' or None (None: the scaler's, else 'cuda' when CUDA is in use)")
    if scaler is not None and not all(hasattr(scaler, a) for a in ("scale", "step", "update")):
        raise TypeError(f"autocast_scaled(scaler={brief(scaler)}): expected a GradScaler or None, "
                        f"e.g. autocast_scaled(torch.amp.GradScaler('cuda'))")
    if dtype == "fp16" and device_type == "cpu" and scaler is None:
        raise ValueError("autocast_scaled(scaler=None, dtype='fp16') on the CPU: fp16 without a "
                         "GradScaler underflows small gradients to zero silently; pass one, e.g. "
                         "autocast_scaled(torch.amp.GradScaler('cpu'), dtype='fp16'), or use "
                         "dtype='bf16'")
    if dtype == "fp16" and device_type == "cpu" and not scaler.is_enabled():
        where = getattr(scaler, "_device", "?")
        raise ValueError(f"autocast_scaled(scaler=<a disabled GradScaler for {where!r}>, "
                         f"dtype='fp16') on the CPU: the scaler turned itself off (GradScaler() "
                         f"is for 'cuda' by default, and disables itself where CUDA is not "
                         f"available, or it was made with enabled=False), and fp16 without one "
                         f"underflows small gradients to zero silently; make it for the CPU, e.g. "
                         f"torch.amp.GradScaler('cpu'), or use dtype='bf16'")
    return device_type


@contextlib.contextmanager
def autocast_scaled(scaler: Any = None, *, dtype: Dtype = "auto",
                    device_type: Optional[str] = None) -> Iterator[Amp]:
    """Run the block under autocast; yield ``amp`` for ``amp.backward`` and ``amp.step``.

    ``dtype="auto"`` picks bf16 where the device supports it (the CPU, Ampere+ GPUs), else fp16
    (with the scaler). ``"fp32"`` disables autocast behind the same call site (an enclosing
    autocast's too, within the block), as does the
    ``amp`` technique switched off (``tk.technique("amp", True)`` is False): then ``amp.backward``
    is ``loss.backward()`` and ``amp.step`` is ``optimizer.step()`` (returning True). The scaler
    is only used with fp16 (bf16 has fp32's range); a user's own scaler calls keep working,
    except ``scaler.step`` inside ``tk.accumulate`` (use ``amp.step`` there).

    Args:
        scaler: a ``torch.amp.GradScaler``, or None.
        dtype: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        device_type: ``"cuda"`` or ``"cpu"``; None: the scaler's own (``GradScaler('cpu')``:
            ``"cpu"``), else ``"cuda"`` when CUDA is in use.

    Example::

        scaler = torch.amp.GradScaler()
        with tk.autocast_scaled(scaler) as amp:
            loss = criterion(model(x), y)
        amp.backward(loss); amp.step(optimizer); optimizer.zero_grad()
    """
    device_type = _check(scaler, dtype, device_type)
    import torch

    on = switches.technique("amp", True)
    amp_dtype = _resolve_dtype(dtype, device_type, scaler) if on else None
    use_scaler = scaler if amp_dtype is torch.float16 else None
    if use_scaler is None and amp_dtype is torch.float16 and dtype == "auto":
        # A scaler made here would restart at init_scale every time the block is entered.
        raise ValueError("autocast_scaled(scaler=None, dtype='auto'): this GPU has no bf16, so "
                         "'auto' means fp16, which needs a GradScaler; pass one created once "
                         "before the loop, e.g. scaler = torch.amp.GradScaler('cuda')")
    amp = Amp(use_scaler, amp_dtype, device_type)
    if amp_dtype is None:
        if _autocast_enabled(torch, device_type):
            # Inside another autocast (an outer autocast_scaled, the user's own torch.autocast):
            # fp32 here too, as torch.autocast(enabled=False) does; it ran in the outer dtype.
            with torch.autocast(device_type=device_type, enabled=False):
                yield amp
            return
        yield amp  # nothing to turn off: no autocast entered (nanoGPT's nullcontext)
        return
    with torch.autocast(device_type=device_type, dtype=amp_dtype):
        yield amp
