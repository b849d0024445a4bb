"""``tk.to_device`` for an object that moves itself: one with a ``.to()`` of its own (a PyTorch
Geometric ``Data`` or ``Batch``, a DGL graph, a TensorDict), which trainkit cannot walk into and
so moves through that method; and the bytes of a tensor, sparse ones included."""
from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

#: How far :func:`_leaves` looks into an object for its tensors: a graph's storage is 2 levels
#: and a few dozen objects; a batch that also holds its dataset, a vocabulary or a model must not
#: be walked whole on every copy (a reference to a list of 200,000 tensors took 1 s a call).
_DEPTH = 6
_VISITS = 2_000  # objects looked at, at most, breadth first (the batch's own fields first)
_WIDE = 1_000  # a sequence or mapping longer than this is no batch field: not looked into


def tensor_nbytes(t: Any) -> int:
    """The bytes a copy of ``t`` moves: a sparse tensor's indices and values (``numel()`` is its
    dense shape's: a bag of words over a vocabulary counted ~1000x its bytes)."""
    import torch

    if t.layout is torch.strided:
        return t.numel() * t.element_size()
    if t.layout is torch.sparse_coo:
        parts = (t._indices(), t._values())
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (t.crow_indices(), t.col_indices(), t.values())
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = (t.ccol_indices(), t.row_indices(), t.values())
    else:  # another layout (mkldnn...): its dense size
        return t.numel() * t.element_size()
    return sum(p.numel() * p.element_size() for p in parts)


def move_itself(obj: Any, device: Any, non_blocking: Optional[bool], acc: Optional[list]) -> Any:
    """``obj.to(device)``, with ``non_blocking`` when one was given (and its ``.to`` takes it);
    ``acc`` (None in traced code) adds up the host bytes it moved, found by comparing its tensors
    before and after, place by place, so that ``h2d_*`` count them as a tensor's copy would be.
    Before is taken before the call: a ``.to()`` that moves the object in place and returns it
    (PyG's ``Data``) left nothing to compare, and no copy was counted."""
    before = _leaves(obj) if acc is not None and device.type != "cpu" else None
    try:
        if non_blocking is None:  # where its tensors are pinned is its .to()'s to know
            out = obj.to(device)
        else:
            try:
                out = obj.to(device, non_blocking=non_blocking)
            except TypeError as exc:  # a .to(device) without the keyword
                if "non_blocking" not in str(exc):
                    raise
                out = obj.to(device)
    except RuntimeError:  # torch's own (a CUDA error, out of memory): about the move itself
        raise
    except Exception as exc:  # its .to() refused a device: a unit conversion's (pint's)
        if hasattr(exc, "add_note"):  # Python >= 3.11; the error itself is kept as it is
            exc.add_note(f"trainkit.to_device moved this {type(obj).__qualname__} by its own "
                         f".to({str(device)!r}), as it moves graphs and TensorDicts; if that "
                         f".to() is no device move, keep the object out of what to_device is "
                         f"given, e.g. x, y = tk.to_device((x, y), device)")
        raise
    if before is not None:
        after = _leaves(out)
        seen = set()
        for place, t in before.items():
            moved = after.get(place)
            if moved is None or moved is t or t.device.type != "cpu" or id(t) in seen \
                    or moved.device.type != device.type:
                continue
            seen.add(id(t))
            nbytes = tensor_nbytes(t)
            acc[0] += nbytes
            if t.is_pinned():
                acc[1] += nbytes
    return out


def _leaves(obj: Any) -> Dict[Tuple[Any, ...], Any]:
    """``place -> tensor`` for the tensors in ``obj``: in its attributes, and in the tuples,
    lists and mappings they hold, breadth first, within :data:`_DEPTH` levels and
    :data:`_VISITS` objects, passing over models and containers longer than :data:`_WIDE`."""
    import torch

    out: Dict[Tuple[Any, ...], Any] = {}
    queue = collections.deque([((), obj, 0)])
    ids = set()
    while queue and len(ids) < _VISITS:
        place, node, depth = queue.popleft()
        if isinstance(node, torch.Tensor):
            out[place] = node
            continue
        if depth >= _DEPTH or id(node) in ids or isinstance(
                node, (str, bytes, type, torch.nn.Module)):
            continue
        ids.add(id(node))  # a cycle (a child pointing at its parent) ends here
        try:
            if isinstance(node, (tuple, list, Mapping)) and len(node) > _WIDE:
                continue
            if isinstance(node, (tuple, list)):
                items: Any = enumerate(node)
            elif isinstance(node, Mapping):
                items = list(node.items())
            else:
                items = getattr(node, "__dict__", {}).items()
            for key, value in items:
                queue.append((place + (key,), value, depth + 1))
        except Exception:  # a mapping that cannot list itself: passed over
            continue
    return out
