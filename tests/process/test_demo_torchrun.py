"""``trainkit demo`` under torchrun: data-parallel, one run per rank, each rank's own numbers."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ._util import REPO, child_env, event_files, free_port


def _torchrun_demo(logdir, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "trainkit", "demo", "--logdir", str(logdir), "--epochs", "1",
           "--train-size", "320", "--no-progress", *args]
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU wherever the test runs
    return subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=170)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_two_ranks_train_data_parallel_and_a_rerun_counts_its_own_steps(tmp_path):
    """Each rank writes <logdir>/rank<N>, and the demo compared the event files of <logdir>: run
    again into the same folder, each rank said 10 steps for 5. Each rank also trained alone on all
    the data (5 steps) and every rank printed its own summary."""
    logdir = tmp_path / "demo"
    for run in (1, 2):
        proc = _torchrun_demo(logdir)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        out = proc.stdout
        # 320 images over 2 ranks in batches of 64: 3 steps each
        got = re.findall(r"^  rank (\d): (\d+) optimizer steps?, .*validation accuracy ([\d.]+)%$",
                         out, re.M)
        assert [(r, s) for r, s, _ in got] == [("0", "3"), ("1", "3")], out
        assert got[0][2] == got[1][2], out  # one model: DDP kept the replicas equal
        assert out.count("TensorBoard runs, one per rank: ") == 1, out
        assert f"{logdir / 'rank0'}, {logdir / 'rank1'}" in out
        assert f"tensorboard --logdir {logdir} " in out
        assert sorted(p.name for p in logdir.iterdir()) == ["rank0", "rank1"]
        for rank in (0, 1):
            assert len(event_files(logdir / f"rank{rank}")) == run


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_ranks_on_made_as_used_data_stop_together(tmp_path):
    """A --train-size made block by block and --max-seconds: the ranks agree on the last step."""
    proc = _torchrun_demo(tmp_path / "big", "--train-size", "10000000", "--max-seconds", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    steps = re.findall(r"^  rank \d: (\d+) optimizer steps?", proc.stdout, re.M)
    assert len(steps) == 2 and steps[0] == steps[1] and int(steps[0]) > 0, proc.stdout
