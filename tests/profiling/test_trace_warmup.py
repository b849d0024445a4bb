"""ProfileSchedule(warmup=0): torch's warning ("Profiler won't be using warmup") pointed at
trainkit/profiling/trace.py; trainkit now says it itself, once, at the user's line."""
from __future__ import annotations

import os
import warnings

import trainkit as tk

from .conftest import train


def _about_warmup(caught: list) -> list:
    return [w for w in caught if "won't be using warmup" in str(w.message)
            or "no warm-up step" in str(w.message)]


def _session(logdir: str, warmup: int) -> None:
    with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=1, warmup=warmup, active=1),
                    system_metrics=False):
        pass


def test_warmup_0_is_said_once_at_the_users_line(logdir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _session(logdir, 0)
    said = _about_warmup(caught)
    assert len(said) == 1, [(str(w.message), w.filename) for w in said]
    (w,) = said
    assert w.filename == __file__ and issubclass(w.category, UserWarning)
    assert "ProfileSchedule(wait=1, warmup=0, active=1" in str(w.message)
    assert "warmup=1" in str(w.message)  # the fix
    package = os.path.dirname(os.path.abspath(tk.__file__)) + os.sep  # not a checkout's folder
    assert not [w for w in caught if os.path.abspath(w.filename).startswith(package)]


def test_warmup_1_says_nothing_and_the_traces_are_unchanged(logdir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _session(logdir, 1)
        train(logdir + "2", steps=4, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2))
    assert not _about_warmup(caught)
    assert [f for f in os.listdir(logdir + "2") if f.endswith(".pt.trace.json")]
