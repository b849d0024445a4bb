"""trainkit under ``torchrun --nproc_per_node 2`` (gloo), as a user who outgrew one GPU runs it:
an elastic restart (``--max-restarts``) after a rank failed.

The training scripts are written into the test's folder and run with that folder as the working
directory, so that the default logdir (``runs/...``) lands there.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from ._util import REPO, child_env, free_port, read_scalars, steps_of

STEPS = 4

#: Linear(8, 2) in DDP on gloo, STEPS steps under a session with the default logdir; each rank
#: writes its session's logdir into ``logdir.<attempt>.<rank>`` once its session is open. ``FAIL`` says which rank raises
#: in the first attempt, and where: ``early`` (before its session) or ``late`` (after step 2).
RESTART_SCRIPT = textwrap.dedent("""
    import gc, os, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import trainkit as tk

    where, steps = sys.argv[1], int(sys.argv[2])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.set_num_threads(1)
    # Each attempt's own keys in torchrun's store: with the keys the failed attempt left there,
    # torch 2.14's gloo rendezvous of the restarted attempt fails or hangs most of the time,
    # trainkit or not (as pytorch/pytorch#135712 for NCCL).
    store = dist.PrefixStore(f"attempt{attempt}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False))
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fails = attempt == 0 and rank == 1
    if fails and where == "early":
        raise RuntimeError("rank 1 fails before its session")
    with tk.session(system_metrics=False) as s:
        with open(f"logdir.{attempt}.{rank}", "w") as fh:  # (printed, two ranks' lines mixed)
            fh.write(s.logdir)
        tk.patch(opt)
        for i in tk.patch(range(steps)):
            loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8)),
                                                     torch.randint(0, 2, (4,)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
            if fails and where == "late" and i == 1:
                raise RuntimeError("rank 1 fails at its second step")
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()
""")


def _logdirs(folder) -> dict:
    """{(attempt, rank): logdir} from the files the ranks wrote (``logdir.<attempt>.<rank>``)."""
    out = {}
    for path in folder.glob("logdir.*.*"):
        _, attempt, rank = path.name.split(".")
        out[(int(attempt), int(rank))] = path.read_text()
    return out


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("where", ["early", "late"])
def test_an_elastic_restart_writes_its_ranks_into_one_folder_of_its_own(tmp_path, where):
    """With the default logdir, each rank claimed ``runs/<launcher start>_<host>/rank<N>`` or,
    where its rank's folder was taken, the next ``-2``: a rank that failed before its session in
    the first attempt left its folder free, so the restarted attempt's rank 1 wrote into the
    failed attempt's folder and its rank 0 into ``-2``: one attempt split over two folders, each
    of which paired two attempts' ranks. Each restart now has a folder of its own
    (``...-restart1``), the failed attempt's records kept in theirs."""
    (tmp_path / "train.py").write_text(RESTART_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--max-restarts", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "train.py", where, str(STEPS)]
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    dirs = _logdirs(tmp_path)
    assert (1, 0) in dirs and (1, 1) in dirs, (dirs, proc.stdout[-3000:])
    restarted = {rank: dirs[(1, rank)] for rank in (0, 1)}
    assert restarted[0].rsplit("/", 1) == [restarted[0].rsplit("/", 1)[0], "rank0"]
    folder = restarted[0].rsplit("/", 1)[0]
    assert restarted[1] == f"{folder}/rank1", restarted  # one attempt, one folder
    assert folder.endswith("-restart1"), folder
    first = dirs[(0, 0)].rsplit("/", 1)[0]
    assert first != folder and folder == f"{first}-restart1", dirs
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted({first[len("runs/"):],
                                                             folder[len("runs/"):]})
    assert sorted(p.name for p in (tmp_path / first).iterdir()) == (
        ["rank0"] if where == "early" else ["rank0", "rank1"])
    for rank in (0, 1):  # the restarted attempt's own run, every step, on every rank
        scalars = read_scalars(tmp_path / folder / f"rank{rank}")
        assert steps_of(scalars, "trainkit/step_time_ms") == list(range(1, STEPS + 1)), rank
    if where == "late":  # the failed attempt's records stay in its folder
        assert steps_of(read_scalars(tmp_path / first / "rank1"), "loss")[:2] == [1, 2]


def test_the_default_folder_of_a_restart_is_named_after_it(tmp_path, monkeypatch):
    """The folder name, without a launcher: torchrun's K-th restart adds ``-restart<K>``; the
    first attempt, and a process torchrun did not start, add nothing."""
    from trainkit import _logdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for count, restarted in (("0", False), ("2", True), ("x", False)):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
        path = _logdir.default_logdir()
        assert path.endswith(f"_{socket.gethostname()}-restart2") == restarted, path
        assert ("restart" in path) == restarted, path
        assert (tmp_path / path / "rank1").is_dir()
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert "restart" not in _logdir.default_logdir()
