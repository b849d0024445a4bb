"""``tk.accumulate``: gradient accumulation that equals the big batch, the last window included.

The user's loop stays as it is (``loss.backward(); optimizer.step(); optimizer.zero_grad()``).
The accumulator is the *gate* of the patched optimizer (see :mod:`trainkit.patch`): every
``optimizer.step()`` call is one micro-batch; the n-th call of a window really steps, after the
summed gradients were divided by the number of micro-batches in the window (or by the items
counted with ``acc.add_items``), so the loss is the plain per-micro-batch mean and needs no
``/ n``. ``zero_grad()`` is a no-op while a window is open.

A loss that the user ALSO divides by ``n`` cannot be detected from the gradients (a gradient
scaled by ``1/n`` looks like a smaller one). It can be seen where the loss itself passes through
trainkit: ``amp.backward(loss)`` looks at the loss's last autograd node, and a literal
``loss / n`` (or ``loss * (1 / n)``) with this window's ``n`` gets one warning per block. No
guessing beyond that: a plain ``loss.backward()`` is left to ``trainkit lint`` (TK104), which
finds the division in the source.

DDP: with ``model=`` a forward pre-hook sets ``require_backward_grad_sync`` (what ``no_sync()``
does) before each forward, so only the boundary micro-batch all-reduces. The last, partial
window cannot be known in advance, so its gradients are all-reduced by hand on exit.

FSDP2 (``fully_shard``): the same hook calls ``set_requires_gradient_sync(bool)``; FSDP then
keeps the window's unsharded gradients on each rank and reduce-scatters their sum at the
boundary's backward. A partial last window has no such backward, so on exit FSDP's own
end-of-backward step is run once with sync on (``_root_post_backward_final_callback``, the one
private entry point used; checked at block entry): it reduce-scatters what was held back, exactly
as a synced backward would (reduce dtype, divide factor, HSDP all-reduce included). When the
block ends with an exception, the held-back gradients are dropped on this rank alone (no
collective: the other ranks may never get there).

FSDP1 (``FullyShardedDataParallel``, deprecated by torch for FSDP2) is left to sync at every
micro-batch: its gradients are exact and the partial window needs nothing, only the saving of
skipped syncs is not had.
"""
from __future__ import annotations

import contextlib
import math
import sys
import warnings
from typing import Any, Callable, Iterator, List, Literal, Optional

from ..patch import optimizer_patch, patch as _patch_opt, wrap_zero_grad

Normalize = Literal["mean", "items"]
_NORMALIZE = ("mean", "items")
#: The accumulate blocks open right now, innermost last: the state of the ``with`` blocks, as
#: autocast keeps its own; amp.backward reads it to spot a loss divided by n a second time.
_open: List["Accumulator"] = []


def _check(n: Any, optimizer: Any, model: Any, normalize: Any) -> None:
    import torch

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"accumulate(n={n!r}): n must be a positive int (micro-batches per "
                         f"optimizer step), e.g. accumulate(4, optimizer)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"accumulate({n}, optimizer={optimizer!r:.80}): expected a "
                        f"torch.optim.Optimizer, got {type(optimizer).__name__}; e.g. "
                        f"accumulate({n}, torch.optim.SGD(model.parameters(), lr=0.1))")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"accumulate({n}, optimizer, model={model!r:.80}): model must be the "
                        f"nn.Module (e.g. the DistributedDataParallel wrapper) or None")
    if normalize not in _NORMALIZE:
        raise ValueError(f"accumulate({n}, optimizer, normalize={normalize!r}): normalize must be "
                         f"one of {', '.join(map(repr, _NORMALIZE))}; use 'items' with "
                         f"acc.add_items(k) to divide by tokens, e.g. normalize='items'")
    if _is_fsdp2(model):
        get_state = getattr(model, "_get_fsdp_state", None)
        state = get_state() if callable(get_state) else None
        if not callable(getattr(state, "_root_post_backward_final_callback", None)):
            import torch

            raise RuntimeError(f"accumulate({n}, optimizer, model=<FSDP2 model>): this torch "
                               f"({torch.__version__}) has no FSDP end-of-backward step to sync a "
                               f"partial last window with; use a torch whose FSDP2 has "
                               f"_root_post_backward_final_callback (2.14 does), or pass no "
                               f"model= (FSDP then syncs at every micro-batch)")
        if normalize == "items" and _fsdp2_mesh(model).ndim != 1:
            raise ValueError(f"accumulate({n}, optimizer, model=<FSDP2 model on a "
                             f"{_fsdp2_mesh(model).ndim}-D mesh>, normalize='items'): the items "
                             f"are summed over the data-parallel ranks, known here for a 1-D "
                             f"mesh only (not HSDP or FSDP + tensor parallel); use "
                             f"normalize='mean' with equal micro-batches, or a 1-D mesh")
    gate = getattr(optimizer_patch(optimizer), "gate", None)
    if isinstance(gate, Accumulator):
        raise ValueError(f"accumulate({n}, optimizer): this optimizer is already inside "
                         f"accumulate({gate.n}, ...); nest nothing, use one accumulate block")


def _is_user_scaler_step() -> bool:
    """True when an enabled GradScaler's ``step`` is what called ``optimizer.step()``.

    Walks a few frames up (cheap: only done on non-boundary micro-batches).
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
    """

    def __init__(self, n: int, optimizer: Any, model: Any, normalize: Normalize) -> None:
        self.n = n
        self.optimizer = optimizer
        self.model = model
        self.normalize: Normalize = normalize
        self.micro_batches = 0
        self.steps = 0
        self.items = 0.0
        self._prepared = False  # the current window's gradients are synced and divided
        self._force = False  # the exit's step of a partial window
        self._unsynced = False  # the window's last backward ran with DDP/FSDP2 sync off
        self._sync = True  # what the forward pre-hook last set
        self._warned_divided = False
        #: set by ``amp.step``: performs the window's step through the GradScaler.
        self.amp_step: Optional[Callable[[], Any]] = None

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
        if isinstance(k, (bool, str, bytes)):
            raise TypeError(f"add_items({k!r}): k must be a number of items, e.g. acc.add_items(len(y))")
        try:
            v = float(k)  # a 0-d tensor too (y.numel() is an int; a mask's .sum() a tensor)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"add_items({k!r}): k must be a number of items, "
                            f"e.g. acc.add_items(len(y))") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"add_items({k!r}): k must be a finite number >= 0 of items in this "
                             f"micro-batch, e.g. acc.add_items(len(y))")
        self.items += v

    # -- the gate protocol (trainkit.patch) ------------------------------------------------------
    def should_step(self) -> bool:
        if not self.boundary:
            if _is_user_scaler_step():
                raise RuntimeError(
                    "scaler.step(optimizer) inside tk.accumulate: GradScaler unscales the "
                    "gradients at every micro-batch, which corrupts the accumulated sum (and its "
                    "update() changes the scale mid-window). Use amp.step(optimizer) from "
                    "`with tk.autocast_scaled(scaler) as amp`, which unscales only at the "
                    "window's last micro-batch")
            self.micro_batches += 1
            self._unsynced = self._sync_off()
            return False
        self.prepare()
        self.end_window(stepped=True)
        return True

    def hold_zero_grad(self) -> bool:
        return self.micro_batches > 0

    # -- for amp.step and the exit ---------------------------------------------------------------
    def prepare(self) -> None:
        """Sync (partial last window under DDP) and divide the window's gradients, once."""
        if self._prepared:
            return
        self._prepared = True
        grads = _grads(self.optimizer)
        world = _manual_allreduce(grads, self.model) if self._force and self._unsynced else None
        if self.normalize == "items":
            if self.items <= 0:
                raise ValueError(f"accumulate(normalize='items'): no items were counted in this "
                                 f"window (acc.items={self.items!r}); call acc.add_items(k) "
                                 f"once per micro-batch, e.g. acc.add_items(y.numel())")
            divisor = _global_items(self.items, grads, self.model)
        else:
            # The boundary call itself is not counted yet (the exit's step is no micro-batch).
            divisor = float(self.micro_batches + (0 if self._force else 1))
        if world is None:
            world = _dp_world(self.model)
        # DDP averages over ranks; items normalisation wants the sum over ranks / total items.
        divisor = divisor / world if self.normalize == "items" else divisor
        if divisor != 1.0 and grads:
            import torch

            torch._foreach_div_(grads, divisor)

    def end_window(self, *, stepped: bool) -> None:
        self.micro_batches = 0
        self.items = 0.0
        self._prepared = False
        self._unsynced = False
        if stepped:
            self.steps += 1

    def _sync_off(self) -> bool:
        """Whether the backward just run was unsynced (set by the forward pre-hook)."""
        m = self.model
        if m is None:
            return False
        if _is_fsdp2(m):
            return not self._sync
        return not getattr(m, "require_backward_grad_sync", True)

    def forward_pre_hook(self, module: Any, args: Any) -> None:
        # Decided at the forward, before backward: only the window's last micro-batch syncs.
        self._sync = self.micro_batches + 1 >= self.n
        _set_sync(module, self._sync)

    def flush(self) -> None:
        """Step once for a partial last window (at least one micro-batch with gradients)."""
        if self.micro_batches == 0:
            return
        if self._unsynced and _is_fsdp2(self.model):
            _fsdp2_reduce_held_back(self.model)  # every rank gets here (a normal exit)
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

    def discard(self) -> None:
        """Drop a partial window's gradients (the block left with an exception)."""
        if self.micro_batches:
            optimizer_patch(self.optimizer).orig_zero_grad(set_to_none=True)
            if self._unsynced and _is_fsdp2(self.model):
                _fsdp2_drop_held_back(self.model)
        self.end_window(stepped=False)

    def __repr__(self) -> str:
        return (f"<trainkit.accumulate n={self.n} micro_batches={self.micro_batches} "
                f"steps={self.steps} normalize={self.normalize!r}>")


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


def _grads(optimizer: Any) -> List[Any]:
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def _is_ddp(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def _is_fsdp2(model: Any) -> bool:
    """A module given to ``fully_shard`` (FSDP2); FSDP1's wrapper has no such method."""
    return model is not None and callable(getattr(model, "set_requires_gradient_sync", None))


def _fsdp2_mesh(model: Any) -> Any:
    """The device mesh of an FSDP2 model's (DTensor) parameters."""
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return mesh
    raise ValueError(f"accumulate(model={type(model).__name__}): an FSDP2 model whose parameters "
                     f"are not DTensors; pass the module given to fully_shard")


def _dp_group(model: Any) -> Any:
    """The data-parallel process group of a DDP or FSDP2 (1-D mesh) model; None for others."""
    if _is_ddp(model):
        return model.process_group
    if _is_fsdp2(model):
        return _fsdp2_mesh(model).get_group()
    return None


def _dp_world(model: Any) -> int:
    """Ranks whose gradients DDP / FSDP2 average: 1 for any other model."""
    if _is_ddp(model):
        import torch

        return torch.distributed.get_world_size(model.process_group)
    if _is_fsdp2(model):
        return _fsdp2_mesh(model).size()
    return 1


def _fsdp2_reduce_held_back(model: Any) -> None:
    """Reduce-scatter the gradients an FSDP2 model held back (sync off): a collective.

    FSDP runs its end-of-backward step once more with sync on; for every parameter group whose
    backward was not just run it does what a synced backward would (see the module docstring).
    """
    model.set_requires_gradient_sync(True)
    model._get_fsdp_state()._root_post_backward_final_callback()


def _fsdp2_drop_held_back(model: Any) -> None:
    """Drop this rank's held-back FSDP2 gradients, with no collective (the block raised).

    They would otherwise join the next synced backward's gradients. Private FSDP2 attributes;
    where they are not found, a warning says what is left.
    """
    try:
        for m in model.modules():
            get_state = getattr(m, "_get_fsdp_state", None)
            if get_state is None:
                continue
            state = get_state()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [] if group is None else [group]
            for group in groups:
                for fp in group.fsdp_params:
                    fp.unsharded_accumulated_grad = None
                    param = getattr(fp, "_unsharded_param", None)
                    if param is not None:
                        param.grad = None
    except AttributeError as e:
        warnings.warn(f"accumulate: the partial window's held-back FSDP gradients could not be "
                      f"dropped on this torch ({e}); the next synced backward adds them in. "
                      f"Call zero_grad() after one synced backward before training on",
                      RuntimeWarning, stacklevel=4)


def _manual_allreduce(grads: List[Any], model: Any) -> Optional[int]:
    """All-reduce (average) the gradients of an unsynced partial window; None when not DDP."""
    import torch

    if not _is_ddp(model):
        return None
    world = torch.distributed.get_world_size(model.process_group)
    for g in grads:
        torch.distributed.all_reduce(g, group=model.process_group)
    if grads:
        torch._foreach_div_(grads, float(world))
    return world


def _global_items(items: float, grads: List[Any], model: Any) -> float:
    """The items of the window over all ranks (one all-reduce of a scalar, at the boundary)."""
    import torch

    world = _dp_world(model)
    if world == 1:
        return items
    device = grads[0].device if grads else torch.device("cpu")
    t = torch.tensor([items], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=_dp_group(model))
    return float(t.item())  # a sync, once per window: the divisor must be known on the host


def _set_sync(model: Any, sync: bool) -> None:
    if _is_fsdp2(model):
        model.set_requires_gradient_sync(sync)
    elif _is_ddp(model):  # the flag its no_sync() context flips
        model.require_backward_grad_sync = sync


@contextlib.contextmanager
def accumulate(n: int, optimizer: Any, *, model: Any = None,
               normalize: Normalize = "mean") -> Iterator[Accumulator]:
    """Accumulate gradients over ``n`` micro-batches per optimizer step, around the whole loop.

    Inside the block ``optimizer.step()`` really steps on every n-th call, after dividing the
    gradients by the micro-batches actually in that window (``normalize="mean"``: the loss is the
    usual per-micro-batch mean; do NOT divide it by ``n`` yourself: ``amp.backward`` warns once
    when it sees ``loss / n``, and ``trainkit lint`` finds it in the source) or by the items counted with
    ``acc.add_items`` (``normalize="items"``; losses use ``reduction="sum"``). ``zero_grad()``
    is a no-op inside a window. On a normal exit a partial last window steps once more; when the
    block exits with an exception that partial window is discarded (its gradients are set to
    None) and the exception propagates. With ``model=`` (DDP, FSDP2) gradient sync runs only on a
    window's last micro-batch (FSDP1 is left to sync at every one). Use ``amp.step`` (not
    ``scaler.step``) for AMP inside the block.

    Args:
        n: micro-batches per optimizer step (a positive int).
        optimizer: the optimizer; patched with :func:`trainkit.patch` if it is not already.
        model: the DDP-wrapped model or the FSDP2 root (given to ``fully_shard``), to skip
            gradient sync on non-boundary micro-batches.
        normalize: ``"mean"`` (divide by micro-batches) or ``"items"`` (by ``acc.add_items``).

    Example::

        with tk.accumulate(4, optimizer, model=model) as acc:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); optimizer.step(); optimizer.zero_grad()
    """
    _check(n, optimizer, model, normalize)
    _patch_opt(optimizer)
    p = optimizer_patch(optimizer)
    acc = Accumulator(n, optimizer, model, normalize)
    prev_gate = p.gate
    hook = None
    if model is not None:
        hook = model.register_forward_pre_hook(acc.forward_pre_hook)
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
            if hook is not None:
                hook.remove()
                _set_sync(model, True)
