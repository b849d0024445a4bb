"""What a patched ``DataLoader`` is: its settings, recorded once per session, and its passes.

``trainkit analyze`` fits its data-loading advice (TA101) to the loader that fed the steps: no
workers, workers started again each epoch, too few workers. So when a patched loader that is (or
wraps) a ``torch.utils.data.DataLoader`` begins its first pass in a session, its settings go
into the run as a JSON text summary under ``trainkit/meta/loader/<i>`` (``i``: the session's
patched DataLoaders, numbered in the order of their first pass; TensorBoard's Text tab shows
it), and each pass that begins records ``trainkit/loader/<i>/passes`` (the passes begun so far)
under the step its first batch feeds. Both are written once per pass, before its first batch:
nothing is added per batch. A plain iterable (a list, a generator) records neither.
"""
from __future__ import annotations

import json
import weakref
from typing import Any, Dict, Optional

from ._tags import PASSES, PREFIX

#: ``trainkit/meta/loader/<i>``: the JSON settings of a session's ``i``-th patched DataLoader.
META_LOADER = PREFIX + "meta/loader/"

# Where wrappers keep the loader they iterate: accelerate's DataLoaderShard/Dispatcher
# (``base_dataloader``, recent versions; older ones subclass DataLoader), tqdm (``iterable``).
_INNER = ("base_dataloader", "dataloader", "data_loader", "loader", "_loader", "iterable")
_NONE: tuple = ()  # cached on a patched loader whose source holds no DataLoader


def find_dataloader(obj: Any, depth: int = 4) -> Any:
    """The ``torch.utils.data.DataLoader`` that ``obj`` is or wraps (``depth`` wrappers deep),
    or None. Wrappers are looked into through their instance attributes only (no
    ``__getattr__`` runs, nothing is imported: accelerate need not be installed). A patched
    loader in a wrapper is not (a DataLoader to isinstance): its own pass records its loader."""
    from torch.utils.data import DataLoader

    from .loader import PatchedLoader

    for _ in range(depth + 1):
        if isinstance(obj, PatchedLoader):
            return None
        d = getattr(obj, "__dict__", None)
        d = d if isinstance(d, dict) else {}
        inner = d.get("base_dataloader")
        if isinstance(inner, DataLoader):  # accelerate's adapter: its __class__ is the inner one's
            return inner
        if isinstance(obj, DataLoader):
            return obj
        obj = next((d[k] for k in _INNER if d.get(k) is not None), None)
        if obj is None:
            return None
    return None


def settings(dl: Any, *, role: str) -> Dict[str, Any]:
    """The DataLoader's settings that data-loading advice depends on (JSON-ready)."""
    import torch

    def num(v: Any) -> Optional[int]:
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    workers = num(getattr(dl, "num_workers", 0)) or 0
    dataset = getattr(dl, "dataset", None)
    return {
        "type": type(dl).__name__,
        "role": role,
        "dataset": type(dataset).__name__,
        # its samples are tensors indexed in memory (no file read or decode a sample): workers
        # only move that indexing to another process and hand each batch back
        "in_memory": _in_memory(dataset),
        "num_workers": workers,
        "persistent_workers": bool(getattr(dl, "persistent_workers", False)),
        "pin_memory": bool(getattr(dl, "pin_memory", False)),
        # torch keeps 2 when it is left unset with workers (None without: nothing to prefetch)
        "prefetch_factor": num(getattr(dl, "prefetch_factor", None)) if workers else None,
        # given a batch_sampler (as accelerate builds its inner loader), DataLoader says None
        "batch_size": num(getattr(dl, "batch_size", None))
        or num(getattr(getattr(dl, "batch_sampler", None), "batch_size", None)),
        "cuda_available": bool(torch.cuda.is_available()),
    }


def _in_memory(dataset: Any) -> bool:
    """A ``TensorDataset`` (or a ``Subset`` of one, a few deep, as random_split makes)."""
    from torch.utils.data import Subset, TensorDataset

    for _ in range(4):
        if isinstance(dataset, TensorDataset):
            return True
        if not isinstance(dataset, Subset):
            return False
        dataset = dataset.dataset
    return False


def begin_pass(s: Any, patched: Any) -> None:
    """A pass over the patched loader ``patched`` begins in session ``s`` (once per pass): its
    settings are recorded at its session's first pass, and the pass under the step in progress."""
    d = patched.__dict__
    found = d.get("_dataloader")
    if found is None:  # looked up once per patched loader
        dl = find_dataloader(patched.source)
        found = d["_dataloader"] = _NONE if dl is None else (dl,)
    if found is _NONE:
        return
    loaders = s._loaders
    original = patched.original
    key = id(original)  # one loader patched again each epoch is still one loader
    entry = loaders.get(key)
    if entry is None or (entry[1] is not None and entry[1]() is not original):
        from torch import is_grad_enabled

        # Not kept alive by the session: a loader the user drops (one made anew each epoch,
        # with persistent workers) shuts its workers down then, not when the session is
        # collected (a DataLoader iterator freed by the GC waits seconds for its workers).
        try:
            ref: Any = weakref.ref(original)
        except TypeError:  # no weak references to it: known by its id alone
            ref = None
        entry = loaders[key] = [len(loaders), ref, 0]
        # Its first pass under no_grad: an evaluation (or inference), not the training's loader.
        info = settings(found[0], role="train" if is_grad_enabled() else "eval")
        s._recorder.meta.append((META_LOADER + str(entry[0]), s.step,
                                 json.dumps(info, sort_keys=True)))
    entry[2] += 1
    s._buf.append((PASSES.format(entry[0]), s.step, float(entry[2])))
