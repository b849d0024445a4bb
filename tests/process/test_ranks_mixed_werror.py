"""Under ``python -W error``, the warning that the ranks of a process group begun after the
session share its folder is said: from the writer thread it was raised into the thread's own
``except Exception: pass`` and lost; from the close, with the close's other warnings, each is said
once the session is fully closed, the first raised (the error asked for) and the others shown,
where the first raised skipped them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ._util import REPO, SCRIPTS, child_env, free_port, read_scalars, steps_of

SAID = "tk.session began before torch.distributed.init_process_group"


def _run(logdir, mode, **env):
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(SCRIPTS / "ranks_mixed_werror.py"), str(logdir), mode,
         str(free_port())],
        cwd=str(REPO), env=dict(child_env(), OMP_NUM_THREADS="1", **env), capture_output=True,
        text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.timeout(120)
def test_the_writer_thread_says_the_ranks_share_the_folder(tmp_path):
    proc = _run(tmp_path / "run", "writer")
    assert proc.stderr.count(SAID) == 1, proc.stderr[-5000:]
    assert "this rank (1)" in proc.stderr and "raised" not in proc.stdout
    assert "closed: True True True [] []" in proc.stdout, proc.stdout
    assert steps_of(read_scalars(tmp_path / "run"), "loss") == [2, 3, 4]  # logged after each step


@pytest.mark.timeout(120)
def test_the_close_raises_its_first_warning_once_closed_and_shows_the_others(tmp_path):
    proc = _run(tmp_path / "run", "close", TRAINKIT_TECHNIQUES='{"fuse": true}')
    raised = [line for line in proc.stdout.splitlines() if line.startswith("raised")]
    assert len(raised) == 1 and raised[0].startswith(
        "raised RuntimeWarning: trainkit: this session counted no step"), proc.stdout
    assert proc.stderr.count(SAID) == 1, proc.stderr[-5000:]  # shown, after it
    assert proc.stderr.count("TRAINKIT_TECHNIQUES sets 'fuse'") == 1, proc.stderr[-5000:]
    # closed in full before it was raised: no session, SIGTERM's handler back, no writer
    # thread, no file open in the run's folder; and what was logged is written
    assert "closed: True True True [] []" in proc.stdout, proc.stdout
    assert read_scalars(tmp_path / "run")["loss"] == [(1, 1.5)]
