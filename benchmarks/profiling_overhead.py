"""What profiling costs: step time with a ProfileSchedule outside its active window vs none.

A session with ``profile=tk.ProfileSchedule(wait=10**6, ...)`` holds a torch.profiler that never
records; the goal is that it costs nothing measurable (<= 1.01x). Both arms run the demo workload
(the MNIST-shaped CNN, batch 64) in one process and one thread, in interleaved rounds (A B, B A,
...), so drift on a shared machine hits both alike. Prints the median per-round ratio with a
bootstrap 95% CI, then what one profiling cycle costs on disk, plain and gzip.

Run: python benchmarks/profiling_overhead.py [--rounds 12] [--steps 30]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import trainkit as tk  # noqa: E402
from trainkit.workloads.loop import train_steps  # noqa: E402
from trainkit.workloads.mnist import simple_cnn, synthetic_mnist  # noqa: E402


def run(logdir: str, profile, steps: int, batches) -> list:
    """Step times (s) of one session over ``steps`` steps, after 3 warm-up steps."""
    torch.manual_seed(0)
    model = simple_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tk.session(logdir=logdir, profile=profile, system_metrics=False):
        return train_steps(model, opt, batches[: steps + 3])[3:]


def bootstrap_ci(values, *, n=10_000, seed=0):
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    meds = np.median(rng.choice(v, size=(n, len(v)), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def hook_cost_us(root: str, n: int = 20_000) -> float:
    """Direct cost of what profiling adds to a step outside the window: ``Tracer.step()``."""
    import timeit

    from trainkit.profiling.trace import Tracer

    tracer = Tracer(root, tk.ProfileSchedule(wait=10**9, warmup=1, active=1))
    try:
        best = min(timeit.repeat(tracer.step, number=n, repeat=5))
    finally:
        tracer.close()
    return best / n * 1e6


def trace_sizes(root: str, batches) -> dict:
    out = {}
    for gz in (False, True):
        d = os.path.join(root, f"size-gzip{gz}")
        run(d, tk.ProfileSchedule(wait=2, warmup=1, active=3, gzip=gz), steps=6, batches=batches)
        (name,) = [f for f in os.listdir(d) if ".pt.trace.json" in f]
        out[name.split(".pt.")[1]] = os.path.getsize(os.path.join(d, name))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y = synthetic_mnist(64 * (args.steps + 3))
    batches = list(zip(x.split(64), y.split(64)))
    off = tk.ProfileSchedule(wait=10**6, warmup=1, active=1)
    ratios, med = [], {"none": [], "schedule": []}
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds):
            order = [("none", None), ("schedule", off)]
            if r % 2:
                order.reverse()
            got = {}
            for name, prof in order:
                got[name] = statistics.median(run(os.path.join(root, f"{name}{r}"), prof,
                                                  args.steps, batches))
                med[name].append(got[name])
            ratios.append(got["schedule"] / got["none"])
        sizes = trace_sizes(root, batches)
        cost = hook_cost_us(root)
    lo, hi = bootstrap_ci(ratios)
    print(f"torch {torch.__version__}, 1 thread, CPU, demo CNN batch 64, "
          f"{args.rounds} interleaved rounds x {args.steps} steps")
    print(f"median step: no profiling {statistics.median(med['none']) * 1e3:.2f} ms, "
          f"schedule outside its window {statistics.median(med['schedule']) * 1e3:.2f} ms")
    print(f"ratio (schedule / none): median {statistics.median(ratios):.4f}x, "
          f"95% CI [{lo:.4f}, {hi:.4f}]  (goal <= 1.01x)")
    step_us = statistics.median(med["none"]) * 1e6
    print(f"direct cost of the per-step hook outside the window: {cost:.2f} us per step "
          f"= {1 + cost / step_us:.5f}x of this step (what the ratio above tries to resolve)")
    for kind, nbytes in sizes.items():
        print(f"one cycle of 3 active steps on disk ({kind}): {nbytes / 1024:.0f} KiB "
              f"({nbytes / 3 / 1024:.0f} KiB per step)")


if __name__ == "__main__":
    main()
