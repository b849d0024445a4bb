"""The ``pin_memory`` and ``num_workers`` techniques, applied when ``tk.patch(loader)`` runs.

A ``DataLoader`` cannot change these after construction, so when an override asks for a value
other than the loader's, ``tk.patch`` builds an equivalent loader (same dataset, batches,
sampler, collate_fn, worker settings) with the new values; of a DataLoader subclass, a copy with
them (built again as a DataLoader, it would lose what the subclass adds). ``pin_memory`` only
matters when CUDA is available (without it torch warns and ignores it), so it is left as it is
otherwise.
"""
from __future__ import annotations

import inspect
from typing import Any


def rebuild(loader: Any) -> Any:
    """``loader``, or an equivalent DataLoader with the ``pin_memory``/``num_workers`` in force.

    Example::

        with tk.switches.overrides({"num_workers": 0}):
            loader = tk.patch(DataLoader(ds, batch_size=64, num_workers=4))   # now 0 workers
    """
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from .. import switches

    if not isinstance(loader, DataLoader):
        return loader
    workers = switches.technique("num_workers", loader.num_workers)
    pin = switches.technique("pin_memory", loader.pin_memory)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"technique('num_workers') = {workers!r}: must be an int >= 0, e.g. 4")
    pin = bool(pin) if torch.cuda.is_available() else loader.pin_memory
    if workers == loader.num_workers and pin == loader.pin_memory:
        return loader
    if type(loader) is not DataLoader:
        return _resettled(loader, workers, pin)
    kwargs: dict = dict(
        num_workers=workers, pin_memory=pin, collate_fn=loader.collate_fn,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers > 0 else None,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers and workers > 0,
        prefetch_factor=loader.prefetch_factor if workers > 0 else None,
        pin_memory_device=getattr(loader, "pin_memory_device", "") if pin else "",
    )
    if "in_order" in inspect.signature(DataLoader.__init__).parameters:
        kwargs["in_order"] = getattr(loader, "in_order", True)
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:  # auto-batching: the same batch sampler, same order
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    new = DataLoader(loader.dataset, **kwargs)
    if loader.batch_sampler is not None and not isinstance(loader.dataset, IterableDataset):
        # Given a batch_sampler, DataLoader reports batch_size None and drop_last False; the
        # batches come from the same sampler, so report what the user's loader reports.
        # (DataLoader refuses to set these after __init__; its iterators read neither here.)
        object.__setattr__(new, "batch_size", loader.batch_size)
        object.__setattr__(new, "drop_last", loader.drop_last)
        # ...and a default sampler: the user's (a DistributedSampler, whose set_epoch they call
        # each epoch) is what the batch sampler draws from.
        object.__setattr__(new, "sampler", loader.sampler)
    return new


def _resettled(loader: Any, workers: int, pin: bool) -> Any:
    """A copy of the DataLoader subclass ``loader`` with these settings. Built again as a
    DataLoader it lost what the subclass adds (its own ``__iter__``, a StatefulDataLoader's
    state), and its own ``__init__`` takes arguments of its own; a DataLoader reads these
    settings at each ``iter()``, so the copy's are set in place (as DataLoader's checks want)."""
    import copy

    new = copy.copy(loader)
    values = dict(num_workers=workers, pin_memory=pin,
                  persistent_workers=loader.persistent_workers and workers > 0,
                  prefetch_factor=(loader.prefetch_factor or 2) if workers > 0 else None,
                  _iterator=None)  # persistent workers are the original's, not the copy's
    for name, value in values.items():
        object.__setattr__(new, name, value)  # DataLoader refuses persistent_workers after init
    return new
