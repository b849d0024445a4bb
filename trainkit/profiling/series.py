"""A tag's points as the record rules read them, and the statistics they take of them, in numpy
arrays rather than Python dicts and lists of floats.

:meth:`.runs.Run.values` gives a tag as a ``step -> value`` dict, ~100 bytes a point; the rules
of a 1,000,000-step run built one per tag, and a list of floats per tag at the timed steps, again
in TA101's loader advice: ~0.35 GB above the run's points, and most of the analysis's time
(benchmarks/analyze_long.py). :class:`Series` holds the same ``step -> value`` (the last value
written for a step wins) in two numpy arrays sorted by step, views of the run's
:class:`.points.Points` where their steps already increase (a run without restarts: no copy).

Each statistic below gives what the Python the rules used gives on the same values as floats in
the same order (``sum`` of a list, ``statistics.median``/``mean``/``fmean``, ``max`` by key):
the findings do not change. Values holding NaN (which trainkit's timers and counters never
write) may order otherwise, in a median, than a sort of the list did.

numpy is imported where used: ``import trainkit`` imports none.
"""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Optional, Tuple

if TYPE_CHECKING:
    import numpy as np

    from .points import Points


class Series:
    """One tag's ``step -> value``, the last value written for a step winning (as
    :meth:`.runs.Run.values` reads it), in two read-only numpy arrays sorted by step.

    Example::

        s = run.series("trainkit/data_wait_ms"); s.at(steps)  # its values at those steps
    """

    __slots__ = ("steps", "values")

    def __init__(self, steps: "np.ndarray", values: "np.ndarray") -> None:
        #: the steps, increasing (int64)
        self.steps = steps
        #: the value at each step (float64)
        self.values = values

    @classmethod
    def of(cls, points: "Optional[Points]") -> "Series":
        """The points' ``step -> value``: views of their arrays where the steps increase (the
        points are never changed once made), else sorted and with the last value of a step."""
        import numpy as np

        if not points:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.float64))
        steps = np.frombuffer(points.steps, dtype=np.int64)
        values = np.frombuffer(points.values, dtype=np.float64)
        if len(steps) > 1 and not (steps[1:] > steps[:-1]).all():  # a restart, a step again
            order = np.argsort(steps, kind="stable")  # a step's values in the order written
            steps, values = steps[order], values[order]
            last = np.append(steps[1:] != steps[:-1], True)
            steps, values = steps[last], values[last]
        steps.flags.writeable = values.flags.writeable = False
        return cls(steps, values)

    def __len__(self) -> int:
        return len(self.steps)

    def find(self, steps: "np.ndarray") -> "Tuple[np.ndarray, np.ndarray]":
        """Where each of ``steps`` (an int64 array) is among the tag's, and whether it is: the
        value of ``steps[k]`` is ``values[i[k]]`` where ``found[k]``. Returns ``(i, found)``."""
        import numpy as np

        if not len(self.steps):
            return np.zeros(len(steps), np.intp), np.zeros(len(steps), bool)
        i = np.searchsorted(self.steps, steps)
        np.minimum(i, len(self.steps) - 1, out=i)
        return i, self.steps[i] == steps

    def at(self, steps: "np.ndarray", default: float = 0.0) -> "np.ndarray":
        """The values at ``steps`` (an int64 array, increasing), ``default`` where the tag has
        none; read-only."""
        import numpy as np

        if not len(self.steps):
            return np.full(len(steps), default)
        if len(steps):  # the tag recorded at each of those steps, and only at them between:
            first = int(np.searchsorted(self.steps, steps[0]))  # a view of its values
            window = slice(first, first + len(steps))
            if np.array_equal(self.steps[window], steps):
                return self.values[window]
        i, found = self.find(steps)
        return np.where(found, self.values[i], default)


def _floats(a: Any) -> memoryview:
    """``a``'s values as a buffer of doubles, which iterates as Python floats (not a list)."""
    import numpy as np

    return memoryview(np.ascontiguousarray(a, dtype=np.float64))


def total(a: Any) -> float:
    """``sum()`` of the values in order, as ``sum`` of their list gives (an int 0 when empty)."""
    return sum(_floats(a))


#: Whether ``sum`` of floats compensates their rounding errors (Neumaier's sum, Python 3.12 on),
#: asked of ``sum`` itself: a left-to-right sum loses the first 1.0 to 1e100 here.
_SUM_COMPENSATES = sum([1.0, 1e100, 1.0, -1e100]) == 2.0


def row_totals(a: "np.ndarray") -> "np.ndarray":
    """``total`` of each row of the 2-D array ``a``, all rows at once (column by column): ``sum``
    of the row's list on this Python, to the last bit. Left to right before Python 3.12; with
    ``sum``'s compensation from 3.12 on, where a left-to-right sum differs in the last bits (and
    gives 0.0 for ``[1e16, 1.0, -1e16]``, where ``sum`` gives 1.0)."""
    import numpy as np

    s, c = np.zeros(len(a)), np.zeros(len(a))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, as in sum's own c
        for x in a.T:
            t = s + x
            if _SUM_COMPENSATES:  # CPython's builtin sum, step by step
                c += np.where(np.abs(s) >= np.abs(x), (s - t) + x, (x - t) + s)
            s = t
        if _SUM_COMPENSATES:  # sum adds c only where it is finite and not 0 (keeps a -0.0)
            s = np.where((c != 0) & np.isfinite(c), s + c, s)
    return s


def positive(a: "np.ndarray") -> int:
    """How many values are above 0."""
    import numpy as np

    return int(np.count_nonzero(a > 0))


def median(a: Any) -> float:
    """``statistics.median`` of the values (the two middle ones of a sorted copy, found by a
    partition).

    Raises:
        statistics.StatisticsError: there is no value.
    """
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    n = len(a)
    if not n:
        raise statistics.StatisticsError("no median for empty data")
    i = n // 2
    if n % 2:
        return float(np.partition(a, i)[i])
    low, high = np.partition(a, (i - 1, i))[i - 1:i + 1].tolist()
    return (low + high) / 2


def mean(a: "np.ndarray") -> float:
    """``statistics.mean`` of the values: their exact sum over their count, rounded once.

    The exact sum is that of each value's 53-bit integer mantissa times two to its exponent:
    the mantissas summed per exponent (in halves, exactly in int64 below 2**36 values), then
    joined as Python integers: no ``Fraction`` per value, which ``statistics.mean`` makes (~1 s
    a million values).

    Raises:
        statistics.StatisticsError: there is no value.
    """
    import numpy as np

    n = len(a)
    if not n or not np.isfinite(a).all():  # inf or NaN: as statistics says it
        return statistics.mean(a.tolist())
    mantissa, exponent = np.frexp(a)
    ints = np.ldexp(mantissa, 53).astype(np.int64)  # a == ints * 2.0 ** (exponent - 53)
    order = np.argsort(exponent, kind="stable")
    exponent, ints = exponent[order], ints[order]
    starts = np.flatnonzero(np.append(True, exponent[1:] != exponent[:-1]))
    high = np.add.reduceat(ints >> 26, starts)  # |ints >> 26| < 2**27
    low = np.add.reduceat(ints & ((1 << 26) - 1), starts)
    exps = (exponent[starts] - 53).tolist()
    least = exps[0]
    exact = sum(((h << 26) + l) << (e - least)  # the sum is exact * 2 ** least
                for h, l, e in zip(high.tolist(), low.tolist(), exps))
    return exact / (n << -least) if least < 0 else (exact << least) / n  # rounded once


def fmean(a: Any) -> float:
    """``statistics.fmean`` of the values (``math.fsum`` over their count)."""
    return math.fsum(_floats(a)) / len(a)


def argmax(a: "np.ndarray") -> int:
    """The index of the first largest value, as ``max(range(n), key=a.__getitem__)``."""
    import numpy as np

    return int(np.argmax(a))


def fewest_holding(a: "np.ndarray", part: float) -> int:
    """The fewest values, the largest first, whose running sum (added in that order) reaches
    ``part``; all of them where it never does."""
    import numpy as np

    held = np.add.accumulate(np.sort(a)[::-1])  # left to right, as a loop adding them does
    reached = np.flatnonzero(held >= part)
    return int(reached[0]) + 1 if len(reached) else len(a)
