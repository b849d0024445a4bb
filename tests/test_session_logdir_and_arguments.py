"""Where a session writes and what it refuses before it starts: the default ``runs/<time>_<host>``
folder (one per session started in the same second, one for all the ranks of a torchrun launch),
the ``rank<N>`` folder under torchrun, a logdir that is a file or cannot be created, bad session
arguments and bad technique overrides, each refused with no session left open and nothing made."""
from __future__ import annotations

import os
import socket
import time

import pytest

import trainkit as tk
from tests.conftest import scalars


def test_sessions_without_a_logdir_started_in_the_same_second_get_a_folder_each(tmp_path,
                                                                                monkeypatch):
    """runs/<time>_<host> named by the second: two runs started in one second shared it and
    TensorBoard showed them as one. Under torchrun the ranks still share theirs."""
    import datetime

    from trainkit import _logdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_logdir, "run_start_time", lambda: datetime.datetime(2026, 11, 23, 9, 0, 0))
    with tk.session(system_metrics=False) as first:
        first.log("x", 1.0)
    with tk.session(system_metrics=False) as second:
        second.log("x", 2.0)
    assert second.logdir == first.logdir + "-2"
    assert first.logdir.startswith(os.path.join("runs", "Nov23_09-00-00_"))
    assert scalars(first.logdir)["x"] == [(1, 1.0)] and scalars(second.logdir)["x"] == [(1, 2.0)]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    shared = os.path.join("runs", "shared")
    assert _logdir.fresh_folder(shared) == shared and os.listdir(shared) == ["rank0"]  # claimed


def test_two_default_folder_sessions_of_one_rank_take_a_folder_each(tmp_path, monkeypatch):
    """Under torchrun the ranks share runs/<launcher start>_<host>: a second session in the
    process (fine-tuning after pre-training) wrote into the first's rank folder, its steps from 1
    again hiding the first's as a rerun's do. Each rank claims its rank folder in the first
    folder where it is free, so the ranks agree."""
    import datetime

    from trainkit import _logdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_logdir, "run_start_time", lambda: datetime.datetime(2026, 11, 23, 9, 0, 0))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    roots = []
    for phase in (1.0, 2.0):
        with tk.session(system_metrics=False) as s:
            s.log("phase", phase)
        roots.append(s.root)
    base = os.path.join("runs", "Nov23_09-00-00_" + socket.gethostname())
    assert roots == [base, base + "-2"]
    assert [scalars(os.path.join(r, "rank0"))["phase"] for r in roots] == [[(1, 1.0)], [(1, 2.0)]]
    monkeypatch.setenv("RANK", "1")  # the other rank, opening the same two sessions
    assert [_logdir.default_logdir() for _ in range(2)] == [base, base + "-2"]


def test_a_second_spawn_of_fresh_rank_processes_takes_a_folder_of_its_own(tmp_path):
    # Two mp.spawn calls (pre-training, then fine-tuning) are fresh processes of one launcher,
    # named by its start time: counting sessions per process, both phases shared one folder.
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "from trainkit.session import _default_logdir; print(_default_logdir())"

    def phase():
        got = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                                                  PYTHONPATH=REPO)) for r in (0, 1)]
        assert [p.returncode for p in got] == [0, 0], [p.stderr for p in got]
        return [p.stdout.strip() for p in got]

    first, second = phase(), phase()
    assert first[0] == first[1] and second == [first[0] + "-2"] * 2


def test_a_logdir_under_the_home_folder_is_expanded(tmp_path, monkeypatch):
    """logdir="~/runs/x" writes under the home folder, as the shell and TensorBoard's --logdir
    read it, and makes no folder named "~" in the working folder."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with tk.session(logdir="~/runs/x", system_metrics=False) as s:
        s.log("x", 1.0)
    assert s.logdir == str(home / "runs" / "x")
    assert scalars(s.logdir)["x"] == [(1, 1.0)]
    assert os.listdir(work) == []


@pytest.mark.parametrize("logdir", ["~nouser-trainkit/x", "~nouser-trainkit"])
def test_a_home_folder_of_no_user_is_refused_before_anything_is_made(tmp_path, monkeypatch,
                                                                     logdir):
    """os.path.expanduser leaves "~nouser/x" as it is where there is no user "nouser": the
    session made a folder named "~nouser-trainkit" in the working folder (which a later
    `rm -rf ~nouser...` typed to clean it up reads as a home folder)."""
    import pwd

    with pytest.raises(KeyError):
        pwd.getpwnam("nouser-trainkit")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        tk.session(logdir=logdir)
    said = str(info.value)
    assert said.startswith(f"session(logdir={logdir!r}): there is no user 'nouser-trainkit'")
    assert f"logdir='./{logdir}' for a folder of that name here" in said
    assert os.listdir(tmp_path) == [] and tk.active() is None


def test_ranks_started_seconds_apart_pick_one_default_logdir(tmp_path):
    # Under torchrun every rank writes <logdir>/rank<N> of one logdir: without logdir=, the
    # folder's time is the launcher's (here this process, the parent of both), not the rank's.
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, RANK="0", WORLD_SIZE="2", PYTHONPATH=REPO)
    code = "from trainkit.session import _default_logdir; print(_default_logdir())"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           cwd=tmp_path)  # (each claims its runs/.../rank<N> there)
    time.sleep(1.1)
    second = subprocess.run([sys.executable, "-c", code], env=dict(env, RANK="1"),
                            capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout and first.stdout.startswith("runs" + os.sep)


def test_rank_folder_under_torchrun_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with tk.session(logdir=tmp_path) as s:
        s.log("x", 1.0)
    assert s.logdir == os.path.join(str(tmp_path), "rank1")
    assert scalars(tmp_path / "rank1")["x"] == [(1, 1.0)]


def test_logdir_that_is_a_file_is_refused_before_anything_starts(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"is a file.*pass a folder"):
        tk.session(logdir=f)
    assert tk.active() is None


def test_logdir_that_cannot_be_created_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="cannot create the folder"):
        tk.session(logdir=f / "sub")
    with pytest.raises(ValueError, match="cannot create"):
        tk.session(logdir="/proc/trainkit-nope")


@pytest.mark.parametrize("kwargs, exc, text", [
    ({"logdir": 42}, TypeError, "logdir=42"),
    ({"logdir": "runs/a\0b"}, ValueError, r"logdir='runs/a\\x00b'\): a path cannot hold a NUL"),
    ({"log_every": 0}, ValueError, "log_every=0"),
    ({"flush_secs": -1}, ValueError, "flush_secs=-1"),
    ({"flush_secs": float("nan")}, ValueError, "flush_secs=nan"),
    # the writer would run all the time, the training waiting for the GIL (the floor: 0.05 s)
    ({"flush_secs": 1e-3}, ValueError, r"flush_secs=0.001\): at least 0.05 s.*flush_secs=0.5"),
    ({"flush_secs": 0.049}, ValueError, r"flush_secs=0.049\): at least 0.05 s"),
    ({"system_metrics": "yes"}, TypeError, "system_metrics='yes'"),
    ({"profile": {"wait": 1}}, TypeError, "ProfileSchedule"),
    ({"steps_done": -1}, ValueError, r"steps_done=-1\): .*steps_done=checkpoint\['step'\]"),
    # the wrong type is a TypeError (these were ValueErrors)
    ({"steps_done": True}, TypeError, "steps_done=True"),
    ({"steps_done": 12.0}, TypeError, r"steps_done=12.0\): must be an int, not float"),
    ({"steps_done": "12"}, TypeError, "steps_done='12'"),
    ({"flush_secs": "2"}, TypeError, r"flush_secs='2'\): .*not str, e.g. flush_secs=2"),
    ({"flush_secs": True}, TypeError, "flush_secs=True"),
    ({"log_every": "5"}, TypeError, r"log_every='5'\): .*not str, e.g. log_every=50"),
    ({"log_every": 1.5}, TypeError, "log_every=1.5"),
    ({"log_every": True}, TypeError, "log_every=True"),
])
def test_bad_session_arguments(tmp_path, kwargs, exc, text):
    kwargs.setdefault("logdir", tmp_path / "run")
    with pytest.raises(exc, match=text):
        tk.session(**kwargs)
    assert tk.active() is None
    if "logdir" not in text:
        assert not (tmp_path / "run").exists()  # refused before anything was made


def test_bad_technique_overrides_leave_no_session_open(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"tf32": ')
    with pytest.raises(ValueError, match="TRAINKIT_TECHNIQUES"):
        tk.session(logdir=tmp_path / "run")
    assert tk.active() is None
    assert not (tmp_path / "run").exists()  # refused before anything was created


@pytest.mark.parametrize("given", ["/", "~", "HOME"])
def test_a_session_refuses_the_root_and_the_home_folder_as_its_logdir(tmp_path, monkeypatch, given):
    # tk.session(logdir="~") wrote its event file and meta/ straight into the home folder, which
    # `trainkit demo --logdir ~` refuses; and, as root, logdir="/" into the filesystem root.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    logdir = str(home) if given == "HOME" else given
    what = "the filesystem root" if given == "/" else "your home folder"
    with pytest.raises(ValueError, match=rf"session\(logdir=.*\): is {what}.*e\.g\. logdir="):
        tk.session(logdir=logdir)
    assert sorted(os.listdir(home)) == []  # nothing made there
    assert tk.active() is None
