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


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad,said", [
    (["--epochs", "0"], "trainkit demo: --epochs 0: must be a positive int, e.g. --epochs 2\n"),
    (["--epochs", "x"], "trainkit demo: error: argument --epochs: invalid int value: 'x'\n"),
])
def test_a_usage_error_is_said_once_and_every_rank_exits_2(tmp_path, bad, said):
    """Each rank printed it (argparse's usage too), and a rank torchrun ended once another had
    exited could exit -15. Now the first rank says it, and every rank exits 2."""
    proc = _torchrun_demo(tmp_path / "demo", *bad)
    assert proc.returncode != 0
    assert proc.stderr.count(said) == 1, proc.stderr[-5000:]
    assert proc.stderr.count("usage: trainkit demo") == (1 if bad[1] == "x" else 0)
    codes = re.findall(r"^\s+exitcode\s+: (-?\d+)", proc.stderr, re.M)  # torchrun's summary
    assert codes == ["2", "2"], proc.stderr[-5000:]
    assert not (tmp_path / "demo").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_subcommand_prints_the_help_once_and_every_rank_exits_2():
    """`torchrun ... -m trainkit` with no subcommand printed the help from every rank; now the
    first rank prints it (to stdout, as without torchrun) and every rank exits 2."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "trainkit"]
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0
    assert proc.stdout.count("usage: trainkit") == 1, proc.stdout + proc.stderr[-5000:]
    assert "usage: trainkit" not in proc.stderr, proc.stderr[-5000:]
    codes = re.findall(r"^\s+exitcode\s+: (-?\d+)", proc.stderr, re.M)  # torchrun's summary
    assert codes == ["2", "2"], proc.stderr[-5000:]


def test_a_rank_that_is_not_first_prints_no_help(monkeypatch, capsys):
    """No subcommand, without torchrun's store: the first rank prints the help, the others exit
    2 silently (before, each printed it)."""
    from trainkit import cli

    _rank(monkeypatch, 1)
    assert cli.main([]) == 2
    assert capsys.readouterr() == ("", "")
    _rank(monkeypatch, 0)
    assert cli.main([]) == 2
    out = capsys.readouterr()
    assert out.out.startswith("usage: trainkit") and out.err == ""

def _rank(monkeypatch, rank, store_port=None):
    for name, value in (("RANK", str(rank)), ("WORLD_SIZE", "2"), ("LOCAL_RANK", str(rank))):
        monkeypatch.setenv(name, value)
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    if store_port is not None:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(store_port))


def test_a_rank_that_is_not_first_says_no_usage_error(monkeypatch, capsys):
    """Without torchrun's store (another launcher, which ends no rank): the others exit 2 at
    once and silently; before, each printed the error (argparse: its usage too)."""
    from trainkit import cli

    _rank(monkeypatch, 1)
    assert cli.main(["demo", "--epochs", "0"]) == 2
    assert cli.main(["demo", "--epochs", "x"]) == 2
    assert capsys.readouterr() == ("", "")
    _rank(monkeypatch, 0)
    assert cli.main(["demo", "--epochs", "0"]) == 2
    assert capsys.readouterr().err == "trainkit demo: --epochs 0: must be a positive int, e.g. --epochs 2\n"


def test_ranks_meet_in_torchruns_store_and_one_not_met_says_it_itself(monkeypatch, capsys):
    """In torchrun's store a rank checks in and leaves (os._exit(2)) once every rank has: the
    first rank says the error once; a rank the others never meet (an error of its own) says
    it itself after USAGE_WAIT."""
    import datetime
    import os
    import signal

    from torch.distributed import TCPStore

    from trainkit import _usage, cli

    said = "trainkit demo: --epochs 0: must be a positive int, e.g. --epochs 2\n"
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=30))

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setattr(_usage, "USAGE_WAIT", 0.3)
    before = signal.getsignal(signal.SIGTERM)
    try:
        for rank, out in ((1, said), (0, said)):  # alone: the other rank never checks in
            _rank(monkeypatch, rank, port)
            monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(rank))  # a key of its own
            with pytest.raises(SystemExit) as exc:
                cli.main(["demo", "--epochs", "0"])
            assert exc.value.code == 2 and capsys.readouterr().err == out
        store.add("trainkit/usage_error/7", 1)  # the other rank has checked in: rank 1 is quiet
        _rank(monkeypatch, 1, port)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "7")
        with pytest.raises(SystemExit) as exc:
            cli.main(["demo", "--epochs", "x"])
        assert exc.value.code == 2 and capsys.readouterr() == ("", "")
    finally:
        signal.signal(signal.SIGTERM, before)


_DDP_LEFT = r"""
import gc, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from trainkit.demo import DemoConfig, run

gc.disable()  # what a collection would free by chance stays until the interpreter's exit
run(DemoConfig(logdir=sys.argv[1], epochs=1, train_size=128, val_size=64, progress=False))
left = [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
print("DDP left:", len(left), "process group:", dist.is_initialized())
"""


@pytest.mark.timeout(120)
def test_the_ddp_wrapper_is_freed_before_the_process_group_ends(tmp_path):
    """DDP sits in a reference cycle and holds gloo's process group: left to a collection at
    the interpreter's exit, gloo's threads end with it there and can abort the process
    ("terminate called without an active exception", exit -6, seen once in CI). The demo
    frees it before it ends the process group."""
    env = child_env()
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _DDP_LEFT, str(tmp_path / "run")], cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "DDP left: 0 process group: False" in proc.stdout, proc.stdout + proc.stderr[-3000:]
