"""``trainkit demo`` under torchrun: its process group, device and DDP wrapper, and how the ranks
agree (when to stop) and share their results."""
from __future__ import annotations

import dataclasses
import gc
import os
import sys
from typing import TYPE_CHECKING, Any

from .. import _env

if TYPE_CHECKING:
    from ..demo import DemoResult


class Ranks:
    """The demo under torchrun: a process group (gloo: the stop flag and the results), the
    device (``cuda:<LOCAL_RANK>`` when every rank has a GPU of its own, else the CPU) and DDP."""

    def __init__(self, dist: Any, group: Any, own: bool, device: Any) -> None:
        import torch

        self.dist, self.group, self.own, self.device = dist, group, own, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._flag = torch.zeros(1, dtype=torch.int32)

    @classmethod
    def start(cls) -> "Ranks":
        import torch
        import torch.distributed as dist

        own = not dist.is_initialized()
        if own:
            dist.init_process_group("gloo")
        group = None if own else dist.new_group(backend="gloo")
        local = int(_env.get(_env.LOCAL_RANK) or 0)
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ok = torch.tensor([int(local < gpus)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if ok.item():
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
            if gpus and dist.get_rank() == 0:
                print(f"trainkit demo: more processes on a machine than its {gpus} GPU(s): "
                      f"training on the CPU; start at most one process per GPU (e.g. "
                      f"torchrun --nproc_per_node {gpus}) to train on the GPUs", file=sys.stderr)
        return cls(dist, group, own, device)

    def wrap(self, model: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        if self.device.type != "cuda":
            return DistributedDataParallel(model)
        group = self.dist.new_group(backend="nccl") if self.own else None
        return DistributedDataParallel(model, device_ids=[self.device.index], process_group=group)

    def any(self, value: bool) -> bool:
        """Whether ``value`` is true on any rank (every rank asks at the same point)."""
        self._flag.fill_(int(value))
        self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MAX, group=self.group)
        return bool(self._flag.item())

    def gather(self, mine: "DemoResult", root: str) -> "DemoResult":
        """``mine`` with every rank's result (their runs: ``<root>/rank<N>``) in ``ranks``."""
        import torch

        fields = ("steps", "median_step_ms", "samples_per_s", "data_wait_share", "final_loss",
                  "accuracy", "val_images")
        row = torch.tensor([float(getattr(mine, f)) for f in fields], dtype=torch.float64)
        rows = [torch.empty_like(row) for _ in range(self.world)]
        self.dist.all_gather(rows, row, group=self.group)
        ranks = tuple(
            dataclasses.replace(mine, logdir=os.path.join(root, f"rank{r}"), rank=r,
                                **{f: (int(v) if f in ("steps", "val_images") else v)
                                   for f, v in zip(fields, got.tolist())})
            for r, got in enumerate(rows))
        return dataclasses.replace(ranks[self.rank], ranks=ranks)

    def close(self, wait: bool) -> None:
        """Ends the process group the demo made; ``wait``: for every rank first (after an error
        on this one, not: the others are inside another collective, and torchrun ends them).

        The caller drops its references to the DDP wrapper first: DDP sits in a reference cycle
        and holds the process group, so only a collection frees them. Left to the one at the
        interpreter's exit, gloo's threads end there and can abort the process ("terminate
        called without an active exception", exit status -6), so it is collected here."""
        gc.collect()
        if self.own and self.dist.is_initialized():
            if wait:
                self.dist.barrier(group=self.group)  # no rank tears gloo down while another talks
            self.dist.destroy_process_group()
