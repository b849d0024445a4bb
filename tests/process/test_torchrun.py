"""Under torchrun every rank writes its own run, ``<logdir>/rank<N>``, and nothing else."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ._util import REPO, SCRIPTS, child_env, event_files, free_port, read_scalars, steps_of

STEPS = 6
FSDP2 = pytest.mark.skipif(
    not hasattr(__import__("importlib").import_module("torch.distributed.fsdp"), "fully_shard"),
    reason="FSDP2 (torch.distributed.fsdp.fully_shard) is public from torch 2.6")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wrap", ["ddp", pytest.param("fsdp2", marks=[pytest.mark.slow, FSDP2])])
def test_each_rank_writes_its_own_run(tmp_path, wrap):
    logdir = tmp_path / wrap
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPTS / "ddp_train.py"), str(logdir), str(STEPS), wrap]
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for rank in (0, 1):
        assert f"rank {rank} wrote {logdir / f'rank{rank}'}" in proc.stdout, proc.stdout

    assert sorted(p.name for p in logdir.iterdir()) == ["rank0", "rank1"]
    counts = []
    for rank in (0, 1):
        run = logdir / f"rank{rank}"
        assert all(p.is_file() for p in run.iterdir()), list(run.iterdir())
        assert len(event_files(run)) == 1, list(run.iterdir())
        scalars = read_scalars(run)
        steps = steps_of(scalars, "trainkit/step_time_ms")
        assert steps == list(range(1, STEPS + 1)), (rank, steps)
        assert steps_of(scalars, "loss") == list(range(1, STEPS + 1)), rank
        counts.append(len(steps))
    assert counts[0] == counts[1] == STEPS
