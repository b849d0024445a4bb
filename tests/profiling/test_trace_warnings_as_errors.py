"""The profiler's warnings where warnings are errors (``python -W error``, pytest's
``filterwarnings = error``): what trainkit's tracing goes on without (a trace not written, traces
given up for the user's own profiler) is shown, never raised inside ``optimizer.step()``, where it
stopped the training; what the close says is said once the session is closed, as itself."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import warnings

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def _steps(opt, model, n, *, at=None, then=lambda: None):
    done = 0
    for i in range(n):
        model(torch.ones(2, 4)).sum().backward()
        if i == at:
            then()
        opt.step()
        done += 1
        opt.zero_grad()
    return done


def test_a_trace_that_cannot_be_written_stops_no_training(tmp_path):
    logdir = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))

    def replace_the_folder():  # in the first cycle's active steps: no trace can be written
        shutil.rmtree(logdir)
        logdir.write_text("not a folder")

    done = 0
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        # The close's own warning is the error asked for: raised, once the session is closed.
        with pytest.raises(UserWarning, match=r"wrote no trace: 2 cycle\(s\) ended, but their "
                                              r"traces could not be written"):
            with tk.session(logdir=logdir, system_metrics=False,
                            profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2)):
                done = _steps(opt, model, 10, at=2, then=replace_the_folder)
    tk.unpatch(opt)
    assert done == 10  # before: the trace's warning, raised in the 4th step, ended the loop
    said = [w for w in shown if "a profiler trace of step" in str(w.message)]
    assert [str(w.message).split(" could")[0] for w in said] == [
        "trainkit: a profiler trace of step 4", "trainkit: a profiler trace of step 8"]
    assert "the training goes on" in str(said[0].message)
    assert {w.filename for w in said} == {__file__}  # at the user's step() call
    assert tk.active() is None


def test_a_profiler_of_the_users_stops_no_training(tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    prof = torch.profiler.profile()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        with tk.session(logdir=tmp_path / "run", system_metrics=False,
                        profile=tk.ProfileSchedule(wait=3, warmup=1, active=3)):
            done = _steps(opt, model, 6, at=2, then=prof.__enter__)
        prof.__exit__(None, None, None)
    tk.unpatch(opt)
    assert done == 6  # before: trainkit standing down for it raised in the 3rd step
    assert [w.filename for w in shown if "a torch profiler you started is recording at step 3"
            in str(w.message)] == [__file__]


def test_the_close_says_its_warnings_once_closed_the_first_raised_as_itself(tmp_path,
                                                                            monkeypatch):
    """The close's no-trace warning, raised inside the profiler's close, was taken for a trace
    that failed to be written ("the profiler's last trace could not be written (UserWarning:
    ...wrote no trace"); the close's later warning (a misspelled TRAINKIT_TECHNIQUES) was never
    said. Now every one is said once the session is closed: the first raised, the others shown."""
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fuse": true}')
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    handler = signal.getsignal(signal.SIGTERM)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        with pytest.raises(UserWarning) as info:
            with tk.session(logdir=tmp_path / "run", system_metrics=False,
                            profile=tk.ProfileSchedule(wait=10, warmup=1, active=1)) as s:
                _steps(opt, model, 2)
                s.log("loss", 1.5)
    tk.unpatch(opt)
    assert type(info.value) is UserWarning
    assert str(info.value).startswith("trainkit: tk.session(profile=ProfileSchedule(wait=10, ")
    assert "wrote no trace: the session ended after 2 step(s)" in str(info.value)
    assert [str(w.message)[:42] for w in shown] == [
        "trainkit: TRAINKIT_TECHNIQUES sets 'fuse',"]
    assert shown[0].filename == __file__
    # closed in full before the warning was raised
    assert s.closed and tk.active() is None
    assert signal.getsignal(signal.SIGTERM) is handler
    assert not [t for t in threading.enumerate() if t.name == "trainkit-writer"]
    assert not [f for f in _open_files() if f.startswith(str(tmp_path))]  # the event file
    assert scalars(tmp_path / "run")["loss"] == [(3, 1.5)]


def _open_files():
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return names
