"""Body of each rank of the DDP accumulation test (run by torch.multiprocessing.spawn)."""
from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

import trainkit as tk

from ._oracle import batches, model64

CLIP = 0.05  # below every window's gradient norm: the clip acts at every step


def rank_batches(rank: int, sizes):
    return batches(sizes, seed=100 + rank)


def zero_first_window(rank: int, sizes, n: int):
    """Rank 1's first window brings no items (empty micro-batches, as if all padding)."""
    return [0] * n + list(sizes[n:]) if rank == 1 else list(sizes)


class Branches(torch.nn.Module):
    """A trunk and one head per rank: under DDP(find_unused_parameters=True) each rank leaves
    the other's head without a gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = torch.nn.Linear(6, 8)
        self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)])
        self.double()

    def forward(self, x: torch.Tensor, head: int) -> torch.Tensor:
        return self.heads[head](torch.tanh(self.trunk(x)))


def run_branches(rank: int, n: int) -> dict:
    model = torch.nn.parallel.DistributedDataParallel(Branches(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    with tk.accumulate(n, opt, model=model):
        for x, y in rank_batches(rank, [4] * 10):
            torch.nn.functional.mse_loss(model(x, rank), y).backward()
            opt.step()
            opt.zero_grad()
    return {"params": [p.detach().clone() for p in model.module.parameters()]}


def run(rank: int, world: int, port: int, outdir: str, sizes_by_rank, n: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # the child's own environment, for init_process_group
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _run(rank, world, outdir, sizes_by_rank, n)
    finally:
        # The models' locals are gone with _run; DDP and FSDP sit in reference cycles that hold
        # the group, and left to the collection at exit gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()


def _run(rank: int, world: int, outdir: str, sizes_by_rank, n: int) -> None:
    torch.set_num_threads(1)
    out = {}
    for key, normalize, clip in (("mean", "mean", None), ("items", "items", None),
                                 ("clip", "mean", CLIP), ("items_zero", "items", None)):
        model = torch.nn.parallel.DistributedDataParallel(model64())
        calls = [0]

        def hook(state, bucket):
            calls[0] += 1
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sizes = sizes_by_rank[rank] if normalize == "items" else [4] * len(sizes_by_rank[rank])
        if key == "items_zero":
            sizes = zero_first_window(rank, sizes, n)
        with tk.accumulate(n, opt, model=model, normalize=normalize,
                           clip_grad_norm=clip) as acc:
            for x, y in rank_batches(rank, sizes):
                red = "sum" if normalize == "items" else "mean"
                torch.nn.functional.mse_loss(model(x), y, reduction=red).backward()
                if normalize == "items":
                    acc.add_items(len(x))
                opt.step()
                opt.zero_grad()
        out[key] = {"params": [p.detach().clone() for p in model.module.parameters()],
                          "allreduces": calls[0], "steps": acc.steps,
                          "sync_flag": model.require_backward_grad_sync}
    out["branches"] = run_branches(rank, n)
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))
