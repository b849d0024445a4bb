"""Peak memory: one step on a batch of B*n vs ``tk.accumulate(n)`` over n micro-batches of B.

Each variant runs in a fresh subprocess (peak RSS only grows within a process). On the CPU the
peak is ``ru_maxrss`` minus the RSS before training (torch's CPU allocations are invisible to
tracemalloc); with ``--cuda`` it is ``torch.cuda.max_memory_allocated`` minus the allocation
before training. The model is a deep, narrow MLP on a large batch, so activations dominate.
The goal: accumulate's peak within 10% of a single batch-B step. What accumulation adds is
inherent: the gradients persist across micro-batches (a plain loop with ``set_to_none`` frees
them), so backward briefly holds the accumulated gradient and the new one — about one parameter
size (12.6 MiB here) on top of the activations of one micro-batch.

    python benchmarks/accumulate_memory.py [--B 4096] [--n 4] [--cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

WIDTH, DEPTH = 512, 12


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def child(variant: str, B: int, n: int, cuda: bool) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import trainkit as tk

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = "cuda" if cuda else "cpu"
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    data = torch.randn(B * n, WIDTH, device=dev)
    # Momentum buffers and grads exist after the first step in every variant: create them now.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_kb() * 1024
    if variant == "big":
        model(data).square().mean().backward()
        opt.step()
    elif variant == "single":
        model(data[:B]).square().mean().backward()
        opt.step()
    elif variant == "loop":  # a plain loop of n batch-B steps: the allocator's steady state
        for i in range(n):
            model(data[i * B:(i + 1) * B]).square().mean().backward()
            opt.step()
            opt.zero_grad()
    else:
        with tk.accumulate(n, opt):
            for i in range(n):
                model(data[i * B:(i + 1) * B]).square().mean().backward()
                opt.step()
                opt.zero_grad()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    print(json.dumps({"variant": variant, "peak_bytes": peak}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.B, a.n, a.cuda)
    if a.cuda:
        import torch

        if not torch.cuda.is_available():
            ap.error("--cuda: torch sees no CUDA device here; run it on a GPU machine, or drop "
                     "--cuda for the CPU")
    peaks = {}
    for variant in ("single", "loop", "accumulate", "big"):
        cmd = [sys.executable, __file__, "--child", variant, "--B", str(a.B), "--n", str(a.n)]
        # the child's stderr goes where ours does: a failing variant says why (an OOM, say)
        out = subprocess.run(cmd + (["--cuda"] if a.cuda else []), stdout=subprocess.PIPE,
                             text=True)
        if out.returncode != 0:
            sys.exit(f"variant {variant!r} failed (exit status {out.returncode}); its stderr is above")
        peaks[variant] = json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]
    where = "CUDA max_memory_allocated" if a.cuda else "CPU peak RSS delta"
    print(f"{where}; MLP {DEPTH}x{WIDTH}, B={a.B}, n={a.n}")
    for variant, label in (("single", f"one step, batch B={a.B}"),
                           ("loop", f"{a.n} plain steps, batch B={a.B}"),
                           ("accumulate", f"accumulate({a.n}) of B={a.B}"),
                           ("big", f"one step, batch B*n={a.B * a.n}")):
        print(f"  {label:<32} {peaks[variant] / 2**20:8.1f} MiB")
    ratio = peaks["accumulate"] / peaks["single"]
    print(f"accumulate / single-B peak: {ratio:.3f}  (goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    print(f"accumulate / {a.n} plain B steps: {peaks['accumulate'] / peaks['loop']:.3f}")
    print(f"big-batch / single-B peak:  {peaks['big'] / peaks['single']:.3f}")


if __name__ == "__main__":
    main()
