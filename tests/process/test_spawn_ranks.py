"""Ranks started by torch.multiprocessing.spawn (no RANK set) write a run each, as under torchrun,
once the process group exists; a session opened before it says that the ranks share its folder.
Both ranks wrote into one folder before, their steps mixed in one TensorBoard run, unsaid."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ._util import REPO, SCRIPTS, child_env, event_files, free_port, read_scalars, steps_of

STEPS = 5


def _spawn(logdir, order):
    cmd = [sys.executable, str(SCRIPTS / "spawn_ranks.py"), str(logdir), str(STEPS),
           str(free_port()), order]
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.timeout(120)
def test_spawned_ranks_opened_after_init_process_group_write_a_run_each(tmp_path):
    logdir = tmp_path / "runs"
    proc = _spawn(logdir, "after")
    for rank in (0, 1):
        assert f"rank {rank} wrote {logdir / f'rank{rank}'}" in proc.stdout, proc.stdout
    assert sorted(p.name for p in logdir.iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        run = logdir / f"rank{rank}"
        assert len(event_files(run)) == 1, list(run.iterdir())
        scalars = read_scalars(run)
        assert steps_of(scalars, "trainkit/step_time_ms") == list(range(1, STEPS + 1))
        assert steps_of(scalars, "loss") == list(range(1, STEPS + 1))
    assert "began before" not in proc.stderr


@pytest.mark.timeout(120)
def test_a_session_opened_before_init_process_group_says_the_ranks_share_its_folder(tmp_path):
    logdir = tmp_path / "runs"
    proc = _spawn(logdir, "before")
    said = [line for line in proc.stderr.splitlines()
            if "tk.session began before torch.distributed.init_process_group" in line]
    assert len(said) == 2, proc.stderr[-5000:]  # a warning from each rank
    assert {f"this rank ({r})" in " ".join(said) for r in (0, 1)} == {True}
    assert "open tk.session after init_process_group" in said[0]
