"""Gradient sync of data-parallel models for ``tk.accumulate``: DDP and FSDP2 (and FSDP1).

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

import warnings
from typing import Any, List, Optional


def check_model(n: int, model: Any, normalize: str) -> None:
    """Refuse, before any state changes, an FSDP2 model this torch cannot sync a partial window
    of, ``normalize="items"`` on a mesh whose data-parallel ranks are not known here, and a
    ``DDP(static_graph=True)`` model's windows (torch fails them, see below)."""
    if n > 1 and is_ddp(model) and getattr(model, "static_graph", False):
        # Its no_sync() crashes the first backward (expect_autograd_hooks_ INTERNAL ASSERT
        # FAILED), and past that assert stops all-reducing from the second window on
        # (pytorch/pytorch#143580, #187732; torch 2.14 on gloo alike).
        raise ValueError(f"accumulate({n}, optimizer, model=DistributedDataParallel(..., "
                         f"static_graph=True)): DDP's static graph cannot skip the gradient "
                         f"sync of a window's first micro-batches (torch fails at the first "
                         f"backward: pytorch/pytorch#143580); make the DDP model without "
                         f"static_graph=True, or pass no model= (DDP then syncs at every "
                         f"micro-batch)")
    if is_fsdp2(model):
        get_state = getattr(model, "_get_fsdp_state", None)
        state = get_state() if callable(get_state) else None
        if not callable(getattr(state, "_root_post_backward_final_callback", None)):
            import torch

            raise RuntimeError(f"accumulate({n}, optimizer, model=<FSDP2 model>): this torch "
                               f"({torch.__version__}) has no FSDP end-of-backward step to sync a "
                               f"partial last window with; use a torch whose FSDP2 has "
                               f"_root_post_backward_final_callback (2.14 does), or pass no "
                               f"model= (FSDP then syncs at every micro-batch)")
        ndim = _fsdp2_mesh(model).ndim
        if normalize == "items" and ndim != 1:
            raise ValueError(f"accumulate({n}, optimizer, model=<FSDP2 model on a "
                             f"{ndim}-D mesh>, normalize='items'): the items "
                             f"are summed over the data-parallel ranks, known here for a 1-D "
                             f"mesh only (not HSDP or FSDP + tensor parallel); use "
                             f"normalize='mean' with equal micro-batches, or a 1-D mesh")


def is_ddp(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def is_fsdp2(model: Any) -> bool:
    """A module given to ``fully_shard`` (FSDP2); FSDP1's wrapper has no such method."""
    return model is not None and callable(getattr(model, "set_requires_gradient_sync", None))


def is_fsdp1(model: Any) -> bool:
    """FSDP1's ``FullyShardedDataParallel`` wrapper (its gradients are flat shards)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - a torch built without distributed
        return False
    return isinstance(model, FullyShardedDataParallel)


def clip_grad_norm(optimizer: Any, max_norm: float, model: Any = None) -> Any:
    """Clip the gradients of ``optimizer``'s parameters to a total norm of ``max_norm``; the norm
    before clipping (a tensor). An FSDP1 ``model`` clips through its own ``clip_grad_norm_``,
    which knows the shards; FSDP2's DTensor gradients and DDP's synced ones take torch's."""
    if model is not None and is_fsdp1(model):
        return model.clip_grad_norm_(max_norm)
    import torch

    params = [p for g in optimizer.param_groups for p in g["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def fsdp1_sharded(optimizer: Any) -> bool:
    """Whether ``optimizer`` holds parameters that FSDP1 (``FullyShardedDataParallel``) manages:
    their gradients are shards, whose total norm only the FSDP module can compute. Asked at
    every clipped step: the first parameter of each group tells (FSDP1 marks all it manages)."""
    return any(getattr(g["params"][0], "_fsdp_flattened", False)  # torch's own mark, on flat
               for g in optimizer.param_groups if g["params"])  # and original parameters alike


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
    if is_ddp(model):
        return model.process_group
    if is_fsdp2(model):
        return _fsdp2_mesh(model).get_group()
    return None


def dp_world(model: Any) -> int:
    """Ranks whose gradients DDP / FSDP2 average: 1 for any other model."""
    if is_ddp(model):
        import torch

        return torch.distributed.get_world_size(model.process_group)
    if is_fsdp2(model):
        return _fsdp2_mesh(model).size()
    return 1


def fsdp2_reduce_held_back(model: Any) -> None:
    """Reduce-scatter the gradients an FSDP2 model held back (sync off): a collective.

    FSDP runs its end-of-backward step once more with sync on; for every parameter group whose
    backward was not just run it does what a synced backward would (see the module docstring).
    """
    model.set_requires_gradient_sync(True)
    model._get_fsdp_state()._root_post_backward_final_callback()


def fsdp2_drop_held_back(model: Any) -> None:
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


def manual_allreduce(model: Any) -> Optional[int]:
    """All-reduce (average) the gradients of an unsynced partial window; None when not DDP.

    Every trainable parameter of the model, in the model's order, on every rank: a parameter
    one rank did not use (``find_unused_parameters=True``, a branch taken by some ranks only) has
    no gradient there, and a list of the present ones only would pair one rank's gradient with
    another's. It takes part with zeros; one unused on every rank keeps no gradient, as DDP
    leaves it. One small all-reduce says which were used anywhere.
    """
    import torch

    if not is_ddp(model):
        return None
    world = dp_world(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return world
    group = model.process_group
    used = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], device=params[0].device)
    torch.distributed.all_reduce(used, group=group)
    for p, anywhere in zip(params, used.tolist()):  # a sync, once per partial window
        if not anywhere:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad, group=group)
        p.grad.div_(float(world))
    return world


def global_items(items: float, grads: List[Any], model: Any) -> float:
    """The items of the window over all ranks (one all-reduce of a scalar, at the boundary)."""
    import torch

    world = dp_world(model)
    if world == 1:
        return items
    device = grads[0].device if grads else torch.device("cpu")
    t = torch.tensor([items], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=_dp_group(model))
    return float(t.item())  # a sync, once per window: the divisor must be known on the host


def set_sync(model: Any, sync: bool) -> None:
    if is_fsdp2(model):
        model.set_requires_gradient_sync(sync)
    elif is_ddp(model):  # the flag its no_sync() context flips
        model.require_backward_grad_sync = sync


def unwrap_compiled(model: Any) -> Any:
    """The module ``torch.compile`` wrapped (an ``OptimizedModule``'s ``_orig_mod``), else
    ``model``: ``torch.compile(DDP(model))``, the order torch recommends, is a DDP model whose
    sync flag, process group and world size are the inner module's, not the wrapper's."""
    import sys

    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # no compiled model without it
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    while wrapper is not None and isinstance(model, wrapper):
        model = model._orig_mod
    return model
