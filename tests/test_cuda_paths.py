"""The GPU paths on a real GPU: regions, steps, memory and AMP timed and read as the design says
(CUDA events read lazily, CUDA's own peak, fp16 skips). Marked ``cuda``: skipped where torch sees
no GPU (this project's CPU machines); run by ``benchmarks/gpu.sh cuda-tests`` on a GPU machine.
Their logic on the CPU, with stand-ins for torch's CUDA calls: test_gpu_logic.py.
"""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp

pytestmark = pytest.mark.cuda

#: cycles of torch.cuda._sleep: ~10-30 ms at a GPU's clock (1-2 GHz), far above launch costs
SPIN = 30_000_000


def _gpu_ms(work) -> float:
    """What ``work`` takes on the GPU, timed by CUDA events of the test's own: the oracle."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_a_region_on_a_gpu_is_the_gpu_time_of_its_work_not_the_host_time(tmp_path):
    torch.cuda.synchronize()
    oracle = _gpu_ms(lambda: torch.cuda._sleep(SPIN))  # the same work, timed by the test
    with tk.session(logdir=tmp_path, system_metrics=False):
        t0 = time.perf_counter()
        with tk.profile_region("spin"):
            torch.cuda._sleep(SPIN)  # queued: the host goes on at once
        host_ms = (time.perf_counter() - t0) * 1e3
    (got,) = [v for _, v in scalars(tmp_path)["trainkit/region/spin_ms"]]
    assert oracle > 5.0 and host_ms < oracle / 2, (oracle, host_ms)  # else it proves nothing
    assert got == pytest.approx(oracle, rel=0.2), (got, oracle, host_ms)


def test_a_steps_time_on_a_gpu_holds_its_gpu_work(tmp_path):
    model = mlp().cuda()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    torch.cuda.synchronize()
    oracle = _gpu_ms(lambda: torch.cuda._sleep(SPIN))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(loader(n=32)):
            x, y = tk.to_device((x, y), "cuda")
            torch.cuda._sleep(SPIN)  # the step's GPU work, queued ahead of the host
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    steps = [v for _, v in got["trainkit/step_time_ms"]]
    updates = [v for _, v in got["trainkit/update_ms"]]
    assert len(steps) == 4 and len(updates) == 4
    # from the previous step's end to this one's on the GPU: at least the spin (the first one's
    # start is its batch's wait, before the spin was queued)
    assert all(v >= oracle * 0.8 for v in steps), (steps, oracle)
    assert all(0.0 <= u < oracle / 2 for u in updates), (updates, oracle)  # SGD alone


def test_peak_memory_on_a_gpu_is_cudas_peak(tmp_path):
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20  # what earlier tests left allocated
    with tk.session(logdir=tmp_path):  # the system sampler takes the memory peak
        big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
        del big
    peaks = [v for _, v in scalars(tmp_path)["trainkit/memory/peak_MB"]]
    # CUDA's max_memory_allocated (not the host's RSS peak): the 256 MiB over what was there
    assert base + 255.0 <= max(peaks) <= base + 256.0 + 64.0, (peaks, base)


def test_fp16_steps_a_scaler_skips_on_a_gpu_are_counted(tmp_path):
    model = mlp().cuda()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cuda", init_scale=1e30)  # fp16 gradients overflow every step
    before = [p.detach().clone() for p in model.parameters()]
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(loader(n=32, batch_size=8)):
            x, y = x.cuda(), y.cuda()
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                assert amp.device_type == "cuda"
                loss = torch.nn.functional.cross_entropy(model(x), y)
            amp.backward(loss)
            amp.step(opt)
            opt.zero_grad()
    assert amp.skipped == 4
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # never stepped
    (finding,) = [f for f in tk.analyze(tmp_path) if f.code == "TA110"]
    assert "skipped" in finding.evidence


def test_a_pinned_loader_feeds_timed_async_copies(tmp_path):
    model = mlp().cuda()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    batches = torch.utils.data.DataLoader(data, batch_size=16, pin_memory=True)
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(batches):
            x, y = tk.to_device((x, y), "cuda")
            assert x.is_cuda and y.is_cuda
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/h2d_ms"]] == [1, 2, 3, 4]
    assert all(v == 100.0 for _, v in got["trainkit/h2d_pinned_pct"])
    assert all(v > 0 for _, v in got["trainkit/h2d_GBps"])
    assert [v for _, v in got["trainkit/samples_per_s"]] and all(
        v > 0 for _, v in got["trainkit/samples_per_s"])
