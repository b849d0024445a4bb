"""One step's values, as the writer makes them into an event: several values of a tag in one
step combined (summed, averaged, or the last), GPU values resolved, and the rates derived from
the internal tags (throughput, bandwidth). The C pass (trainkit/_speedups.c) calls
:func:`combine_step` and :func:`derive` for the steps it does not do itself."""
from __future__ import annotations

import functools
import operator
from typing import Any, Dict, List, Optional

from ._tags import (AMP_SCALE, AMP_SKIPPED, CLOSURE_MS, COMPILE_RECOMPILES, COMPILE_SECONDS,
                    DATA_WAIT, GC_FULL, GC_MS, H2D_BYTES, H2D_GBPS, H2D_MS, H2D_PINNED_BYTES,
                    H2D_PINNED_PCT, ITEMS, PASS_END_WAIT, PASSES, REGION, SAMPLES_PER_S, STEP_END,
                    STEP_TIME, UPDATE_MS)

# Time spent and counts add up over a step (several micro-batches, several copies, the several
# closure calls of LBFGS); anything else a step records more than once is averaged (the losses
# of the micro-batches of one accumulation window give the window's loss).
_SUMMED = (DATA_WAIT, H2D_MS, CLOSURE_MS, UPDATE_MS, ITEMS, H2D_BYTES, H2D_PINNED_BYTES,
           GC_MS, GC_FULL, COMPILE_SECONDS)
_LAST = (STEP_END, AMP_SCALE, COMPILE_RECOMPILES, AMP_SKIPPED)
_LOADER, _COUNT = PASSES.split("{}")  # trainkit/loader/<i>/passes


def _combine(tag: str, values: List[float]) -> float:
    if tag in _SUMMED or tag.startswith(REGION):
        return sum(values)
    if tag in _LAST or (tag.startswith(_LOADER) and tag.endswith(_COUNT)):
        # a count so far (a loader's passes begun: two in one step, a peek with
        # next(iter(loader)) and the epoch's pass, showed 1.5 for 2)
        return values[-1]
    return sum(values) / len(values)


def derive(values: Dict[str, float]) -> Dict[str, float]:
    """Replace the internal tags of one step by the rates they feed (in place)."""
    out = values
    values.pop(STEP_END, None)
    items = values.pop(ITEMS, None)
    if items is not None:  # 0 too (empty batches): a rate of 0, not a point left out
        step_ms = values.get(STEP_TIME)
        if step_ms:
            out[SAMPLES_PER_S] = items / (step_ms / 1e3)
    if H2D_BYTES in values or H2D_PINNED_BYTES in values:
        nbytes = values.pop(H2D_BYTES, None)
        pinned = values.pop(H2D_PINNED_BYTES, 0.0)
        copy_ms = values.get(H2D_MS)
        if nbytes and copy_ms:
            out[H2D_GBPS] = nbytes / (copy_ms / 1e3) / 1e9
        if nbytes:
            out[H2D_PINNED_PCT] = 100.0 * pinned / nbytes
    return out


_NUMBER = (int, float)
_is_float = functools.partial(operator.is_, float)  # of a type: a C call, not a Python frame


def add_value(tags: Dict[str, Any], tag: str, value: Any) -> None:
    """File one more ``value`` under ``tag`` (the first one is stored as it is: a list per tag
    and step would be a GC-tracked object each): the values become a list."""
    values = tags[tag]
    if values.__class__ is list:
        values.append(value)
    else:
        tags[tag] = [values, value]


def take_pass_end(tags: Dict[str, Any], counted: bool) -> bool:
    """Turn the step's pass-end waits (:data:`~trainkit._tags.PASS_END_WAIT`) into its data wait
    if the step was ``counted`` (its end came after them), else drop them (a step the run never
    finished: the wait ending the last pass). Returns whether the step still holds anything."""
    waits = tags.pop(PASS_END_WAIT)
    if counted:
        for wait in (waits if waits.__class__ is list else (waits,)):
            if DATA_WAIT in tags:
                add_value(tags, DATA_WAIT, wait)
            else:
                tags[DATA_WAIT] = wait
    return bool(tags)


def combine_step(tags: Dict[str, Any], final: bool) -> Optional[Dict[str, float]]:
    """``tag -> value`` of one step, or None when a GPU value is not ready (and not ``final``)."""
    if all(map(_is_float, map(type, tags.values()))):  # the common step: one float a tag
        return tags
    if not final:  # every value first: a pending one is released once read, so none is read
        for values in tags.values():  # before all of the step's are ready
            if values.__class__ is not float:
                for v in (values if values.__class__ is list else (values,)):
                    if not isinstance(v, _NUMBER):
                        try:
                            if not v.ready():
                                return None
                        except Exception:  # a CUDA error that sticks (the user's failing step):
                            pass  # its read below fails too, and leaves this value out, said once
    out: Dict[str, float] = {}
    for tag, values in tags.items():
        if values.__class__ is float:
            out[tag] = values
            continue
        if values.__class__ is not list:
            values = [values]
        try:
            resolved = []
            for v in values:
                if not isinstance(v, _NUMBER):
                    pending, v = v, v.value(wait=final)
                    pending.release()
                resolved.append(v)
            out[tag] = _combine(tag, resolved)
        except Exception as exc:  # one value that cannot be written must not stop the writer
            dropped(tag, exc)
    return out


_warned_tags: set = set()


def dropped(tag: str, exc: BaseException) -> None:
    """Warn (once per tag) that a step's value of ``tag`` was left out of the event file."""
    if tag in _warned_tags:
        return
    _warned_tags.add(tag)
    from ._text import say

    # said, never raised: where warnings are errors, raised in the write it was taken for a
    # failed one, and everything after it dropped
    say(f"trainkit: a value logged as {tag!r} could not be written ({type(exc).__name__}: "
        f"{exc}); it is left out, everything else is written", RuntimeWarning, stacklevel=2)
