"""Each trace names the session that wrote it, and a folder's traces are assigned by that name.

A folder holding several sessions (a rerun, a resumed relaunch) is analyzed as TensorBoard shows
it, and its traces went with the sessions by clock times alone: the time in a trace's name against
each session's first event's wall time. That misassigns a trace where two sessions write into one
folder at once (two processes launched with the same logdir: a trace of the earlier one written
after the later one started) and where a relaunch runs on a machine whose clock differs (a shared
filesystem on a cluster). Each trace now records its session's event file (``session_file`` in
its top-level ``"trainkit"`` metadata), read from the trace's head alone, and a trace naming a
session of the folder is that session's; a trace naming none goes by clock times, as before.

The sessions are real, and so are their traces; what a second process or another machine's clock
would have made is made by hand, as each test says: a trace renamed to carry the time another
process would have written it at, or a session's event file written again with its wall times
shifted as a machine whose clock is behind writes them.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import struct

import pytest

import trainkit as tk
from trainkit.profiling import analyze as analyze_mod
from trainkit.profiling import eventfiles, runs
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.tracefiles import TraceError, read_trace, read_trace_head
from trainkit.profiling.tracestats import SESSION_FILE, TRACE_META, recorded_session
from trainkit.sinks.tensorboard import masked_crc32c

from .conftest import event_files, next_second, train

PROFILE = tk.ProfileSchedule(wait=1, warmup=1, active=2)
#: wait 1, warm up 1, record 3, four times: a fresh session's steps 3-5, 8-10, 13-15, 18-20
EVERY_5 = tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=4)


def trace_paths(folder):
    """The folder's traces, oldest first (by the time in their names)."""
    return sorted((os.path.join(folder, f) for f in os.listdir(folder) if ".pt.trace.json" in f),
                  key=runs.trace_time)


def names(paths):
    return sorted(os.path.basename(p) for p in paths)


def start_of(folder, event_file):
    return runs.session_start(os.path.join(folder, event_file))


_TRACE_NAME = re.compile(r"^(.*)\.(\d{19})(\.pt\.trace\.json(?:\.gz)?)$")


def retime(path, when):
    """Rename the trace ``path`` to carry the time ``when`` (seconds), as torch.profiler names a
    trace written then (``<worker>.<time_ns>.pt.trace.json``); returns the new path."""
    folder, name = os.path.split(path)
    m = _TRACE_NAME.match(name)
    assert m, name
    new = os.path.join(folder, f"{m.group(1)}.{int(when * 1e9)}{m.group(3)}")
    os.replace(path, new)
    assert runs.trace_time(new) == pytest.approx(when, abs=1e-3)
    return new


def rewrite_meta(path, change):
    """Write the trace ``path`` again with ``change(data)`` applied to its JSON (key order kept:
    the metadata stays before the events, where torch writes them)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    change(data)
    with opener(path, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)


def skew_events(path, seconds):
    """Write the event file ``path`` again with every event's wall time moved by ``seconds``, as
    a machine whose clock is that far off writes it. Its name keeps its second: its place in
    TensorBoard's order (by name), which a relaunch's file keeps wherever the skew is less than
    the time between the sessions' starts (hours on a cluster; a second or two here)."""
    from tensorboard.compat.proto import event_pb2

    out = []
    for payload in eventfiles.event_records(path):
        event = event_pb2.Event.FromString(payload)
        event.wall_time += seconds
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        out.append(header + struct.pack("<I", masked_crc32c(header)) + data
                   + struct.pack("<I", masked_crc32c(data)))
    with open(path, "wb") as fh:
        fh.write(b"".join(out))


def parsed_traces(monkeypatch):
    """The traces the analysis parses whole, as it parses them (analyze.read_trace)."""
    parsed = []
    real = analyze_mod.read_trace

    def reading(path):
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(analyze_mod, "read_trace", reading)
    return parsed


# -- what a trace records ------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_each_trace_names_its_sessions_event_file(tmp_path, gz):
    """Two sessions into one folder (the second resumed): each trace names its own session's
    event file, in the metadata torch writes before the events, read the same from the head
    alone as from the whole trace."""
    logdir = str(tmp_path / "exp")
    schedule = tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2, gzip=gz)
    train(logdir, steps=8, profile=schedule)
    (first,) = event_files(logdir)
    mine = trace_paths(logdir)
    assert len(mine) == 2
    next_second()
    train(logdir, steps=8, steps_done=8, profile=schedule)
    (second,) = set(event_files(logdir)) - {first}
    theirs = [t for t in trace_paths(logdir) if t not in mine]
    assert len(theirs) == 2
    for paths, session in ((mine, first), (theirs, second)):
        for path in paths:
            meta = read_trace(path).meta
            assert meta[TRACE_META][SESSION_FILE] == session
            assert recorded_session(meta) == session
            head = read_trace_head(path)
            assert head[TRACE_META] == meta[TRACE_META]
            assert head == {k: v for k, v in meta.items() if k in head}
            assert "traceEvents" not in head


def test_the_name_is_read_from_the_traces_head_alone(tmp_path):
    """A trace cut short after its head (its events half-written) cannot be parsed, and still
    says which session wrote it: the head is read, not the events."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=8, profile=PROFILE)
    (session,) = event_files(logdir)
    (path,) = trace_paths(logdir)
    with open(path, "rb") as fh:
        data = fh.read()
    at = data.index(b'"traceEvents"')
    with open(path, "wb") as fh:
        fh.write(data[:at + 2000])
    with pytest.raises(TraceError):
        read_trace(path)
    assert recorded_session(read_trace_head(path)) == session
    for junk in (b"", b"[", b'{"traceEvents": [', b"{ not json", b"\x1f\x8b broken"):
        with open(path, "wb") as fh:
            fh.write(junk)
        assert read_trace_head(path) == {}  # nothing named: the clocks decide


# -- assigned by the name, whatever the clocks say ----------------------------------------------

def test_a_trace_written_while_a_rerun_ran_is_the_hidden_sessions(tmp_path, monkeypatch):
    """Two processes launched with the same logdir: the first one's cycle ended a second after
    the second one started (its trace renamed to carry that time, as torch names a trace written
    then). The second is a rerun, which hides the first: by clock times the first one's trace
    was the rerun's and was analyzed with it; it names the first session, and is left out."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=8, profile=PROFILE)
    (a_trace,) = trace_paths(logdir)
    next_second()
    train(logdir, steps=8, profile=PROFILE)
    first, rerun = event_files(logdir)
    (b_trace,) = [t for t in trace_paths(logdir) if t != a_trace]
    a_trace = retime(a_trace, start_of(logdir, rerun) + 1.0)
    assert runs.trace_time(a_trace) > start_of(logdir, rerun)  # the clocks say: the rerun's

    run = runs.load_run(logdir, logdir)
    assert run.hidden == (first,)
    assert run.earlier_traces == (a_trace,) and run.traces == (b_trace,)
    assert run.trace_sessions == {a_trace: first, b_trace: rerun}
    parsed = parsed_traces(monkeypatch)
    rep = analyze_run(logdir, logdir)
    assert parsed == [b_trace]  # the one left out is never parsed, the other once
    assert names(rep.earlier_traces) == names([a_trace]) and names(rep.traces) == names([b_trace])
    assert rep.profiled.ranges() == [(3, 4)] and rep.profiled.traces == 1
    (f,) = [f for f in rep.findings if f.code == "TA111"]
    assert "and 1 trace(s) are left out" in f.evidence


def test_a_relaunch_on_a_machine_whose_clock_is_behind_leaves_out_the_steps_it_redid(
        tmp_path, monkeypatch):
    """20 steps profiled every 5, then resumed from the checkpoint of step 9 on a machine whose
    clock is behind (its event file's wall times and its traces' names moved back, to just
    before the first session's first trace): by clock times every trace of the stopped session
    was written after the resumed one started, and all were analyzed, steps 10-20 twice. They
    name the stopped session, whose steps from 10 on the resumed one counted again."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=20, profile=EVERY_5)
    stopped_traces = trace_paths(logdir)
    assert len(stopped_traces) == 4
    next_second()
    train(logdir, steps=11, steps_done=9, profile=EVERY_5)
    stopped, resumed = event_files(logdir)
    behind = start_of(logdir, resumed) - runs.trace_time(stopped_traces[0]) + 1.0
    skew_events(os.path.join(logdir, resumed), -behind)
    resumed_traces = [retime(t, runs.trace_time(t) - behind)
                      for t in trace_paths(logdir) if t not in stopped_traces]
    assert len(resumed_traces) == 2
    assert all(runs.trace_time(t) > start_of(logdir, resumed) for t in stopped_traces)

    parsed = parsed_traces(monkeypatch)
    rep = analyze_run(logdir, logdir)
    assert sorted(parsed) == sorted(stopped_traces + resumed_traces)
    assert names(rep.earlier_traces) == names(stopped_traces[1:])  # steps 8-10, 13-15, 18-20
    assert names(rep.traces) == names(stopped_traces[:1] + resumed_traces)
    assert rep.profiled.ranges() == [(3, 5), (12, 14), (17, 19)]
    assert "TA111" not in [f.code for f in rep.findings]
    run = runs.load_run(logdir, logdir)
    assert run.hidden == () and run.redone == {stopped: 10}


def test_a_relaunch_on_a_machine_whose_clock_is_behind_keeps_its_traces(tmp_path):
    """A run, its rerun (which hides it), and the rerun resumed from its step 4 on a machine
    whose clock is behind, so much that the resumed session's trace carries a time before the
    rerun started (its event file and trace moved back alike): by clock times that trace was an
    earlier session's and was left out; it names the resumed session, shown, and is its."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=8, profile=PROFILE)
    next_second()
    train(logdir, steps=8, profile=PROFILE)
    next_second()
    before = trace_paths(logdir)
    train(logdir, steps=4, steps_done=4, profile=PROFILE)
    first, rerun, resumed = event_files(logdir)
    (c_trace,) = [t for t in trace_paths(logdir) if t not in before]
    behind = runs.trace_time(c_trace) - start_of(logdir, rerun) + 1.0
    skew_events(os.path.join(logdir, resumed), -behind)
    c_trace = retime(c_trace, runs.trace_time(c_trace) - behind)
    assert runs.trace_time(c_trace) < start_of(logdir, rerun)  # the clocks say: a hidden one's

    run = runs.load_run(logdir, logdir)
    assert run.hidden == (first,)
    a_trace, b_trace = before
    assert run.earlier_traces == (a_trace,) and set(run.traces) == {b_trace, c_trace}
    assert run.trace_sessions[c_trace] == resumed
    rep = analyze_run(logdir, logdir)
    assert rep.profiled.ranges() == [(3, 4), (7, 8)]
    assert names(rep.earlier_traces) == names([a_trace])


# -- a trace naming no session of the folder goes by clock times ---------------------------------

def _without_session(data):
    del data[TRACE_META][SESSION_FILE]


def _without_trainkit_meta(data):
    del data[TRACE_META]


#: an event file's name that no file of the test's folder has
ELSEWHERE = "events.out.tfevents.1700000000.elsewhere.7.000001"


def _naming_another_file(data):
    data[TRACE_META][SESSION_FILE] = ELSEWHERE


@pytest.mark.parametrize("old", [_without_session, _without_trainkit_meta, _naming_another_file],
                         ids=["no_session_file", "no_trainkit_meta", "another_folders_file"])
def test_a_trace_naming_no_session_here_goes_by_clock_times(tmp_path, monkeypatch, old):
    """The run's three traces and a rerun's. Two of the run's traces name no session of the
    folder: written by trainkit before traces named their session, by torch before 2.1 (no
    trainkit metadata at all), or naming an event file not in the folder (deleted since, another
    folder's). The first, written before the rerun started, is left out by clock times; the
    second, renamed to carry a time after the rerun started (written by a process still running
    then), is taken for the rerun's by clock times, as nothing says otherwise. The third,
    renamed alike, names the run's session: left out."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=12, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=3))
    a1, a2, a3 = trace_paths(logdir)
    next_second()
    train(logdir, steps=8, profile=PROFILE)
    first, rerun = event_files(logdir)
    (b,) = [t for t in trace_paths(logdir) if t not in (a1, a2, a3)]
    for path in (a1, a2):
        rewrite_meta(path, old)
        assert recorded_session(read_trace_head(path)) in (None, ELSEWHERE)
    started = start_of(logdir, rerun)
    a2, a3 = retime(a2, started + 1.0), retime(a3, started + 2.0)

    run = runs.load_run(logdir, logdir)
    assert run.hidden == (first,)
    assert run.earlier_traces == (a1, a3)
    assert set(run.traces) == {a2, b}
    assert run.trace_sessions == {a3: first, b: rerun}
    parsed = parsed_traces(monkeypatch)
    rep = analyze_run(logdir, logdir)
    assert sorted(parsed) == sorted([a2, b])
    assert names(rep.earlier_traces) == names([a1, a3])


def test_a_profiler_without_preset_metadata_json_still_traces(tmp_path, monkeypatch):
    """torch before 2.1 has no ``preset_metadata_json``: the session profiles all the same, its
    traces record no trainkit metadata, and the analysis reads them by clock times beside a
    rerun's named trace."""
    import torch.profiler.profiler as tpp

    logdir = str(tmp_path / "exp")
    with monkeypatch.context() as m:
        m.delattr(tpp._KinetoProfile, "preset_metadata_json")
        train(logdir, steps=8, profile=PROFILE)
    (old,) = trace_paths(logdir)
    assert TRACE_META not in read_trace(old).meta and read_trace_head(old)
    next_second()
    train(logdir, steps=8, profile=PROFILE)
    first, rerun = event_files(logdir)
    (new,) = [t for t in trace_paths(logdir) if t != old]
    run = runs.load_run(logdir, logdir)
    assert run.earlier_traces == (old,) and run.traces == (new,)
    assert run.trace_sessions == {new: rerun}
