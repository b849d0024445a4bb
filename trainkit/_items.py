"""The items in a batch (the first dimension of its first tensor), for a patched loader's
``trainkit/samples_per_s``: found by a walk on the first batch, then read by its path."""
from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Iterator, List, Optional, Tuple

from . import _items_other


class ItemsCounter:
    """``counter(batch)``: the items in a batch (the first dimension of its first tensor that has
    one, in tuples, lists, deques, ``UserList``, mappings, dataclasses and ``SimpleNamespace``; 1
    for a batch of 0-d tensors only) or None for a batch without tensors. A ``PackedSequence``
    counts its sequences (``batch_sizes[0]``), not the time steps of all of them that its data's
    first dimension holds. An empty batch (a first tensor of size 0) is 0 items, which its step
    records: a samples/s of 0 (:func:`trainkit._steps.derive`), not a point left out. A batch
    with no tensor is counted by its first numpy array with a dimension (a ``collate_fn`` that
    returns numpy), or its first list or tuple of strings (text left uncollated), found in the
    same order (:mod:`trainkit._items_other`); else None.

    A 0-d tensor (a step index, a scalar target) is no count of items, so it is passed over.
    A batch of per-sample records, not collated into tensors, is counted by its records: a list
    of dicts with the same keys (``collate_fn=lambda b: b``), or the column of such dicts of a
    detection batch (``collate_fn=lambda b: tuple(zip(*b))``: a tuple of images and a tuple of
    target dicts), where the first tensor, an image, has the channels as its first dimension.

    A first tensor in a list (or tuple) of tensors of one rank, inside the batch, is of either
    the batch's views, each batched (a multi-crop's ``([crops_a, crops_b], labels)``, each crop
    (B, 3, H, W)): their first dimension, B, counts; or its unbatched samples (``([img] * 8,
    labels)`` of variable-size images, each (3, H, W), from ``tuple(zip(*b))`` or a custom
    collate): the list's length counts. The first batch gathers the evidence from all of the
    list's siblings, so their order does not matter, then decides, the first rule that holds:

    1. Tensors beside the list (not themselves in a list of tensors) with the list's length,
       and none with B instead: samples, counted by such a tensor (right either way when B is
       the list's length too).
    2. None of either, and 1-d ones (labels) of one other length: that length, counted by one
       of them; the list is neither, e.g. a sample's segments (``([[seg, seg]] * 8,
       labels)``) or time-major views, each (T_i, B, D).
    3. Tensors in the list whose first dimensions differ: samples (the views of a batch share
       B).
    4. Tensors beside with B, and none with the list's length: views.
    5. Else the sequences beside the list, in its container, as long as it: a list of per-view
       targets (each (B, ...) and not sample-shaped: of a lower rank, as RotNet's (B,)
       rotation per view, or of one shape where the list's shapes vary) tells views; any
       other (file names, ints, boxes of their own sizes, a denoiser's clean images beside its
       noisy ones, each (3, H_i, W_i)) tells samples; both, or none, tell nothing.

    With no evidence (``{"images": [img] * 8}`` alone) the first tensor's first dimension
    counts, as for any batch; so does a batch that is itself a list of tensors, which is a
    collated ``(inputs, targets, ...)``.

    Batches of one loader share a structure, so after the first one the count is an index or two
    and a type check, not a walk. ``first`` tells that the tensor is ``batch[0]`` of a tuple or
    list batch, with a dimension, which the patched loader then reads inline (this runs once
    per batch).
    """

    __slots__ = ("tensor", "path", "first", "records", "element", "other")

    def __init__(self) -> None:
        import torch

        self.tensor = torch.Tensor
        self.path: Optional[List[Any]] = None
        self.first = False
        #: where the batch's sequence of per-sample records or unbatched samples is (``[]``: the
        #: batch itself, ``[k]``: its element k, deeper for a list of samples), once found;
        #: None: not looked for yet, or none. Its length counts while its first element is an
        #: ``element`` (a Mapping: records; a tensor: samples).
        self.records: Optional[List[Any]] = None
        self.element: type = Mapping
        #: what ``path`` leads to in a batch without tensors (``numpy.ndarray``, or ``str`` for
        #: a list of strings); None: to a tensor
        self.other: Optional[type] = None

    def __call__(self, batch: Any) -> Optional[int]:
        if self.records is not None:
            node = batch  # (_at inline: this runs once per batch)
            try:
                for key in self.records:
                    node = getattr(node, key) if key.__class__ is _Field else node[key]
            except (KeyError, IndexError, TypeError, AttributeError):
                node = None
            if isinstance(node, (tuple, list)) and node and isinstance(node[0], self.element):
                return len(node)
            self.records = None
        if self.path is None:  # the first batch (or one that changed its shape): records?
            self.records = _records_at(batch)
            if self.records is not None:
                self.element = Mapping
                return len(_at(batch, self.records))
        if self.path is not None:
            node, other = batch, self.other
            try:
                for key in self.path:
                    # a leaf above the path (a tensor; an array or strings where the path leads
                    # to those, whose row or character would count): this batch has another shape
                    if isinstance(node, self.tensor) or (other is not None
                                                         and isinstance(node, other)):
                        node = None
                        break
                    node = getattr(node, key) if key.__class__ is _Field else node[key]
            except (KeyError, IndexError, TypeError, AttributeError):
                node = None
            if isinstance(node, self.tensor) and node.dim() > 0:
                return int(node.size(0))  # a strided nested tensor has no .shape
            if isinstance(node, _packed()):
                return _sequences(node)
            if other is not None:  # a batch without tensors (read after the tensor's)
                n = _items_other.count(node, other)
                if n is not None:
                    return n
        found = _find_tensor(batch)
        if found is None:  # numpy arrays, or strings?
            other = _items_other.find(batch, _children)
            if other is None:
                return None
            self.path, self.other, n = other
            self.first = False
            return n
        if isinstance(found[1], self.tensor) and found[1].dim() > 0:
            read = _samples_or_views(batch, *found)
            if read is not None and read[0]:  # unbatched samples: the list's length counts
                self.records, self.element = read[1], self.tensor
                self.path, self.first = None, False
                return len(read[2])
            if read is not None:  # a tensor beside the list, as long as it
                found = read[1], read[2]
        self.path, tensor = found
        self.other = None
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


def _at(batch: Any, path: List[Any]) -> Any:
    """The node at ``path`` in ``batch``, or None where this batch has no such node."""
    node = batch
    try:
        for key in path:
            node = getattr(node, key) if key.__class__ is _Field else node[key]
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return node


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


def _samples_or_views(batch: Any, path: List[Any], tensor: Any
                      ) -> Optional[Tuple[bool, List[Any], Any]]:
    """For the first tensor of ``batch`` (at ``path``) in a list of tensors of one rank inside
    the batch: ``(True, the list's path, the list)`` when the list holds unbatched samples,
    ``(False, path, tensor)`` of a tensor beside it that counts the batch; None when the first
    tensor's first dimension counts (views, or nothing tells). The rule is ItemsCounter's
    docstring's: all the evidence is gathered first, so the siblings' order does not matter.
    This runs on the first batch only."""
    if len(path) < 2:  # the batch itself is the list: a collated (inputs, targets, ...)
        return None
    where = path[:-1]
    column = _at(batch, where)
    if not _is_column(column):
        return None
    k, d = len(column), int(tensor.size(0))
    packed = _packed()
    as_long: List[Tuple[List[Any], Any]] = []  # tensors beside with the list's length
    as_views = False  # a tensor beside with the views' first dimension (not the list's length)
    labels: List[Tuple[List[Any], Any]] = []  # 1-d tensors beside with another length
    for other_path, other in _tensors(batch, []):
        if other_path[:len(where)] == where:
            continue
        if isinstance(other, packed):
            n = _sequences(other)
        elif other.dim() == 0:
            continue
        else:
            n = int(other.size(0))
        if _is_column(_at(batch, other_path[:-1])):
            continue  # in a list of tensors: a sibling sequence, weighed below
        if n == k:  # (k == d too: this tensor's count is right under either reading)
            as_long.append((other_path, other))
        elif n == d:
            as_views = True
        elif not isinstance(other, packed) and other.dim() == 1:
            labels.append((other_path, other))
    if as_long and not as_views:
        return False, *as_long[0]
    if not as_long and not as_views and len({int(t.size(0)) for _, t in labels}) == 1:
        return False, *labels[0]  # the list is neither: a sample's segments, time-major views
    if any(int(t.size(0)) != d for t in column):  # (the views of a batch share theirs)
        samples: Optional[bool] = True
    elif as_views and not as_long:
        samples = False
    else:  # no tensor beside, or some of either length: the sequences as long as the list
        says = {_sequence_says(other, column, d) for _, other in _children(_at(batch, where[:-1]))
                if other is not column and isinstance(other, (tuple, list)) and len(other) == k}
        samples = says.pop() if len(says) == 1 else None
    if samples and as_long:
        return False, *as_long[0]
    if samples:
        return True, where, column
    return None


def _sequence_says(other: Any, column: Any, d: int) -> bool:
    """Whether ``other``, a sequence beside ``column`` and as long as it, tells that the column
    holds samples (True: another column of ``tuple(zip(*b))``) or batched views (False: their
    per-view targets, each (B, ...) like the views, and not shaped like them)."""
    if not _is_column(other) or any(int(t.size(0)) != d for t in other):
        return True  # file names, ints, dicts, 0-d tensors, boxes (K_i, 4) of their own sizes
    rank = column[0].dim()
    if other[0].dim() < rank:  # RotNet's (B,) rotation per (B, 3, H, W) view, iBOT's masks
        return False
    # Per-view targets need not follow the views' sizes; a second column of samples (a
    # denoiser's clean images beside its noisy ones) varies as the first does.
    return not (other[0].dim() == rank and _shapes_vary(column) and not _shapes_vary(other))


def _shapes_vary(column: Any) -> bool:
    shape = column[0].shape
    return any(t.shape != shape for t in column)


def _is_column(node: Any) -> bool:
    """``node`` is a non-empty list or tuple of tensors with a dimension, all of one rank."""
    import torch

    if not isinstance(node, (tuple, list)) or not node:
        return False
    rank = node[0].dim() if isinstance(node[0], torch.Tensor) else 0
    return rank > 0 and all(isinstance(t, torch.Tensor) and t.dim() == rank for t in node)


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


def _children(obj: Any) -> Any:
    """``(key, value)`` of a container's elements, the containers to_device moves; () else."""
    if isinstance(obj, _SEQUENCES):  # read by index
        return enumerate(obj)
    if isinstance(obj, Mapping):
        return obj.items()
    if hasattr(type(obj), "__dataclass_fields__") and not isinstance(obj, type):
        # A dataclass batch: its fields in order (one never set passed over)
        return [(_Field(f.name), getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if isinstance(obj, types.SimpleNamespace):  # its attributes
        return [(_Field(k), v) for k, v in vars(obj).items()]
    return ()


def _tensors(obj: Any, path: List[Any]) -> Iterator[Tuple[List[Any], Any]]:
    import torch

    if isinstance(obj, (torch.Tensor, torch.nn.utils.rnn.PackedSequence)):  # (a tuple subclass)
        yield path, obj
        return
    for key, value in _children(obj):
        yield from _tensors(value, path + [key])
