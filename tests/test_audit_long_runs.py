"""Long runs in the tab and in ``trainkit analyze``: what is read again, and how often.

A run of 1,000,000 steps takes ~10 s and ~0.2 GB to read and analyze whole (``trainkit
analyze``; the tab reads only what was appended since its last read): the tab must not analyze it
again for a request whose files did not change, nor start a second analysis of a run while one is
under way (a tab reloaded meanwhile), and the record rules must not rebuild a tag's values for
each rule that asks for them.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest

from trainkit.profiling import runs as runs_mod
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.analyzers import records as record_rules
from trainkit.profiling.runs import Run, load_run
from trainkit.recorder import DATA_WAIT, GC_MS, PREFIX, SAMPLES_PER_S, STEP_TIME, UPDATE_MS
from trainkit.sinks.tbplugin import data as tab_data
from trainkit.sinks.tensorboard import EventFileWriter


def _write_steps(w: EventFileWriter, first: int, last: int) -> None:
    for s in range(first, last + 1):
        st = 40.0 + (s % 7)
        values = {}
        if s % 5 == 0:
            values[GC_MS] = 12.0
        values.update({DATA_WAIT: 8.0 + (s % 3), PREFIX + "region/forward_ms": 12.0,
                       PREFIX + "region/backward_ms": 15.0, UPDATE_MS: 2.5, STEP_TIME: st,
                       "loss": 1.0 / s, SAMPLES_PER_S: 8000.0 / st})
        w.write_scalars(step=s, values=values, wall_time=1.7e9 + s * 0.05)
        if s % 20 == 0:
            w.write_scalars(step=s, values={PREFIX + "system/cpu_percent": 50.0,
                                            PREFIX + "system/rss_MB": 900.0},
                            wall_time=1.7e9 + s * 0.05)
    w.flush()


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "logs" / "exp"
    w = EventFileWriter(str(folder))
    _write_steps(w, 1, 300)
    yield folder, w
    w.close()


def _counting(monkeypatch: Any, module: Any, name: str, *, after: Any = None) -> List[Any]:
    """Replace ``module.name`` by a wrapper around the real one that records each call's first
    argument (and calls ``after()`` once the real one returned)."""
    real, calls = getattr(module, name), []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0] if args else None)
        out = real(*args, **kwargs)
        if after is not None:
            after()
        return out

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_a_report_asked_again_reads_no_unchanged_file(run_dir, monkeypatch):
    folder, w = run_dir
    reads = _counting(monkeypatch, runs_mod, "parse_file")
    data = tab_data.TabData(str(folder.parent))
    assert data.runs() == ["exp"]
    first = data.report("exp")
    assert first is not None and first["steps"] == 299
    n = len(reads)
    assert n >= 1
    assert data.runs() == ["exp"] and data.report("exp") == first
    assert len(reads) == n, "an unchanged run's event file was read again"
    # grown: read again, and the report says so
    _write_steps(w, 301, 310)
    assert data.report("exp")["steps"] == 309
    assert len(reads) > n


def test_a_request_while_the_run_is_analyzed_waits_for_that_analysis(run_dir, monkeypatch):
    """Two requests for one run at once (a tab reloaded while a long run is analyzed): one
    analysis, both answered with it."""
    folder, _ = run_dir
    entered, release = threading.Event(), threading.Event()
    calls = _counting(monkeypatch, tab_data, "analyze_run",
                      after=lambda: (entered.set(), release.wait(20)))
    data = tab_data.TabData(str(folder.parent))
    got: Dict[str, Any] = {}
    a = threading.Thread(target=lambda: got.__setitem__("a", data.report("exp")))
    a.start()
    assert entered.wait(20)
    b = threading.Thread(target=lambda: got.__setitem__("b", data.report("exp")))
    b.start()
    b.join(0.5)  # b is waiting for a's analysis (before the fix: it ran its own, and returned)
    release.set()
    a.join(20)
    b.join(20)
    assert len(calls) == 1, f"{len(calls)} analyses of one unchanged run for two requests"
    assert got["a"] == got["b"] and got["a"]["steps"] == 299


def test_a_run_grown_during_an_analysis_is_read_again_once_for_the_requests_meanwhile(
        run_dir, monkeypatch):
    """A run being written: a request that came after the file grew gets the grown run (not
    the analysis under way, which read it before), and the requests that came meanwhile share
    one more analysis rather than one each."""
    folder, w = run_dir
    entered, release = threading.Event(), threading.Event()
    first = []

    def hold() -> None:
        if not first:  # only the first analysis is held
            first.append(1)
            entered.set()
            release.wait(20)

    calls = _counting(monkeypatch, tab_data, "analyze_run", after=hold)
    data = tab_data.TabData(str(folder.parent))
    got: Dict[str, Any] = {}

    def ask(key: str) -> threading.Thread:
        t = threading.Thread(target=lambda: got.__setitem__(key, data.report("exp")))
        t.start()
        return t

    a = ask("a")
    assert entered.wait(20)
    _write_steps(w, 301, 320)  # the writer appends while the tab reloads
    b, c = ask("b"), ask("c")
    b.join(0.5)
    c.join(0.5)
    release.set()
    for t in (a, b, c):
        t.join(20)
    assert got["a"]["steps"] == 299
    assert got["b"]["steps"] == got["c"]["steps"] == 319
    assert got["b"] == got["c"]
    assert len(calls) == 2, f"{len(calls)} analyses for three requests"
    assert got["b"] == analyze_run(str(folder), str(folder), name="exp").to_dict() | {
        "ablation": got["b"]["ablation"]}


def test_the_rules_build_each_tags_values_once(run_dir, monkeypatch):
    """``Steps.series``: a tag's points are read (``Run.series``, two numpy arrays) once per
    analysis for the rules and the breakdown, not once per rule that asks; and no rule builds
    the ``step -> value`` dict of ``Run.values`` (~100 bytes a point: a 1,000,000-step run's
    analysis took 4.6 s and 0.35 GB above reading it with them, benchmarks/analyze_long.py)."""
    folder, _ = run_dir
    asked: List[str] = []
    dicts: List[str] = []
    real_series, real_values = Run.series, Run.values

    def series(self: Run, tag: str) -> Any:
        asked.append(tag)
        return real_series(self, tag)

    def values(self: Run, tag: str) -> Dict[int, float]:
        dicts.append(tag)
        return real_values(self, tag)

    before = analyze_run(str(folder), str(folder)).to_dict()
    monkeypatch.setattr(Run, "series", series)
    monkeypatch.setattr(Run, "values", values)
    st = record_rules.Steps(load_run(str(folder), str(folder)))
    asked.clear()
    found = record_rules.findings(st)
    record_rules.breakdown(st)
    assert {f.code for f in found} >= {"TA101", "TA106"}
    # data wait: read once for the rules' per-step values, TA101's and the breakdown's
    assert asked.count(DATA_WAIT) == 1, asked
    assert asked.count(GC_MS) == 1, asked
    assert asked.count(UPDATE_MS) == 1, asked
    assert not dicts, dicts
    assert st.at(DATA_WAIT) is st.at(DATA_WAIT)
    assert analyze_run(str(folder), str(folder)).to_dict() == before


def test_per_step_values_are_those_of_the_tag_at_each_timed_step(run_dir):
    folder, _ = run_dir
    run = load_run(str(folder), str(folder))
    st = record_rules.Steps(run)
    for tag in (DATA_WAIT, GC_MS, UPDATE_MS, PREFIX + "region/forward_ms", "absent"):
        values = run.values(tag)
        assert st.at(tag).tolist() == [values.get(s, 0.0) for s in st.steps]
