"""A session opened before a process group of two ranks, run with ``python -W error``: the
warning that the ranks share its folder is said by the writer thread at its first wake after a
step ("writer"), or by the close, with the close's other warnings ("close").

Two ranks on gloo, started by torch.multiprocessing.spawn (whose children keep ``-W error``):
rank 1 runs the session; rank 0 only joins the group and waits at its end, so what is said and
printed is rank 1's alone.

Usage: python -W error ranks_mixed_werror.py LOGDIR writer|close PORT
"""
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainkit as tk


def rank_main(rank: int, logdir: str, mode: str, port: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.set_num_threads(1)
    if rank == 0:  # the peer: no session
        dist.init_process_group("gloo", rank=0, world_size=2)
        dist.barrier()  # rank 1 is done
        dist.destroy_process_group()
        return
    main(logdir, mode)


def main(logdir: str, mode: str) -> None:
    s = tk.session(logdir=logdir, system_metrics=False, flush_secs=0.1, log_every=1)
    dist.init_process_group("gloo", rank=1, world_size=2)
    model = torch.nn.Linear(2, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        with s:
            if mode == "writer":
                for _ in range(3):
                    model(torch.ones(2)).sum().backward()
                    opt.step()
                    opt.zero_grad()
                    s.log("loss", 1.0)
                time.sleep(1.5)  # the writer wakes every 0.1 s: it has said it by now
            else:  # no step: the writer never says it, the close does, after "counted no step"
                s.log("loss", 1.0)
                s.log("loss", 2.0)
    except Warning as said:
        print(f"raised {type(said).__name__}: {said}", flush=True)
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    print("closed:", s.closed, tk.active() is None,
          signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
          [t.name for t in threading.enumerate() if t.name.startswith("trainkit")],
          [f for f in fds if f.startswith(os.path.abspath(logdir))], flush=True)
    del model, opt
    dist.barrier()  # the peer leaves only now
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2, join=True)
