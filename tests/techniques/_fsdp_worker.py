"""Body of each rank of the FSDP accumulation test (run by torch.multiprocessing.spawn)."""
from __future__ import annotations

import gc
import os
import warnings

import torch
import torch.distributed as dist

import trainkit as tk

from ._ddp_worker import CLIP, rank_batches
from ._oracle import model64

N = 4  # micro-batches per window; 10 micro-batches a rank make the windows 4, 4, 2


def fsdp2(mesh):
    from torch.distributed.fsdp import fully_shard

    model = model64()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full_params(model):
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: DTensor shards
        return [p.full_tensor().detach().clone() for p in model.parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model):
        return [p.detach().clone() for p in model.parameters()]


def train(model, rank, sizes, *, normalize="mean", fail_at=None, clip=None, dtype=torch.float64):
    """One accumulate block over this rank's micro-batches; what each backward left behind."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    synced = []  # per micro-batch: did its backward leave (reduced) gradients on the shards
    red = "sum" if normalize == "items" else "mean"
    data = [(x.to(dtype), y.to(dtype)) for x, y in rank_batches(rank, sizes)]
    try:
        with tk.accumulate(N, opt, model=model, normalize=normalize, clip_grad_norm=clip) as acc:
            for i, (x, y) in enumerate(data):
                torch.nn.functional.mse_loss(model(x), y, reduction=red).backward()
                synced.append(any(p.grad is not None for p in model.parameters()))
                if normalize == "items":
                    acc.add_items(len(x))
                opt.step()
                opt.zero_grad()
                if i == fail_at:
                    raise RuntimeError("planted")
    except RuntimeError as e:
        assert str(e) == "planted", e
    return opt, acc, synced


def run(rank: int, world: int, port: int, outdir: str, sizes_by_rank) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # the child's own environment, for init_process_group
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _run(rank, world, outdir, sizes_by_rank)
    finally:
        # The models' locals are gone with _run; DDP and FSDP sit in reference cycles that hold
        # the group, and left to the collection at exit gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()


def _run(rank: int, world: int, outdir: str, sizes_by_rank) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from trainkit.patch import optimizer_patch

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    hsdp_mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        equal = [4] * len(sizes_by_rank[rank])
        for name, make in (("fsdp2", lambda: fsdp2(mesh)), ("hsdp", lambda: fsdp2(hsdp_mesh)),
                           ("fsdp1", lambda: FSDP(model64(), device_id=torch.device("cpu"),
                                                  use_orig_params=True))):
            model = make()
            _, acc, synced = train(model, rank, equal)
            out[name] = {"params": full_params(model), "steps": acc.steps, "synced": synced}

        # clip_grad_norm: FSDP2's DTensor gradients through torch's clip_grad_norm_, FSDP1's
        # flat shards through its own clip_grad_norm_ (which takes no float64 gradients)
        for name, make, dtype in (
                ("fsdp2_clip", lambda: fsdp2(mesh), torch.float64),
                ("fsdp1_clip", lambda: FSDP(model64().float(), device_id=torch.device("cpu"),
                                            use_orig_params=True), torch.float32)):
            model = make()
            _, acc, _ = train(model, rank, equal, clip=CLIP, dtype=dtype)
            out[name] = {"params": [p.double() for p in full_params(model)], "steps": acc.steps}

        # amp.step's clip inside an accumulate block goes through the block's FSDP1 model;
        # with no model to go through, it is refused before anything changes
        model = FSDP(model64().float(), device_id=torch.device("cpu"), use_orig_params=True)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        data = rank_batches(rank, equal)
        with tk.accumulate(N, opt, model=model) as acc:
            for x, y in data:
                with tk.autocast_scaled(dtype="fp32") as amp:
                    loss = torch.nn.functional.mse_loss(model(x.float()), y.float())
                amp.backward(loss)
                amp.step(opt, clip_grad_norm=CLIP)
                opt.zero_grad()
        out["fsdp1_amp_clip"] = {"params": [p.double() for p in full_params(model)],
                                 "steps": acc.steps}
        before = full_params(model)
        x, y = data[0]
        with tk.autocast_scaled(dtype="fp32") as amp:
            amp.backward(torch.nn.functional.mse_loss(model(x.float()), y.float()))
            try:
                amp.step(opt, clip_grad_norm=CLIP)
                out["amp_clip_refused"] = None
            except ValueError as e:
                out["amp_clip_refused"] = (str(e), all(torch.equal(p, q) for p, q in
                                                       zip(before, full_params(model))))

        model = fsdp2(mesh)
        _, acc, _ = train(model, rank, sizes_by_rank[rank], normalize="items")
        out["items"] = {"params": full_params(model), "steps": acc.steps}

        # The block raises in the second window (micro-batch 6 of it): its two held-back
        # micro-batches are dropped; one plain synced step on micro-batch 7 follows.
        model = fsdp2(mesh)
        opt, acc, _ = train(model, rank, equal, fail_at=5)
        x, y = rank_batches(rank, equal)[6]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out["raised"] = {"params": full_params(model), "steps": acc.steps}

        # items need the data-parallel ranks: a 2-D mesh is refused before any change
        model = fsdp2(hsdp_mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            with tk.accumulate(N, opt, model=model, normalize="items"):
                pass
            out["refused"] = None
        except ValueError as e:
            out["refused"] = (str(e), optimizer_patch(opt) is None)
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught
                       if "accumulate" in str(w.message)]
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))
    dist.barrier()
