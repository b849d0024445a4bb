"""``tk.to_device``: move a batch to the device, asynchronously where that is safe, and time it.

``non_blocking=True`` only overlaps the copy with compute when the source is in pinned (page-locked)
memory; from pageable memory the driver stages it through a pinned buffer anyway. So the default
copies non-blocking exactly when the source is pinned, and records how many bytes were pageable:
that share is what ``tk.analyze`` reports as "pageable host-to-device copies".
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import types
from collections.abc import Mapping
from typing import Any, List, Optional, Tuple

from ..session import active as _active_session
from .. import timing
from ..profiling import regions
from ..profiling.regions import profiler_enabled, record_function
from ..recorder import H2D_BYTES, H2D_MS, H2D_PINNED_BYTES
from ._transfer_own import move_itself, tensor_nbytes


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


def _explain_no_such_gpu(exc: BaseException, device: Any, dev: Any) -> None:
    """After a copy to ``dev`` failed with ``exc``: where ``dev`` is a CUDA device this machine
    does not have, raise a ValueError that repeats ``device`` and shows the fix (torch's own words,
    "Found no NVIDIA driver", repeat neither), caused by ``exc``; else return (``exc`` goes on)."""
    if dev.type != "cuda":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"to_device(..., device={device!r}): this machine has no CUDA GPU "
                         f"(torch.cuda.is_available() is False); pass a device it has, e.g. "
                         f"device = 'cuda' if torch.cuda.is_available() else 'cpu'") from exc
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"to_device(..., device={device!r}): this machine has {count} CUDA "
                         f"GPU(s), cuda:0 to cuda:{count - 1}; pass one of them, e.g. "
                         f"device='cuda:0'") from exc


_REFUSED: Any = None


def _refused_types() -> Any:
    """What ``to_device`` refuses: a model, and a loader (a DataLoader, a patched loader, a
    generator), which it would return where they are, unmoved, without a word."""
    global _REFUSED
    if _REFUSED is None:
        import types

        import torch
        from torch.utils.data import DataLoader

        from ..loader import PatchedLoader

        _REFUSED = (torch.nn.Module, DataLoader, PatchedLoader, types.GeneratorType)
    return _REFUSED


def _refuse(obj: Any) -> None:
    import torch

    name = type(obj).__name__
    if isinstance(obj, torch.nn.Module):
        raise TypeError(f"to_device({name}(...), ...): a model; tk.to_device moves "
                        f"batches (tensors in tuples, lists, dicts, dataclasses) and would return "
                        f"the model where it is. Move it once with model.to(device), before "
                        f"creating the optimizer")
    raise TypeError(f"to_device(<{name}>, ...): a loader, not a batch; tk.to_device moves one "
                    f"batch (tensors in tuples, lists, dicts, dataclasses) and would return the "
                    f"loader as it is, its batches left where they are. Move each batch in the "
                    f"loop: for x, y in loader: x, y = tk.to_device((x, y), device)")


def _move(obj: Any, device: Any, non_blocking: Optional[bool], acc: list) -> Any:
    """``obj`` with its tensors on ``device``; ``acc`` adds up [bytes from the host, pinned ones].

    A tensor met twice (``(x, x)``, one tensor under two keys) is copied once and the copy reused:
    the result keeps the aliasing and its bytes count once. Only the same object is reused, by
    identity; two views of one storage are two tensors, as they would be to ``.to()``.
    """
    return _walk(obj, device, non_blocking, acc, {})


def _walk(obj: Any, device: Any, non_blocking: Optional[bool], acc: Optional[list],
          moved: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        here = obj.device
        if here == device or (device.index is None and here.type == device.type):
            return obj  # already there ("cuda" is resolved to the current device before)
        if acc is None:  # in code dynamo traces (_move_traced)
            return _copy_traced(obj, here, device, non_blocking, moved)
        seen = moved.get(id(obj))
        if seen is not None:  # the source is kept beside its copy: its id is not reused meanwhile
            return seen[1]
        pinned = here.type == "cpu" and obj.is_pinned()
        nb = pinned if non_blocking is None else non_blocking
        # Host to device: what h2d_* measure (not device to host, nor "cpu" to "cpu:0", a copy)
        if here.type == "cpu" and device.type != "cpu":
            nbytes = tensor_nbytes(obj)
            acc[0] += nbytes
            if pinned:
                acc[1] += nbytes
        out = obj.to(device, non_blocking=nb)
        moved[id(obj)] = (obj, out)
        return out
    if isinstance(obj, torch.nn.utils.rnn.PackedSequence):  # its batch_sizes stay on the CPU
        return type(obj)(_walk(obj.data, device, non_blocking, acc, moved), obj.batch_sizes,
                         _walk(obj.sorted_indices, device, non_blocking, acc, moved),
                         _walk(obj.unsorted_indices, device, non_blocking, acc, moved))
    if isinstance(obj, tuple):
        items = [_walk(v, device, non_blocking, acc, moved) for v in obj]
        if type(obj) is tuple:
            return tuple(items)
        try:  # a namedtuple, or another tuple subclass, keeps its type
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        except Exception:  # one built otherwise (its own __new__): its items as a tuple
            return tuple(items)
    if isinstance(obj, list):
        items = [_walk(v, device, non_blocking, acc, moved) for v in obj]
        if type(obj) is list:
            return items
        try:
            return type(obj)(items)  # a list subclass keeps its type
        except Exception:  # one built otherwise: its items as a list
            return items
    if isinstance(obj, (collections.deque, collections.UserList, types.SimpleNamespace)):
        return _walk_stdlib(obj, device, non_blocking, acc, moved)  # returned unmoved before
    if isinstance(obj, Mapping) and not isinstance(obj, (dict, collections.UserDict)) \
            and callable(getattr(type(obj), "to", None)):
        return _move_itself(obj, device, non_blocking, acc, moved)  # a TensorDict: built otherwise
    if isinstance(obj, Mapping):  # dicts, and the like (a UserDict, e.g. a tokenizer's batch)
        values = {k: _walk(v, device, non_blocking, acc, moved) for k, v in obj.items()}
        if type(obj) is dict:
            return values
        try:
            if isinstance(obj, (dict, collections.UserDict)):
                # A copy keeps the type and what it carries (a defaultdict's factory, attributes);
                # its items are its own (a UserDict copies its data).
                out = copy.copy(obj)
                for k, v in values.items():
                    out[k] = v
                return out
            return type(obj)(values)  # a copy of any other mapping may share its storage
        except Exception:  # an immutable, or otherwise built, mapping: its items as a dict
            return values
    if isinstance(obj, (int, float, complex, str, bytes, type(None))):
        return obj  # the usual leaves, before hasattr(cls, ...), which dynamo (torch 2.3) fails on
    if isinstance(obj, (set, frozenset)):  # tensors hash by identity: a set may hold them
        return _walk_stdlib(obj, device, non_blocking, acc, moved)  # returned unmoved before
    cls = type(obj)
    if isinstance(obj, type):
        return obj  # a class (a dataclass itself, a tensor type) is no batch
    if callable(getattr(cls, "to", None)):
        # One with a .to() of its own (a PyTorch Geometric graph, a TensorDict) moves itself:
        # what it moves is its business. It was returned where it was, without a word (a model
        # in a batch still is: moving it in place would be a side effect nobody asked for).
        if isinstance(obj, torch.nn.Module):
            return obj
        return _move_itself(obj, device, non_blocking, acc, moved)
    if hasattr(cls, "__dataclass_fields__"):  # a dataclass instance
        return _walk_dataclass(obj, device, non_blocking, acc, moved)
    return obj  # ints, strings, None...: left as they are


def _move_traced(obj: Any, device: Any, non_blocking: Optional[bool]) -> Any:
    """``_move`` for code that ``torch.compile`` traces: the same structures moved, with ops
    dynamo keeps in its graph. Nothing is counted or timed (the copies are part of the compiled
    call), and a tensor met twice is found by identity, not by ``id()``, on which dynamo would
    guard: every new batch would recompile."""
    return _walk(obj, device, non_blocking, None, [])


def _copy_traced(obj: Any, here: Any, device: Any, non_blocking: Optional[bool],
                 moved: List[Tuple[Any, Any]]) -> Any:
    for source, copied in moved:
        if source is obj:
            return copied
    if non_blocking is None:
        # Whether the source is pinned cannot be asked in a graph (is_pinned() breaks it). A
        # host-to-GPU copy may always be asynchronous: from pageable memory CUDA stages it, and
        # the call returns once the source was read. Other directions stay synchronous.
        non_blocking = here.type == "cpu" and device.type == "cuda"
    out = obj.to(device, non_blocking=non_blocking)
    moved.append((obj, out))
    return out


def _walk_stdlib(obj: Any, device: Any, non_blocking: Optional[bool], acc: Optional[list],
                 moved: Any) -> Any:
    """A deque (its ``maxlen`` kept), a ``UserList``, a ``SimpleNamespace`` or a set, as a copy
    that keeps its type and attributes, with its items moved."""
    if isinstance(obj, (set, frozenset)):
        items = [_walk(v, device, non_blocking, acc, moved) for v in obj]
        try:
            return type(obj)(items)
        except Exception:  # a subclass built otherwise: its items as a set (or frozenset)
            return (frozenset if isinstance(obj, frozenset) else set)(items)
    if isinstance(obj, collections.deque):
        items = [_walk(v, device, non_blocking, acc, moved) for v in obj]
        try:
            return type(obj)(items, obj.maxlen)
        except Exception:  # a subclass built otherwise: its items as a deque
            return collections.deque(items, obj.maxlen)
    out = copy.copy(obj)
    if isinstance(obj, collections.UserList):
        out.data = [_walk(v, device, non_blocking, acc, moved) for v in obj.data]
    else:
        for k, v in vars(obj).items():
            setattr(out, k, _walk(v, device, non_blocking, acc, moved))
    return out


def _move_itself(obj: Any, device: Any, non_blocking: Optional[bool], acc: Optional[list],
                 moved: Any) -> Any:
    """``obj`` moved by its own ``.to()``, once however often the batch holds it."""
    seen = moved.get(id(obj)) if acc is not None else None
    if seen is not None:
        return seen[1]
    out = move_itself(obj, device, non_blocking, acc)
    if acc is not None:
        moved[id(obj)] = (obj, out)
    return out


def _walk_dataclass(obj: Any, device: Any, non_blocking: Optional[bool], acc: Optional[list],
                    moved: Any) -> Any:
    """A shallow copy of the dataclass ``obj`` with its fields moved, or ``obj`` if none changed.

    A copy, not ``dataclasses.replace``: that would run ``__init__`` and ``__post_init__`` again
    and cannot set fields with ``init=False``; the copy keeps those and any other attribute, and
    ``object.__setattr__`` sets the fields of a frozen dataclass too.
    """
    values = {}
    for field in dataclasses.fields(obj):
        try:
            value = getattr(obj, field.name)
        except AttributeError:  # an init=False field without a default, never set
            continue
        out = _walk(value, device, non_blocking, acc, moved)
        if out is not value:
            values[field.name] = out
    if not values:
        return obj
    copied = _shallow_copy(obj)
    for name, value in values.items():
        object.__setattr__(copied, name, value)
    return copied


def _shallow_copy(obj: Any) -> Any:
    """``copy.copy(obj)``; for a frozen dataclass with ``__slots__`` written by hand (Python
    3.9's only way; ``slots=True`` adds a ``__setstate__`` that copy can use), whose slots copy
    would set with the ``setattr`` frozen refuses, a copy made with ``object.__setattr__``."""
    try:
        return copy.copy(obj)
    except dataclasses.FrozenInstanceError:
        pass
    cls = type(obj)
    copied = cls.__new__(cls)
    names = [name for klass in cls.__mro__ for name in _slot_names(klass)]
    names += list(getattr(obj, "__dict__", ()))
    for name in names:
        try:
            object.__setattr__(copied, name, getattr(obj, name))
        except AttributeError:  # a slot never set stays unset
            pass
    return copied


def _slot_names(klass: type) -> List[str]:
    slots = klass.__dict__.get("__slots__", ())
    names = [slots] if isinstance(slots, str) else list(slots)
    return [f"_{klass.__name__.lstrip('_')}{n}" if n.startswith("__") and not n.endswith("__")
            else n for n in names if n not in ("__dict__", "__weakref__")]  # __x: mangled


def to_device(obj: Any, device: Any, *, non_blocking: Optional[bool] = None) -> Any:
    """Move every tensor in ``obj`` (nested tuples, namedtuples, lists, dicts and other
    mappings, deques, ``UserList``s, ``SimpleNamespace``s, sets and dataclasses, whose type is
    kept; a ``PackedSequence`` as its ``.to`` does; any other object with a ``.to()`` of its
    own, a PyTorch Geometric graph or a TensorDict, through that) to ``device``. A tensor found
    twice is copied once, and both places get that copy.

    Records the bytes moved, the copy time (``trainkit/h2d_ms``; CUDA events on a GPU, since an
    asynchronous copy returns at once), the bandwidth (``trainkit/h2d_GBps``) and the pinned share.

    Args:
        obj: a tensor or a nested structure of them; other leaves are returned unchanged. A
            model or a loader (a DataLoader, a patched loader, a generator) is refused with a
            ``TypeError``: returned unmoved, its tensors would stay where they are.
        device: target device, e.g. ``"cuda"``.
        non_blocking: None (default) copies asynchronously exactly when the source is pinned.

    Example::

        for x, y in loader:
            x, y = tk.to_device((x, y), "cuda")
    """
    dev = _device(device)
    if non_blocking is not None and not isinstance(non_blocking, bool):
        raise TypeError(f"to_device(non_blocking={non_blocking!r}): must be True, False or None "
                        f"(None: asynchronous exactly when the source is pinned)")
    if regions._compiling():
        # In code torch.compile traces (a compiled train step): the copies are ops of its graph.
        # Timing them would break the graph around every copy, and recording from inside it
        # crashed dynamo (the buffer the writer thread empties); time the compiled call instead.
        return _move_traced(obj, dev, non_blocking)
    if isinstance(obj, _refused_types()):  # not in traced code: a global read is a guard
        _refuse(obj)
    if dev.type == "cuda":
        import torch

        if not timing.cuda_in_use():
            # The first copy to a GPU starts CUDA (seconds): done before the copy is timed, so
            # that it times the copy, with CUDA events, and not the start-up on the host clock.
            try:
                torch.cuda.init()
            except (RuntimeError, AssertionError):  # no GPU: a tensor's copy says so (torch's
                pass  # own error); a batch without tensors is returned as it is
        if dev.index is None and timing.cuda_in_use():
            dev = torch.device("cuda", torch.cuda.current_device())  # what tensors on it report
    s = _active_session()
    if s is None:
        try:
            return _move(obj, dev, non_blocking, [0, 0])
        except (RuntimeError, AssertionError) as exc:
            _explain_no_such_gpu(exc, device, dev)
            raise
    gpu = timing.cuda_in_use() and dev.type == "cuda"
    if gpu and s._cuda_device is None:  # where the steps run, until an optimizer's step says
        s._cuda_device = dev.index
    ev0 = timing.cuda_event(dev.index) if gpu else None  # the copies run on its stream
    t0 = timing.now()
    acc = [0, 0]
    try:
        if profiler_enabled():  # the copies show as a named range in traces
            with record_function("trainkit/to_device"):
                out = _move(obj, dev, non_blocking, acc)
        else:
            out = _move(obj, dev, non_blocking, acc)
    except (RuntimeError, AssertionError) as exc:  # nothing recorded yet: the session goes on
        _explain_no_such_gpu(exc, device, dev)
        raise
    if acc[0]:
        elapsed: Any = (timing.PendingInterval(ev0, timing.cuda_event(dev.index)) if gpu
                        else (timing.now() - t0) * 1e3)
        s.record(H2D_MS, elapsed)
        s.record(H2D_BYTES, float(acc[0]))
        s.record(H2D_PINNED_BYTES, float(acc[1]))
    elif ev0 is not None:
        timing._give_back(ev0)
    return out
