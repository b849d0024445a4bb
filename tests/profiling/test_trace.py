"""Traces driven by the patched optimizer's steps: where they go, what they hold, what it costs."""
from __future__ import annotations

import contextlib
import gzip
import json
import os

import pytest

import trainkit as tk
from trainkit.profiling.tracefiles import read_trace

from .conftest import train


def _traces(logdir: str) -> list:
    return sorted(f for f in os.listdir(logdir) if ".pt.trace.json" in f)


def test_one_trace_per_cycle_in_the_logdir_that_parses(logdir):
    train(logdir, steps=10, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2))
    names = _traces(logdir)
    assert len(names) == 2, names
    for name in names:
        assert name.endswith(".pt.trace.json")
        events = read_trace(os.path.join(logdir, name))
        labels = {e.get("name") for e in events if e.get("cat") == "user_annotation"}
        steps = {n for n in labels if n.startswith("ProfilerStep#")}
        assert len(steps) == 2, labels
        # the trainkit stages and the user's regions are named in the trace
        assert {"trainkit/optimizer_step", "trainkit/data_wait", "forward", "backward"} <= labels


def test_to_device_is_named_in_traces(logdir):
    import torch

    train(logdir, steps=4, profile=tk.ProfileSchedule(wait=0, warmup=0, active=2),
          each_step=lambda: tk.to_device(torch.ones(4), "meta"))
    (name,) = _traces(logdir)
    assert "trainkit/to_device" in {e.get("name") for e in read_trace(os.path.join(logdir, name))}


def test_gzip_option_writes_compressed_traces(logdir):
    train(logdir, steps=6, profile=tk.ProfileSchedule(wait=0, warmup=1, active=2, gzip=True))
    (name,) = _traces(logdir)
    assert name.endswith(".pt.trace.json.gz")
    with gzip.open(os.path.join(logdir, name), "rt") as fh:
        assert json.load(fh)["traceEvents"]


def test_profiling_off_means_no_profiler_object(logdir):
    s = tk.session(logdir=logdir, system_metrics=False)
    try:
        assert s._profiler is None
    finally:
        s.close()
    assert _traces(logdir) == []


def test_outside_the_active_window_nothing_is_recorded(logdir):
    from trainkit.profiling.regions import profiler_enabled

    seen = []
    with pytest.warns(UserWarning, match=r"wrote no trace: the session ended after 5 step\(s\), "
                                         r"before the schedule's first profiled one"):
        train(logdir, steps=5, profile=tk.ProfileSchedule(wait=10**6, warmup=0, active=1),
              each_step=lambda: seen.append(profiler_enabled()))
    assert not any(seen)
    assert _traces(logdir) == []


def test_a_cycle_cut_short_by_close_is_written(logdir):
    train(logdir, steps=4, profile=tk.ProfileSchedule(wait=1, warmup=0, active=100))
    assert len(_traces(logdir)) == 1


@pytest.mark.parametrize("kwargs", [dict(wait=0, warmup=0, active=0), dict(wait=-1, warmup=0, active=1),
                                    dict(wait=0, warmup=-2, active=1), dict(wait=0, warmup=0, active=1, repeat=0),
                                    ])
def test_bad_schedules_are_rejected_with_the_value(kwargs):
    with pytest.raises(ValueError, match=r"ProfileSchedule\(\w+=.*must be an int >= "):
        tk.ProfileSchedule(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(wait=0, warmup=0, active=1.5), dict(wait=True, warmup=0, active=1)])
def test_schedules_of_the_wrong_type_are_a_type_error(kwargs):  # more in test_schedule.py
    with pytest.raises(TypeError, match=r"ProfileSchedule\(\w+=.*must be an int "):
        tk.ProfileSchedule(**kwargs)


def test_bad_gzip_is_rejected():
    with pytest.raises(TypeError, match="gzip='yes'"):
        tk.ProfileSchedule(wait=0, warmup=0, active=1, gzip="yes")


def _user_steps(n, *, opt=None, start_at=None, stop_at=None, prof=None):
    """n steps with a "user_fwd" range; starts/stops ``prof`` (the user's own profiler) on the way."""
    import torch

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tk.patch(opt)
    for i in range(n):
        if i == start_at:
            prof.__enter__()
        with torch.profiler.record_function("user_fwd"):
            loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i == stop_at:
            prof.__exit__(None, None, None)


def _user_fwd_count(prof):
    return sum(e.count for e in prof.key_averages() if e.key == "user_fwd")


def test_profile_is_refused_while_the_users_profiler_records(logdir):
    import torch

    with torch.profiler.profile() as prof:
        with pytest.raises(RuntimeError, match=r"session\(profile=ProfileSchedule\(wait=1, .*a torch "
                                               r"profiler is already recording.*Drop profile="):
            tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2))
        # refused before anything started: no folder, no session
        assert not os.path.exists(logdir) and tk.active() is None
        with tk.session(logdir=logdir, system_metrics=False):  # without profile= it is fine
            _user_steps(6)
    assert _user_fwd_count(prof) == 6  # the user's profile kept its events


def test_a_profiler_the_user_starts_during_the_wait_is_kept(logdir):
    import torch

    prof = torch.profiler.profile()
    with pytest.warns(UserWarning, match=r"a torch profiler you started is recording at step 3.*"
                                         r"trainkit writes no more traces"):
        with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=3, warmup=1, active=3),
                        system_metrics=False):
            _user_steps(12, start_at=2, stop_at=8, prof=prof)
    assert _user_fwd_count(prof) == 7  # before: trainkit's warmup cancelled it (0 events)
    assert _traces(logdir) == []


def _a_profiler_starts_while_another_warms_up():
    """torch 2.14 lets a profiler start while another one warms up (and cancels that one); torch
    2.11 refuses it, whosever the first one is ("Can't disable Kineto profiler when it's not
    running", from the second one's start)."""
    import warnings

    import torch

    first = torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=2, active=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.__enter__()
        try:
            with torch.profiler.profile():
                pass
        except RuntimeError:
            return False
        finally:
            first.__exit__(None, None, None)
    return True


def test_a_profiler_the_user_starts_during_the_warmup_is_kept(logdir):
    import torch

    if not _a_profiler_starts_while_another_warms_up():
        pytest.skip("this torch refuses to start a profiler while another warms up (torch 2.11: "
                    "the user's own start fails), so trainkit cannot keep it")
    prof = torch.profiler.profile()
    with pytest.warns(UserWarning, match="a torch profiler you started is recording"):
        with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=1, warmup=4, active=2),
                        system_metrics=False):
            _user_steps(12, start_at=2, stop_at=8, prof=prof)
    assert _user_fwd_count(prof) == 7
    assert _traces(logdir) == []


def test_no_counted_step_warns_that_no_trace_was_written(logdir):
    import torch

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # not patched: nothing counts the steps
    with pytest.warns(UserWarning, match=r"wrote no trace: the session counted no step.*"
                                         r"tk\.patch\(optimizer\).*tk\.patch\(loader\)"):
        with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2),
                        system_metrics=False):
            for _ in range(8):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    assert _traces(logdir) == []


def test_an_exception_before_any_step_does_not_add_the_no_trace_warning(logdir, recwarn):
    with pytest.raises(KeyError):
        with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2),
                        system_metrics=False):
            raise KeyError("boom")
    assert not [w for w in recwarn if "wrote no trace" in str(w.message)]


def test_repeated_cycles_do_not_pass_on_torchs_acc_events_warning(logdir):
    import warnings

    import torch
    import torch.profiler.profiler as tpp

    def forget():  # torch warns once per process: make it warn again
        shown = getattr(tpp, "_WARNINGS_SHOWN", None)
        if isinstance(shown, set):
            shown.difference_update([m for m in list(shown) if "clears events" in m])

    forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(logdir, steps=10, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2))
    assert len(_traces(logdir)) == 2  # one trace per cycle: nothing is cleared before it is written
    assert not [w for w in caught if "clears events" in str(w.message)], [str(w.message) for w in caught]
    import inspect

    if "clears events" not in inspect.getsource(tpp):
        return  # a torch without the warning (2.4 and older): nothing of torch's to pass on
    # a profiler of the user's still gets torch's warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=2)
        with torch.profiler.profile(schedule=sched, on_trace_ready=lambda p: None) as prof:
            for _ in range(4):
                torch.ones(2).sum()
                prof.step()
    assert [w for w in caught if "clears events" in str(w.message)]


@pytest.mark.filterwarnings("ignore:trainkit. the event file:RuntimeWarning")  # removed too
@pytest.mark.filterwarnings("ignore:trainkit. writing the run:RuntimeWarning")  # a file there
@pytest.mark.parametrize("then", ["removed", "a file"])
def test_a_cycle_ending_after_the_run_folder_went_is_no_error_in_the_step(tmp_path, then):
    """The folder removed mid-run (a clean-up of old runs that caught this one): the cycle's end,
    inside optimizer.step(), raised FileNotFoundError into the training. Now the folder is made
    again and the trace written; where it cannot be (a file in its place), that is said."""
    import shutil

    import torch

    logdir = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=logdir, system_metrics=False,
                    profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2)):
        for i in range(10):
            model(torch.ones(2, 4)).sum().backward()
            if i == 2:  # in the first cycle's active steps
                shutil.rmtree(logdir)
                if then == "a file":
                    logdir.write_text("not a folder")
            with pytest.warns(UserWarning, match=r"profiler trace .* could not be written") \
                    if then == "a file" and i == 3 else contextlib.nullcontext() as said:
                opt.step()  # the first cycle ends in this one
            if said is not None:  # it points at this step() call, not into torch's profiler
                assert [w.filename for w in said if "could not be written" in str(w.message)] \
                    == [__file__]
            opt.zero_grad()
    if then == "removed":
        assert len(_traces(logdir)) == 2  # both cycles written
