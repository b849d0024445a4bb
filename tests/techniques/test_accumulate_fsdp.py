"""tk.accumulate with FSDP2 (fully_shard, 1-D and HSDP meshes) and FSDP1 on two gloo ranks."""
import pytest
import torch

from ._ddp_worker import CLIP
from ._oracle import big_batch_oracle, model64
from .test_accumulate_ddp import SIZES, _free_port, _global_batches


def _max_rel_err(params, oracle):
    return max(((p - q).abs().max() / q.abs().max()).item() for p, q in zip(params, oracle.parameters()))


@pytest.mark.slow  # two spawned processes, six models: ~20-30 s on a shared 2-core machine
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.skipif(torch.distributed.is_available()
                    and not hasattr(__import__("torch.distributed.fsdp").distributed.fsdp,
                                    "fully_shard"),
                    reason="FSDP2 (torch.distributed.fsdp.fully_shard) is public from torch 2.6")
def test_fsdp_two_gloo_ranks_equal_the_big_batch_oracle(tmp_path):
    import torch.multiprocessing as mp

    from ._fsdp_worker import N, run

    mp.spawn(run, args=(2, _free_port(), str(tmp_path), SIZES), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    adam = lambda ps: torch.optim.Adam(ps, lr=0.01)
    equal = _global_batches([[4] * 10] * 2)
    mean = big_batch_oracle(model64(), adam, equal, N)
    oracles = {"fsdp2": mean, "hsdp": mean, "fsdp1": mean,
               "items": big_batch_oracle(model64(), adam, _global_batches(SIZES), N, reduction="items"),
               # window 1, then the raised block's partial window dropped, then micro-batch 7 alone
               "raised": big_batch_oracle(model64(), adam, equal[:4] + [equal[6]], N),
               "fsdp2_clip": big_batch_oracle(model64(), adam, equal, N, clip=CLIP),
               "fsdp1_clip": big_batch_oracle(model64(), adam, equal, N, clip=CLIP),
               "fsdp1_amp_clip": big_batch_oracle(model64(), adam, equal, N, clip=CLIP)}
    for name, oracle in oracles.items():
        a, b = r0[name], r1[name]
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"])), name
        tol = 1e-5 if name.startswith("fsdp1_") else 1e-10  # FSDP1's clips train in float32
        assert _max_rel_err(a["params"], oracle) < tol, (name, _max_rel_err(a["params"], oracle))
        assert a["steps"] == (1 if name == "raised" else 3), name
    # FSDP2 reduce-scatters at each window's last micro-batch only (the partial window's two on
    # exit); FSDP1 is left to sync at every micro-batch.
    boundary = [False, False, False, True] * 2 + [False, False]
    for name in ("fsdp2", "hsdp"):
        assert r0[name]["synced"] == r1[name]["synced"] == boundary, name
    assert r0["fsdp1"]["synced"] == [True] * 10
    for r in (r0, r1):
        msg, untouched = r["amp_clip_refused"]
        assert "clip_grad_norm=0.05" in msg and "FullyShardedDataParallel" in msg, msg
        assert "tk.accumulate(1, optimizer, model=fsdp_model)" in msg and untouched
    msg, unpatched = r0["refused"]
    assert "normalize='items'" in msg and "2-D mesh" in msg and "normalize='mean'" in msg
    assert unpatched  # refused before the optimizer was patched
    assert r0["warnings"] == r1["warnings"] == []
