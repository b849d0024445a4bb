"""Two ranks started by torch.multiprocessing.spawn (PyTorch's DDP tutorial), which sets no RANK:
DDP on gloo, STEPS steps under one trainkit session opened after init_process_group ("after") or
before it ("before").

Usage: python spawn_ranks.py LOGDIR STEPS PORT after|before
"""
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import trainkit as tk


def train(rank: int, logdir: str, steps: int, port: int, order: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    s = tk.session(logdir=logdir, system_metrics=False) if order == "before" else None
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if s is None:
        s = tk.session(logdir=logdir, system_metrics=False)
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(steps)]
    with s:
        tk.patch(opt)
        for x, y in tk.patch(data):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
        print(f"rank {rank} wrote {s.logdir}", flush=True)
    dist.barrier()  # no rank tears gloo down while the other still talks to it
    del model, opt  # DDP sits in reference cycles that hold the group: freed before it ends
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    logdir, steps, port, order = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(train, args=(logdir, steps, port, order), nprocs=2, join=True)
