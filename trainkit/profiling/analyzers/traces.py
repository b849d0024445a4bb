"""Findings from torch.profiler traces: host syncs, empty_cache, idle GPU, pageable copies.

Each rule reads the :class:`~trainkit.profiling.tracestats.TraceStats` of every trace of a run,
summed; the GPU rules stay silent on CPU-only traces, where their causes do not exist.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from ..finding import Finding, severity_for
from .records import PAGEABLE_FIX
from ..tracestats import TraceStats

#: Host calls that wait for the GPU. ``.item()`` / ``.cpu()`` / printing a CUDA tensor end in one.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize")
#: The ATen operators behind ``.item()`` / ``bool(t)`` / ``if t:`` on a CUDA tensor.
SCALAR_OPS = ("aten::_local_scalar_dense",)
#: ``torch.cuda.empty_cache()`` hands cached blocks back with cudaFree.
FREE_CALLS = ("cudaFree", "cuMemFree_v2", "cudaFreeHost")


class Traces:
    """The summed statistics of a run's readable traces.

    Example::

        t = Traces([summarize(read_trace(p)) for p in run.traces]); t.steps
    """

    def __init__(self, stats: List[TraceStats]) -> None:
        self.stats = [s for s in stats if s.steps > 0]
        self.steps = sum(s.steps for s in self.stats)
        self.step_us = sum(s.step_us for s in self.stats)
        self.window_us = sum(s.window_us for s in self.stats)
        self.gpu = [s for s in self.stats if s.has_gpu]

    def count(self, *names: str) -> int:
        return sum(s.count(*names) for s in self.stats)

    def time_us(self, *names: str) -> float:
        return sum(s.time_us(*names) for s in self.stats)

    def steps_with(self, *names: str) -> int:
        # A step with several of these counts once per name; capped at the number of steps.
        return min(self.steps, max((sum(s.steps_with.get(n, 0) for s in self.stats)
                                    for n in names), default=0))


def host_syncs(t: Traces) -> Optional[Finding]:
    if not t.gpu:
        return None  # on the CPU there is no device to wait for
    n = t.count(*SYNC_CALLS)
    if n == 0:
        return None
    share = t.time_us(*SYNC_CALLS) / t.step_us if t.step_us else 0.0
    scalars = t.count(*SCALAR_OPS)
    return Finding(
        code="TA103", title="host syncs in the step",
        evidence=f"{n} synchronizing CUDA call(s) in {t.steps} profiled steps "
                 f"({n / t.steps:.1f} per step; {scalars} from .item()/bool() on a CUDA "
                 f"tensor); the host waits for the GPU {share:.0%} of step time and stops "
                 f"queueing work ahead",
        share=share, count=n,
        fix="drop .item(), .cpu(), .tolist(), print(t) and `if t:` on CUDA tensors from the "
            "step: log with s.log('loss', loss) (resolved later), keep running sums on the "
            "GPU, and read values every N steps",
        severity=severity_for(share, high=0.2, medium=0.05) if n / t.steps < 2 else "high")


def empty_cache(t: Traces) -> Optional[Finding]:
    if not t.gpu:
        return None
    n = t.count(*FREE_CALLS)
    steps = t.steps_with(*FREE_CALLS)
    if n == 0 or steps < max(1, t.steps // 2):
        return None
    share = t.time_us(*FREE_CALLS) / t.step_us if t.step_us else 0.0
    return Finding(
        code="TA109", title="torch.cuda.empty_cache() every step",
        evidence=f"cudaFree is called {n} time(s) in {steps} of {t.steps} profiled steps: the "
                 f"caching allocator hands memory back and must allocate it again "
                 f"(cudaFree also synchronizes the device); {share:.0%} of step time",
        share=share, count=n,
        fix="remove torch.cuda.empty_cache() (and gc.collect()) from the loop; the caching "
            "allocator reuses freed blocks; against fragmentation set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        severity=severity_for(max(share, 0.05), high=0.2, medium=0.05))


def _gpu_idle(t: Traces) -> float:
    window = sum(s.window_us for s in t.gpu)
    busy = sum(s.gpu_busy_us for s in t.gpu)
    return 1.0 - busy / window if window > 0 else 0.0


def launch_bound(t: Traces) -> Optional[Finding]:
    if not t.gpu:
        return None
    idle = _gpu_idle(t)
    kernels = sum(s.kernels for s in t.gpu)
    gap = max(s.median_gap_us for s in t.gpu)
    launches = t.count("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    # Short gaps between many kernels: the GPU waits for each launch, not for one big stall
    # (data loading, a sync), which other rules report.
    if idle < 0.30 or gap > 50.0 or kernels < 10 * t.steps:
        return None
    return Finding(
        code="TA107", title="GPU idle between kernels (launch-bound)",
        evidence=f"the GPU is idle {idle:.0%} of the profiled steps; {kernels} kernels "
                 f"({kernels / t.steps:.0f} per step, {launches} launches) with a median gap of "
                 f"{gap:.0f} us between them: the host cannot launch them fast enough",
        share=idle, count=kernels,
        fix="launch fewer, larger kernels: capture the step in a CUDA graph "
            "(torch.compile(model, mode='reduce-overhead') / @tk.compiled_step(mode="
            "'reduce-overhead')), use fused optimizers (fused=True), and avoid Python work "
            "between operations",
        severity=severity_for(idle, high=0.5, medium=0.3))


def small_batches(t: Traces, items_per_step: Optional[float]) -> Optional[Finding]:
    if not t.gpu:
        return None
    idle = _gpu_idle(t)
    kernel_us = max(s.median_kernel_us for s in t.gpu)
    if idle < 0.5 or kernel_us > 20.0 or (items_per_step is not None and items_per_step > 256):
        return None
    items = "" if items_per_step is None else f"; {items_per_step:.0f} items per step"
    return Finding(
        code="TA108", title="small batches leave the GPU underused",
        evidence=f"the median kernel runs {kernel_us:.1f} us and the GPU is busy only "
                 f"{1 - idle:.0%} of the step{items}: each kernel has too little work",
        share=idle, count=sum(s.kernels for s in t.gpu),
        fix="raise the batch size until the step time grows (keep the effective batch with "
            "tk.accumulate if the optimization needs it), and enable AMP "
            "(tk.autocast_scaled) and channels_last to make kernels do more per launch",
        severity="medium")


def pageable_memcpy(t: Traces) -> Optional[Finding]:
    pageable = [(n, c, b) for s in t.gpu for n, (c, b) in s.memcpy.items()
                if "HtoD" in n and "Pageable" in n]
    if not pageable:
        return None
    count = sum(c for _, c, _ in pageable)
    nbytes = sum(b for _, _, b in pageable)
    return Finding(
        code="TA102", title="pageable host-to-device copies",
        evidence=f"{count} 'Memcpy HtoD (Pageable -> Device)' copies ({nbytes / 2**20:.1f} MiB) "
                 f"in {t.steps} profiled steps: staged by the driver, they cannot overlap compute",
        share=None, count=count,
        fix=PAGEABLE_FIX, severity="medium")


RULES: List[Callable[[Traces], Optional[Finding]]] = [
    host_syncs, empty_cache, launch_bound, pageable_memcpy,
]
