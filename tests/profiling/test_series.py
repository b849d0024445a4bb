"""The record rules' arrays (``profiling.series``) give what the Python they replace gave: a
tag's ``step -> value`` as ``Run.values`` reads it, and each statistic as ``sum``,
``statistics`` and ``sorted`` give it on the same floats, to the last bit (the findings' texts
and shares must not change)."""
from __future__ import annotations

import random
import statistics
from array import array

import numpy as np
import pytest

from trainkit.profiling import series
from trainkit.profiling.analyzers.loaders import _rounds
from trainkit.profiling.points import Points
from trainkit.profiling.runs import Run

_KINDS = ("uniform", "few", "spread", "tiny", "negative", "ties")


def _values(rng: random.Random, kind: str, n: int) -> list:
    if kind == "uniform":
        return [rng.random() * 100 for _ in range(n)]
    if kind == "few":  # percents pinned: a handful of values repeated
        return [rng.choice([0.0, 50.0, 100.0, 33.3]) for _ in range(n)]
    if kind == "spread":  # exponents far apart: the exact mean's case
        return [rng.gauss(0, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(n)]
    if kind == "tiny":  # subnormal
        return [rng.random() * 1e-310 for _ in range(n)]
    if kind == "negative":
        return [-rng.random() * 1e20 + rng.random() for _ in range(n)]
    return [round(rng.random() * 3, 1) for _ in range(n)]


@pytest.mark.parametrize("kind", _KINDS)
def test_each_statistic_is_that_of_the_list(kind):
    rng = random.Random(kind)
    for n in list(range(1, 12)) + [rng.randint(12, 3000) for _ in range(40)]:
        values = _values(rng, kind, n)
        a = np.array(values)
        assert series.total(a) == sum(values)
        assert series.median(a) == statistics.median(values)
        assert series.mean(a) == statistics.mean(values)
        assert series.fmean(a) == statistics.fmean(values)
        assert series.positive(a) == sum(1 for v in values if v > 0)
        assert series.argmax(a) == max(range(n), key=values.__getitem__)
        half, held, k = sum(values) / 2, 0.0, 0
        for v in sorted(values, reverse=True):
            held, k = held + v, k + 1
            if held >= half:
                break
        assert series.fewest_holding(a, half) == k


def test_the_mean_of_infinities_is_statistics_own():
    assert series.mean(np.array([1.0, float("inf")])) == float("inf")
    with pytest.raises(statistics.StatisticsError):
        series.median(np.array([]))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_rounds_are_the_sums_of_the_groups_of_the_list(n):
    rng = random.Random(n)
    for m in [0, 1, n - 1, n, n + 1, 5 * n, 5 * n + 1, 101]:
        values = [rng.random() * 30 for _ in range(m)]
        groups = [sum(values[i:i + n]) for i in range(0, len(values), n)]
        if len(groups) > 1 and len(values) % n:
            groups.pop()
        assert _rounds(np.array(values), n).tolist() == (groups or [0.0])


def test_rounds_are_the_sums_of_the_groups_where_adding_left_to_right_loses_a_value():
    """Before the fix the rounds were added left to right: from Python 3.12 on ``sum`` of a
    group's list compensates, and gave 1.0 for ``[1e16, 1.0, -1e16]`` where the rounds gave 0.0
    (and differed in the last bits of random groups: the loader findings changed with Python)."""
    groups = [[1e16, 1.0, -1e16], [0.1, 0.2, 0.3], [1e308, 1e308, -1e308],
              [float("inf"), 1.0, 2.0], [-0.0, -0.0, -0.0], [3.0, -1e100, 1e100]]
    got = _rounds(np.array([v for g in groups for v in g]), 3).tolist()
    assert got == [sum(g) for g in groups]


def test_a_tags_series_is_its_values_dict_sorted_by_step():
    """Steps written again (a restart, two sessions merged tag by tag): the last value of a step
    wins, as in ``Run.values``; increasing steps are read in place."""
    rng = random.Random(0)
    for trial in range(300):
        n = rng.randint(0, 40)
        steps = ([rng.randint(0, 30) for _ in range(n)] if trial % 2
                 else sorted(rng.sample(range(60), n)))
        values = [rng.random() for _ in steps]
        run = Run(name=".", path=".", traces=(),
                  scalars={"t": Points(array("q", steps), array("d", values)),
                           "l": list(zip(steps, values))})
        want = run.values("t")
        for tag in ("t", "l"):
            s = run.series(tag)
            assert s.steps.tolist() == sorted(want)
            assert s.values.tolist() == [want[k] for k in sorted(want)]
            asked = np.arange(-2, 65, dtype=np.int64)
            assert s.at(asked).tolist() == [want.get(k, 0.0) for k in asked.tolist()]
            some = np.array(sorted(want)[1:], dtype=np.int64)  # a tag at each step asked
            assert s.at(some).tolist() == [want[k] for k in some.tolist()]
        assert len(run.series("absent")) == 0
        assert run.series("absent").at(np.arange(3, dtype=np.int64)).tolist() == [0.0] * 3
