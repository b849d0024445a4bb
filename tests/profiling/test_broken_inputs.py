"""Broken files in a run folder: each is a finding or a message, never a Python traceback."""
from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import time

import pytest

import trainkit as tk
from trainkit.profiling import tracefiles
from trainkit.profiling.cli import main
from trainkit.profiling.tracestats import summarize

from .conftest import FIXTURES, fixture_run


def age(path, seconds=3600):
    """Make a file look as written ``seconds`` ago (an unreadable trace changed within the last
    minute may still be being written)."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def corrupt_gzip_trace(folder):
    """A gzip trace whose compressed bytes were damaged (a bad disk, a copy cut and patched): zlib
    says "invalid distance too far back" or the like, where a truncated one ends early."""
    with open(os.path.join(FIXTURES, "gpu_healthy.pt.trace.json"), "rb") as fh:
        packed = bytearray(gzip.compress(fh.read()))
    for i in range(200, len(packed) - 20, 7):
        packed[i] ^= 0x5A
    path = os.path.join(folder, "broken.pt.trace.json.gz")
    with open(path, "wb") as fh:
        fh.write(packed)
    age(path)
    return path


def test_read_trace_of_a_corrupt_gzip_trace_is_a_trace_error(tmp_path):
    path = corrupt_gzip_trace(str(tmp_path))
    try:
        tracefiles.read_trace(path)
    except tracefiles.TraceError as exc:
        assert "broken.pt.trace.json.gz" in str(exc) and "cannot read it" in str(exc)
    else:
        raise AssertionError("a corrupt gzip trace was read")


def test_a_corrupt_gzip_trace_is_ta100_naming_the_file(tmp_path, capsys):
    run = fixture_run(tmp_path, "gpu_healthy.pt.trace.json")
    corrupt_gzip_trace(run)
    found = tk.analyze(run)
    bad = [f for f in found if f.code == "TA100"]
    assert len(bad) == 1 and "broken.pt.trace.json.gz" in bad[0].evidence
    assert main([run]) == 1
    out = capsys.readouterr().out
    assert "TA100" in out and "broken.pt.trace.json.gz" in out


def test_a_reader_that_went_away_is_no_traceback(tmp_path):
    """``trainkit analyze runs | head`` (or ``| grep -q``): the pipe closes before the output ends."""
    run = fixture_run(tmp_path, "gpu_syncs.pt.trace.json")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first finding is written
    try:
        result = subprocess.run([sys.executable, "-m", "trainkit.profiling.cli", run],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 1


def test_a_logdir_under_home_is_read_as_the_session_wrote_it(tmp_path, monkeypatch):
    """tk.session(logdir="~/runs/exp1") writes under the home folder; tk.analyze of the same
    string (or ``trainkit analyze '~/runs/exp1'``, quoted) reads it there, not a folder named ~."""
    monkeypatch.setenv("HOME", str(tmp_path))
    fixture_run(tmp_path, "gpu_syncs.pt.trace.json")  # tmp_path/run
    assert tk.analyze(os.path.join("~", "run")) == tk.analyze(str(tmp_path / "run"))
    assert main([os.path.join("~", "run")]) == 1


STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100}
MEMCPY = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 10, "dur": 5,
          "args": {"bytes": 4096}}


@pytest.mark.parametrize("bad", [
    {**MEMCPY, "name": ["Memcpy HtoD"]},  # a name that is no string (no dict key either)
    {**MEMCPY, "args": [4096]},  # args that are no object
    {**MEMCPY, "args": {"bytes": float("nan")}},  # json writes NaN, and reads it back
    {"ph": "X", "cat": "kernel", "name": "k", "ts": "nan", "dur": 1},  # a time that is no time
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 20, "dur": float("inf")},
])
def test_a_malformed_event_is_skipped_not_the_analysis(tmp_path, bad):
    """summarize() skips a malformed event "rather than fail the whole analysis": also one whose
    name or args have the wrong type, or whose numbers are NaN or infinite."""
    st = summarize([STEP, MEMCPY, bad])
    assert st.steps == 1 and st.window_us == 100.0
    assert all(math.isfinite(v) for v in (st.gpu_busy_us, st.median_gap_us, st.median_kernel_us))
    assert all(math.isfinite(size) for _, size in st.memcpy.values())
    assert math.isfinite(summarize([STEP, bad]).gpu_busy_us)
    run = tmp_path / "run"
    run.mkdir()
    path = run / "x.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [STEP, MEMCPY, bad]}))
    age(str(path))
    tk.analyze(str(run))  # no TypeError, AttributeError or Finding(share=nan)
