"""The items in a batch that holds no torch tensor, for :class:`trainkit._items.ItemsCounter`:
the first dimension of its first numpy array that has one (a ``collate_fn`` that returns numpy),
or the length of its first list or tuple of strings (text a collate left as it is: a list of
them, or a dict holding one). Found by a walk on the first batch, in the order the first tensor
is looked for; later batches are read at its path (:func:`count`)."""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Tuple


def find(batch: Any, children: Callable[[Any], Any]) -> Optional[Tuple[List[Any], type, int]]:
    """``(path, kind, items)`` of the first such node in ``batch`` (``kind``: ``numpy.ndarray``
    or ``str``), its containers walked by ``children``; None when it holds none. numpy is never
    imported here: a batch that holds arrays has imported it."""
    np = sys.modules.get("numpy")
    return _walk(batch, [], getattr(np, "ndarray", None), children)


def _walk(obj: Any, path: List[Any], ndarray: Any, children: Callable[[Any], Any]
          ) -> Optional[Tuple[List[Any], type, int]]:
    if ndarray is not None and isinstance(obj, ndarray):
        return (path, ndarray, int(obj.shape[0])) if obj.ndim > 0 else None  # 0-d: passed over
    if _is_texts(obj) and all(isinstance(x, str) for x in obj):
        return path, str, len(obj)
    for key, value in children(obj):
        found = _walk(value, path + [key], ndarray, children)
        if found is not None:
            return found
    return None


def _is_texts(obj: Any) -> bool:
    # a list or tuple, not a namedtuple (a record whose fields are strings), of strings
    return (obj.__class__ is list or obj.__class__ is tuple) and bool(obj) and \
        isinstance(obj[0], str)


def count(node: Any, kind: type) -> Optional[int]:
    """The items of ``node``, what a later batch holds at the path :func:`find` gave for a
    ``kind`` (the walk there stops at a ``kind`` above the path, whose row would count), or
    None where it holds none of that kind there (another shape)."""
    if kind is str:
        return len(node) if _is_texts(node) else None
    if isinstance(node, kind) and node.ndim > 0:
        return int(node.shape[0])
    return None
