"""``tk.to_device``: move a batch to the device, asynchronously where that is safe, and time it.

``non_blocking=True`` only overlaps the copy with compute when the source is in pinned (page-locked)
memory; from pageable memory the driver stages it through a pinned buffer anyway. So the default
copies non-blocking exactly when the source is pinned, and records how many bytes were pageable:
that share is what ``tk.analyze`` reports as "pageable host-to-device copies".
"""
from __future__ import annotations

import collections
import copy
from collections.abc import Mapping
from typing import Any, List, Optional

from ..session import active as _active_session
from .. import timing
from ..profiling.regions import profiler_enabled, record_function
from ..recorder import H2D_BYTES, H2D_MS, H2D_PINNED_BYTES


def _device(device: Any) -> Any:
    import torch

    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(f"to_device(..., device={device!r}): device must be a torch.device, a str "
                        f"such as 'cuda' or 'cuda:0', or a CUDA index such as 0")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"to_device(..., device={device!r}): not a device torch knows; use e.g. "
                         f"'cuda', 'cuda:0', 'cpu' or 'mps'") from None


def _move(obj: Any, device: Any, non_blocking: Optional[bool], acc: list) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        here = obj.device
        if here == device or (device.index is None and here.type == device.type):
            return obj  # already there ("cuda" is resolved to the current device before)
        pinned = here.type == "cpu" and obj.is_pinned()
        nb = pinned if non_blocking is None else non_blocking
        if here.type == "cpu":  # host to device: what h2d_* measure (not device to host)
            nbytes = obj.numel() * obj.element_size()
            acc[0] += nbytes
            if pinned:
                acc[1] += nbytes
        return obj.to(device, non_blocking=nb)
    if isinstance(obj, torch.nn.utils.rnn.PackedSequence):  # its batch_sizes stay on the CPU
        return type(obj)(_move(obj.data, device, non_blocking, acc), obj.batch_sizes,
                         _move(obj.sorted_indices, device, non_blocking, acc),
                         _move(obj.unsorted_indices, device, non_blocking, acc))
    if isinstance(obj, tuple):
        moved = [_move(v, device, non_blocking, acc) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    if isinstance(obj, list):
        moved = [_move(v, device, non_blocking, acc) for v in obj]
        if type(obj) is list:
            return moved
        try:
            return type(obj)(moved)  # a list subclass keeps its type
        except Exception:  # one built otherwise: its items as a list
            return moved
    if isinstance(obj, Mapping):  # dicts, and the like (a UserDict, e.g. a tokenizer's batch)
        moved = {k: _move(v, device, non_blocking, acc) for k, v in obj.items()}
        if type(obj) is dict:
            return moved
        try:
            if isinstance(obj, (dict, collections.UserDict)):
                # A copy keeps the type and what it carries (a defaultdict's factory, attributes);
                # its items are its own (a UserDict copies its data).
                out = copy.copy(obj)
                for k, v in moved.items():
                    out[k] = v
                return out
            return type(obj)(moved)  # a copy of any other mapping may share its storage
        except Exception:  # an immutable, or otherwise built, mapping: its items as a dict
            return moved
    return obj  # ints, strings, None...: left as they are


def to_device(obj: Any, device: Any, *, non_blocking: Optional[bool] = None) -> Any:
    """Move every tensor in ``obj`` (nested tuples, namedtuples, lists, dicts and other
    mappings, whose type is kept; a ``PackedSequence`` as its ``.to`` does) to ``device``.

    Records the bytes moved, the copy time (``trainkit/h2d_ms``; CUDA events on a GPU, since an
    asynchronous copy returns at once), the bandwidth (``trainkit/h2d_GBps``) and the pinned share.

    Args:
        obj: a tensor or a nested structure of them; other leaves are returned unchanged.
        device: target device, e.g. ``"cuda"``.
        non_blocking: None (default) copies asynchronously exactly when the source is pinned.

    Example::

        for x, y in loader:
            x, y = tk.to_device((x, y), "cuda")
    """
    dev = _device(device)
    if dev.type == "cuda" and dev.index is None and timing.cuda_in_use():
        import torch

        dev = torch.device("cuda", torch.cuda.current_device())  # what tensors on it report
    if non_blocking is not None and not isinstance(non_blocking, bool):
        raise TypeError(f"to_device(non_blocking={non_blocking!r}): must be True, False or None "
                        f"(None: asynchronous exactly when the source is pinned)")
    s = _active_session()
    if s is None:
        return _move(obj, dev, non_blocking, [0, 0])
    gpu = timing.cuda_in_use() and dev.type == "cuda"
    ev0 = timing.cuda_event() if gpu else None
    t0 = timing.now()
    acc = [0, 0]
    if profiler_enabled():  # the copies show as a named range in traces
        with record_function("trainkit/to_device"):
            out = _move(obj, dev, non_blocking, acc)
    else:
        out = _move(obj, dev, non_blocking, acc)
    if acc[0]:
        elapsed: Any = (timing.PendingInterval(ev0, timing.cuda_event()) if gpu
                        else (timing.now() - t0) * 1e3)
        s.record(H2D_MS, elapsed)
        s.record(H2D_BYTES, float(acc[0]))
        s.record(H2D_PINNED_BYTES, float(acc[1]))
    elif ev0 is not None:
        timing._give_back(ev0)
    return out


class ItemsCounter:
    """``counter(batch)``: the items in a batch (the first dimension of its first tensor) or None.

    Batches of one loader share a structure, so after the first one the count is an index or two
    and a type check, not a walk. ``first`` tells that the tensor is ``batch[0]`` of a tuple or
    list batch, which the patched loader then reads inline (this runs once per batch).
    """

    __slots__ = ("tensor", "path", "first")

    def __init__(self) -> None:
        import torch

        self.tensor = torch.Tensor
        self.path: Optional[List[Any]] = None
        self.first = False

    def __call__(self, batch: Any) -> Optional[int]:
        if self.path is not None:
            node = batch
            try:
                for key in self.path:
                    node = node[key]
            except (KeyError, IndexError, TypeError):
                node = None
            if isinstance(node, self.tensor):
                return int(node.shape[0]) if node.dim() > 0 else 1
        found = _find_tensor(batch, [])
        if found is None:
            return None
        self.path = found
        self.first = found == [0] and isinstance(batch, (tuple, list))
        return self(batch)


def _find_tensor(obj: Any, path: List[Any]) -> Optional[List[Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        return path
    items: Any = ()
    if isinstance(obj, (tuple, list)):
        items = enumerate(obj)
    elif isinstance(obj, Mapping):
        items = obj.items()
    for key, value in items:
        found = _find_tensor(value, path + [key])
        if found is not None:
            return found
    return None
