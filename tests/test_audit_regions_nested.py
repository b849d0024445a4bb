"""Audit: a region entered again inside itself (a recursive function under
``@tk.profile_region``) records the time spent in it, not each nested entry's time added up.

Three nested calls of a function sleeping 10 ms each are 30 ms in the region; adding up the
entries (30 + 20 + 10) wrote 60 ms, twice the wall time, in a step shorter than that. Real loops
(the C regions and the Python ones), read back from the event files.
"""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from trainkit import recorder
from trainkit.profiling import regions
from tests.conftest import scalars
from tests.helpers import mlp

needs_c = pytest.mark.skipif(recorder._fast is None, reason="trainkit._speedups not built")


@pytest.fixture(params=[pytest.param(True, marks=needs_c, id="c"), pytest.param(False, id="py")])
def region_impl(request, monkeypatch):
    monkeypatch.setattr(regions, "_regions", {})  # made again, by the implementation asked for
    if not request.param:
        monkeypatch.setattr(recorder, "_fast", None)


def test_a_recursive_region_records_its_wall_time(tmp_path, region_impl):
    @tk.profile_region("recurse")
    def recurse(n):
        time.sleep(0.01)
        return recurse(n - 1) if n else 0

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    walls = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x in tk.patch([torch.randn(4, 8) for _ in range(3)]):
            t0 = time.perf_counter()
            recurse(2)
            walls.append((time.perf_counter() - t0) * 1e3)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    spent = dict(got["trainkit/region/recurse_ms"])
    times = dict(got["trainkit/step_time_ms"])
    assert sorted(spent) == [1, 2, 3]
    for st, wall in zip((1, 2, 3), walls):
        assert spent[st] == pytest.approx(wall, rel=0.05, abs=1.0)  # 60 ms were written for 30
        assert spent[st] <= times[st]


def test_regions_of_other_names_inside_still_record(tmp_path, region_impl):
    # Only an entry of the same name inside an open one is its time already: another name nested
    # in it records its own.
    walls = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in tk.patch([torch.zeros(2)] * 2):
            with tk.profile_region("outer"):
                t0 = time.perf_counter()
                with tk.profile_region("inner"):
                    time.sleep(0.01)
                    with tk.profile_region("inner"):
                        time.sleep(0.005)
                walls.append((time.perf_counter() - t0) * 1e3)
    got = scalars(tmp_path)
    for (st, ms), wall in zip(got["trainkit/region/inner_ms"], walls):
        assert ms == pytest.approx(wall, rel=0.05, abs=1.0), st  # not 10 + 5 + 5
    outer = dict(got["trainkit/region/outer_ms"])
    assert all(outer[st] >= ms for st, ms in got["trainkit/region/inner_ms"])
