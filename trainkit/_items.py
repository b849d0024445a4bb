"""The items in a batch (the first dimension of its first tensor), for a patched loader's
``trainkit/samples_per_s``: found by a walk on the first batch, then read by its path."""
from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Iterator, List, Optional, Tuple


class ItemsCounter:
    """``counter(batch)``: the items in a batch (the first dimension of its first tensor that has
    one, in tuples, lists, deques, ``UserList``, mappings, dataclasses and ``SimpleNamespace``; 1
    for a batch of 0-d tensors only) or None for a batch without tensors. A ``PackedSequence``
    counts its sequences (``batch_sizes[0]``), not the time steps of all of them that its data's
    first dimension holds.

    A 0-d tensor (a step index, a scalar target) is no count of items, so it is passed over.
    A batch of per-sample records, not collated into tensors, is counted by its records: a list
    of dicts with the same keys (``collate_fn=lambda b: b``), or the column of such dicts of a
    detection batch (``collate_fn=lambda b: tuple(zip(*b))``: a tuple of images and a tuple of
    target dicts), where the first tensor, an image, has the channels as its first dimension.
    Batches of one loader share a structure, so after the first one the count is an index or two
    and a type check, not a walk. ``first`` tells that the tensor is ``batch[0]`` of a tuple or
    list batch, with a dimension, which the patched loader then reads inline (this runs once
    per batch).
    """

    __slots__ = ("tensor", "path", "first", "records")

    def __init__(self) -> None:
        import torch

        self.tensor = torch.Tensor
        self.path: Optional[List[Any]] = None
        self.first = False
        #: where the batch's sequence of per-sample records is (``[]``: the batch itself, ``[k]``:
        #: its element k), once found; None: not looked for yet, or none
        self.records: Optional[List[Any]] = None

    def __call__(self, batch: Any) -> Optional[int]:
        if self.records is not None:
            node = batch[self.records[0]] if self.records else batch
            if isinstance(node, (tuple, list)) and node and isinstance(node[0], Mapping):
                return len(node)
            self.records = None
        if self.path is None:  # the first batch (or one that changed its shape): records?
            self.records = _records_at(batch)
            if self.records is not None:
                node = batch[self.records[0]] if self.records else batch
                return len(node)
        if self.path is not None:
            node = batch
            try:
                for key in self.path:
                    if isinstance(node, self.tensor):  # a leaf: this batch has another shape
                        node = None
                        break
                    node = getattr(node, key) if key.__class__ is _Field else node[key]
            except (KeyError, IndexError, TypeError, AttributeError):
                node = None
            if isinstance(node, self.tensor) and node.dim() > 0:
                return int(node.size(0))  # a strided nested tensor has no .shape
            if isinstance(node, _packed()):
                return _sequences(node)
        found = _find_tensor(batch)
        if found is None:
            return None
        self.path, tensor = found
        if isinstance(tensor, _packed()):
            self.first = False
            return _sequences(tensor)
        if tensor.dim() == 0:  # only 0-d tensors: walked again next time, a batch may differ
            self.first = False
            return 1
        # (the loader reads .shape inline, which a strided nested tensor does not have)
        self.first = (self.path == [0] and isinstance(batch, (tuple, list))
                      and not tensor.is_nested)
        return int(tensor.size(0))


def _records_at(batch: Any) -> Optional[List[Any]]:
    """Where ``batch`` holds a sequence of per-sample records (dicts with the same keys, holding
    tensors): ``[]`` when it is one (two records at least: a list of one dict may be a collated
    batch), ``[k]`` when its element ``k`` is one and every element is a sequence (the columns
    of ``tuple(zip(*samples))``); else None."""
    if not isinstance(batch, (tuple, list)) or not batch:
        return None
    if _is_records(batch, 2):
        return []
    if all(isinstance(col, (tuple, list)) for col in batch):
        for k, col in enumerate(batch):
            if _is_records(col, 1):
                return [k]
    return None


def _is_records(seq: Any, least: int) -> bool:
    if not isinstance(seq, (tuple, list)) or len(seq) < least:
        return False
    first = seq[0]
    if not isinstance(first, Mapping) or _find_tensor(first) is None:
        return False
    keys = set(first)
    return all(isinstance(r, Mapping) and set(r) == keys for r in seq)


def _packed() -> type:
    import torch

    return torch.nn.utils.rnn.PackedSequence


def _sequences(packed: Any) -> int:
    """The sequences in a ``PackedSequence``: its first time step holds one item of each."""
    sizes = packed.batch_sizes
    return int(sizes[0]) if sizes.numel() else 0


def _find_tensor(batch: Any) -> Optional[Tuple[List[Any], Any]]:
    """The path to, and the tensor of, the first tensor in ``batch`` with a dimension (or
    ``PackedSequence``), else of its first 0-d tensor; None when it holds no tensor."""
    zero_d = None
    packed = _packed()
    for path, tensor in _tensors(batch, []):
        if isinstance(tensor, packed) or tensor.dim() > 0:
            return path, tensor
        if zero_d is None:
            zero_d = path, tensor
    return zero_d


class _Field(str):
    """A path key that is a dataclass field's (or a ``SimpleNamespace``'s) name, read with
    ``getattr`` (a dict's, with [])."""


_SEQUENCES = (tuple, list, collections.deque, collections.UserList)


def _tensors(obj: Any, path: List[Any]) -> Iterator[Tuple[List[Any], Any]]:
    import torch

    if isinstance(obj, (torch.Tensor, torch.nn.utils.rnn.PackedSequence)):  # (a tuple subclass)
        yield path, obj
        return
    items: Any = ()
    if isinstance(obj, _SEQUENCES):  # the sequences to_device moves, read by index
        items = enumerate(obj)
    elif isinstance(obj, Mapping):
        items = obj.items()
    elif hasattr(type(obj), "__dataclass_fields__") and not isinstance(obj, type):
        # A dataclass batch, which to_device moves: its fields in order (one never set passed over)
        items = [(_Field(f.name), getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    elif isinstance(obj, types.SimpleNamespace):  # to_device moves it too: its attributes
        items = [(_Field(k), v) for k, v in vars(obj).items()]
    for key, value in items:
        yield from _tensors(value, path + [key])
