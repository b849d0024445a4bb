"""TA101's advice, fitted to the DataLoader that fed the steps (its settings as the session
recorded them: :mod:`trainkit._loaderinfo`).

- no workers: ``num_workers=`` (a count from ``os.cpu_count()`` of the machine analyzing); but
  where a batch takes less than a worker's hand-over (an in-memory dataset), no workers and one
  indexing per batch (``BatchSampler`` as the sampler);
- workers started again each pass (no ``persistent_workers``) and a pass's first batch waiting
  far longer than the others: ``persistent_workers=True``, with the start-up measured per pass;
  a new DataLoader each pass (loaders of the same settings, one after the other) is one loader,
  advised once: create it once, with ``persistent_workers=True``;
- workers, waiting steadily: more of them, or a deeper ``prefetch_factor`` where only some
  batches are slow, or cheaper per-sample work where more workers cannot help (the CPU is busy,
  or it would take more workers than cores), each from the measured step and wait times;
- ``pin_memory=False`` on a run whose ``tk.to_device`` copies went to a GPU: ``pin_memory=True``.

A run without recorded settings (written before trainkit recorded them, or fed by a plain
iterable) gets the general advice, said to be a guess.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from ..._loaderinfo import META_LOADER, PASSES
from ...recorder import DATA_WAIT, H2D_MS, H2D_PINNED_PCT, PREFIX, UPDATE_MS
from ..series import Series, fmean, median, row_totals, total

CPU_PERCENT = PREFIX + "system/cpu_percent"

#: The advice when nothing says what the loader is.
GUESS_FIX = ("trainkit recorded no DataLoader settings for this run (a run recorded before "
             "trainkit recorded them, or a loader that is no torch DataLoader), so this is a "
             "guess: if the batches are loaded in the training process, "
             "DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True, "
             "prefetch_factor=2); move per-item work (decoding, augmentation) out of the main "
             "process or onto the GPU")

#: A pass's first wait longer than the other steps' median by this much (ms), and this many
#: times it, is worker start-up worth a finding.
STARTUP_MIN_MS = 20.0
STARTUP_RATIO = 5.0
#: Below this median wait (ms) a step with workers waits for the hand-over of a batch between
#: processes, not for its loading.
HANDOVER_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Loader:
    """A patched DataLoader of the run: its number, settings and the steps its passes began at."""

    index: int
    settings: Dict[str, Any]
    passes: Tuple[int, ...]

    def describe(self) -> str:
        s = self.settings
        parts = [f"num_workers={s.get('num_workers')}"]
        if s.get("num_workers"):
            parts += [f"persistent_workers={s.get('persistent_workers')}",
                      f"prefetch_factor={s.get('prefetch_factor')}"]
        parts += [f"pin_memory={s.get('pin_memory')}", f"batch_size={s.get('batch_size')}"]
        return f"loader {self.index} ({s.get('type', 'DataLoader')}: {', '.join(parts)})"


def recorded(run: Any) -> List[Loader]:
    """The run's patched DataLoaders whose settings were recorded, by number."""
    out = []
    for tag, text in run.meta.items():
        if not tag.startswith(META_LOADER):
            continue
        try:
            index = int(tag[len(META_LOADER):])
            settings = json.loads(text)
        except ValueError:  # not one of ours, or a newer format: the advice stays general
            continue
        if isinstance(settings, dict):
            passes = run.series(PASSES.format(index)).steps.tolist()  # sorted, each once
            out.append(Loader(index, settings, tuple(passes)))
    return sorted(out, key=lambda l: l.index)


def feeding(run: Any) -> List[Loader]:
    """The recorded loaders that fed the run's steps: those first iterated with gradients on
    (training); in a run whose batches were its steps (no optimizer stepped: an evaluation),
    every one. Empty when the training's own loader was not recorded."""
    loaders = recorded(run)
    train = [l for l in loaders if l.settings.get("role") == "train"]
    if train or run.scalars.get(UPDATE_MS):
        return train
    return loaders


def _median(values: Any) -> float:
    return median(values) if len(values) else 0.0


def advice(st: Any) -> Tuple[str, str]:
    """TA101's added evidence (starting with "; ", or empty) and its fix, for the run's loaders."""
    loaders = feeding(st.run)
    if not loaders:
        return "", GUESS_FIX
    every = recorded(st.run)
    groups = _made_anew(loaders)
    merged = {g[0].index: _merge(g) for g in groups if len(g) > 1}
    gone = {l.index for g in groups for l in g[1:]}
    every = [merged.get(l.index, l) for l in every if l.index not in gone]
    said = [_one(st, merged.get(g[0].index, g[0]), every, named=len(groups) > 1, anew=g)
            for g in groups]
    return "".join("; " + e for e, _ in said), "; ".join(f for _, f in said)


def _made_anew(loaders: List[Loader]) -> List[List[Loader]]:
    """The loaders grouped into those that are one DataLoader made anew for each pass (or
    epoch): the same settings, each one's passes after the one before's."""
    groups: List[List[Loader]] = []
    for l in loaders:
        last = groups[-1][-1] if groups else None
        if (last is not None and l.settings == last.settings and l.passes and last.passes
                and l.passes[0] > last.passes[-1]):
            groups[-1].append(l)
        else:
            groups.append([l])
    return groups


def _merge(group: List[Loader]) -> Loader:
    return Loader(group[0].index, group[0].settings,
                  tuple(sorted(p for l in group for p in l.passes)))


def _one(st: Any, loader: Loader, every: List[Loader], *, named: bool,
         anew: List[Loader]) -> Tuple[str, str]:
    """``anew``: the loaders ``loader`` stands for (one, or one DataLoader made anew each pass)."""
    import numpy as np

    s = loader.settings
    # The steady steps: timed ones outside any loader's start of a pass: what a batch costs.
    # Their waits and times, in step order (numpy arrays: a run may have a million steps)
    starting = {k for l in every for k in _starts(l)}
    steady = ~np.isin(st.steps, np.fromiter(starting, np.int64, len(starting)))
    if not steady.any():
        steady[:] = True
    waits, times = st.at(DATA_WAIT)[steady], st.times[steady]
    wait = _median(waits)
    spent = times - waits
    compute = _median(np.where(spent > 0.0, spent, 0.0))  # max(0.0, spent) of each
    workers = int(s.get("num_workers") or 0)
    evidence = [f"the steps were fed by {loader.describe()}"]
    if len(anew) > 1:
        many = (f"for each of its {len(loader.passes)} passes" if len(anew) == len(loader.passes)
                else f"{len(anew)} times over its {len(loader.passes)} passes")
        evidence[0] += (f", a new DataLoader {many} (loaders {anew[0].index} to "
                        f"{anew[-1].index}, the same settings one after the other)")
    fixes: List[str] = []
    who = f"loader {loader.index}: " if named else ""

    # A dataset in memory (a TensorDataset) with workers, or slow without: one fix stands in for
    # the others (no workers, one indexing a batch)
    in_memory = bool(s.get("in_memory")) and bool(workers or wait >= HANDOVER_MS)
    others = {p for l in every if l.index != loader.index for p in l.passes}
    startup = _startup(loader, st.series(DATA_WAIT), others, wait)
    if workers and startup is not None and (len(anew) > 1 or not s.get("persistent_workers")):
        per_pass, used, mixed = startup
        restarts = len(loader.passes) - 1
        first = "its first step" if workers == 1 else f"its first {workers} steps"
        evidence.append(
            f"each pass's start ({first}, one batch per worker) waited ~{per_pass:.0f} ms more "
            f"than steady steps do (median wait {wait:.2f} ms), measured on {used} of its "
            f"{len(loader.passes)} passes"
            + (" (whose steps also held another loader's pass)" if mixed else "")
            + f": its {workers} workers start again at each pass")
        saving = (f"saving ~{per_pass:.0f} ms of worker start-up per epoch "
                  f"(~{per_pass * restarts:.0f} ms over the {restarts} later pass(es) here)")
        if not in_memory and len(anew) > 1:
            fixes.append(f"create the DataLoader once, before the epoch loop, with "
                         f"persistent_workers=True: each new DataLoader starts its {workers} "
                         f"workers again (persistent workers last only across the passes of one "
                         f"loader); its workers then start once, {saving}")
        elif not in_memory:
            fixes.append(f"DataLoader(..., persistent_workers=True): the workers then start "
                         f"once, {saving}")
    steady_share = total(waits) / max(1e-9, total(times))
    if in_memory:
        fixes.append(_in_memory(s, workers, wait))
    elif not workers and wait < HANDOVER_MS:
        fixes.append(_cheap_batches(s, wait))
    elif not workers:
        cores = os.cpu_count() or 1
        n = max(1, min(8, cores - 1))
        fixes.append(
            f"DataLoader(..., num_workers={n}, persistent_workers=True): with num_workers=0 each "
            f"batch is loaded in the training process while the step waits (median {wait:.2f} "
            f"ms a step); {n} is this machine's os.cpu_count()={cores} less one for the training "
            f"loop, counted when analyzing: use the training machine's cores")
    else:
        # Per round of the workers: w workers in step hand out w batches together, so one step
        # in w waits for all of them and the others barely (2 workers: ~20, ~0, ~20 ms...): the
        # median step then says ~0 ms, a burst, where the workers simply fall short (with 2, on
        # either side from run to run). Summed over each w steps in a row, a steady shortfall
        # waits alike in every round, and only bursts of slow batches leave rounds apart.
        rounds = _rounds(waits, workers)
        wait_r, mean_r = _median(rounds) / workers, fmean(rounds) / workers
        if (steady_share >= 0.10 and wait_r >= HANDOVER_MS) or not fixes:
            fixes.append(_steady(st, s, workers, wait_r, mean_r, compute))
    pin = _pin(st, s)
    if pin:
        fixes.append(pin)
    return who + "; ".join(evidence), who + "; ".join(fixes)


def _in_memory(s: Dict[str, Any], workers: int, wait: float) -> str:
    """The fix for a dataset held in memory (a TensorDataset): its batches cost the per-sample
    ``__getitem__`` calls and the collate, which workers only move to other processes (started
    at each pass, each batch handed back), and which one indexing per batch takes away."""
    batch = s.get("batch_size") or "B"
    drop = "num_workers=0 and " if workers else ""
    return (f"{drop}load each batch with one indexing: the dataset is in memory "
            f"({s.get('dataset') or 'a TensorDataset'}), so a batch costs its {batch} "
            f"__getitem__ calls and the collate (median wait {wait:.2f} ms a step)"
            + (f", which its {workers} workers only move to other processes and hand back"
               if workers else ", which workers would only move to other processes")
            + f": {_one_indexing(batch)}")


def _cheap_batches(s: Dict[str, Any], wait: float) -> str:
    """The fix for batches loaded in the training process in less time than a worker takes to
    hand one over (an in-memory dataset): no workers, fewer per-sample calls."""
    cpu = ("; this run trains on the CPU, whose cores workers would take from the training"
           if s.get("cuda_available") is False else "")
    batch = s.get("batch_size") or "B"
    return (f"keep num_workers=0: a batch is loaded in a median {wait:.2f} ms a step, less than "
            f"handing one over from a worker process (~{HANDOVER_MS:.0f} ms), so workers would "
            f"make the step slower{cpu}. For data already in memory (a TensorDataset, tensors), "
            f"load each batch with one indexing instead of one __getitem__ per sample and a "
            f"collate: {_one_indexing(batch)}")


def _one_indexing(batch: Any) -> str:
    """How to load a batch of an in-memory dataset with one indexing (``batch``: its size)."""
    return (f"DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size={batch}, "
            f"drop_last=False), batch_size=None) (ds[indices] returns the batch), or slice the "
            f"tensors by torch.randperm yourself")


def _rounds(values: Any, n: int) -> Any:
    """Sums of ``n`` values in a row (the last, shorter group left out when there are others),
    each ``sum`` of the group's list on this Python (the code this replaced, to the last bit),
    a numpy array."""
    import numpy as np

    rows = len(values) // n
    if not rows:  # one group, shorter
        return np.array([total(values) if len(values) else 0.0])
    return row_totals(np.reshape(values[:rows * n], (rows, n)))


def _starts(loader: Loader) -> List[int]:
    """The steps of the loader's pass starts: a pass's first ``num_workers`` steps (each worker's
    first batch waits for it to start), or its first step without workers."""
    n = max(1, int(loader.settings.get("num_workers") or 0))
    return [p + i for p in loader.passes for i in range(n)]


def _startup(loader: Loader, waits: Series, others: set,
             wait: float) -> Optional[Tuple[float, int, bool]]:
    """Worker start-up per pass: the median, over its passes, of the waits of a pass's first
    steps beyond the steady median ``wait`` (from the passes that began in no step where
    another loader's did, where there are some), how many passes that is from, and whether those
    steps held another loader's pass. None below a cost worth a finding, or with one pass
    (nothing to keep the workers for)."""
    import numpy as np

    if len(loader.passes) < 2:
        return None
    n = max(1, int(loader.settings.get("num_workers") or 0))
    ends = list(loader.passes[1:]) + [None]
    clean = [p for p in loader.passes if p not in others]
    used = clean or list(loader.passes)
    firsts = [range(p, p + n if end is None else min(p + n, end))
              for p, end in zip(loader.passes, ends) if p in used]
    ks = sorted({k for r in firsts for k in r})
    at = dict(zip(ks, waits.at(np.array(ks, np.int64)).tolist()))  # the waits of those steps
    per_pass = _median([sum(max(0.0, at[k] - wait) for k in r) for r in firsts])
    if per_pass < max(STARTUP_MIN_MS, STARTUP_RATIO * wait):
        return None
    return per_pass, len(used), not clean


def _steady(st: Any, s: Dict[str, Any], workers: int, wait: float, mean_wait: float,
            compute: float) -> str:
    """The fix for workers that cannot keep up, from the steady steps' numbers: ``wait`` and
    ``mean_wait`` are a step's wait averaged over each round of the workers (``workers`` steps
    in a row), their median and mean over the rounds."""
    per_batch = workers * (compute + wait)  # a worker's time per batch, at the rate they keep
    batch = s.get("batch_size")
    sample = f", ~{per_batch / batch:.2f} ms a sample" if batch else ""
    pf = s.get("prefetch_factor") or 2
    if mean_wait > 0 and wait < 0.25 * mean_wait:
        return (f"DataLoader(..., prefetch_factor={2 * pf}): most steps barely wait (median "
                f"{wait:.2f} ms) while some wait long (mean {mean_wait:.2f} ms): slow batches "
                f"come in bursts, which a deeper queue per worker (now {pf}) absorbs")
    if wait < HANDOVER_MS:
        return (f"larger batches (now {batch}): a step waits a median {wait:.2f} ms for its "
                f"batch from the {workers} workers, the hand-over between processes rather "
                f"than their loading, against {compute:.2f} ms of step without the wait; more "
                f"workers or prefetching do not shorten it")
    cores = os.cpu_count() or 1
    need = math.ceil(per_batch / compute) if compute > 0 else None
    busy = st.series(CPU_PERCENT).values
    cpu = _median(busy) if len(busy) else None
    how = (f"each of the {workers} workers takes ~{per_batch:.1f} ms a batch{sample} "
           f"({workers} x ({compute:.2f} ms of step without the wait + {wait:.2f} ms of wait))")
    if need is not None and need <= cores and (cpu is None or cpu < 85.0):
        return (f"DataLoader(..., num_workers={need}): {how}, so keeping up with the step takes "
                f"~{need} workers ({cores} cores here, os.cpu_count() when analyzing); a larger "
                f"prefetch_factor does not help a steady shortfall")
    why = (f"the CPU is already {cpu:.0f}% busy" if cpu is not None and cpu >= 85.0
           else f"keeping up would take ~{need} workers, more than the {cores} cores here"
           if need is not None else "the step does nothing but wait")
    return (f"make the per-sample work cheaper (the dataset's __getitem__, transforms, "
            f"collate_fn): {how}, and more workers cannot help ({why}); decode or preprocess "
            f"once and cache, load smaller inputs, or augment on the GPU")


def _pin(st: Any, s: Dict[str, Any]) -> str:
    """``pin_memory=True`` where the loader does not pin and trainkit's copies went to a GPU
    mostly from pageable memory."""
    copies = st.series(H2D_MS).values
    if s.get("pin_memory") or not len(copies):
        return ""
    pinned = st.series(H2D_PINNED_PCT).values
    pct = fmean(pinned) if len(pinned) else 0.0
    if pct >= 90.0:  # pinned some other way (x.pin_memory() in the loop)
        return ""
    return (f"DataLoader(..., pin_memory=True): its batches are in pageable memory "
            f"({pct:.0f}% of the bytes tk.to_device copied were pinned), and copying them to the "
            f"GPU takes a median {_median(copies):.2f} ms a step")
