"""Run by torchrun with 2 ranks: Linear(8, 2) wrapped in DDP (or sharded with FSDP2's fully_shard)
on gloo, STEPS steps under one trainkit session.

Usage: torchrun ... ddp_train.py LOGDIR STEPS [ddp|fsdp2]
"""
import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainkit as tk

logdir, steps = sys.argv[1], int(sys.argv[2])
wrap = sys.argv[3] if len(sys.argv) > 3 else "ddp"
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
if wrap == "fsdp2":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(torch.nn.Linear(8, 2), mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
else:
    model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(steps)]
with tk.session(logdir=logdir, system_metrics=False) as s:
    tk.patch(opt)
    for x, y in tk.patch(data):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.log("loss", loss)
    print(f"rank {rank} wrote {s.logdir}", flush=True)
dist.barrier()  # no rank tears gloo down while the other still talks to it
del model, opt  # DDP and FSDP sit in reference cycles that hold the group: freed before it ends
gc.collect()
dist.destroy_process_group()
