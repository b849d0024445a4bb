"""Adam step: eager foreach vs eager fused vs raw torch.compile vs tk.compiled_step, interleaved.

The seed's experiment (004_050f9562689db265.txt): Adam over 10 x Linear(1024, 1024) without bias,
gradients from one forward/backward. Each round times every variant in turn (the order rotates
each round), so drifts in machine load hit all variants alike; speed-ups are medians of the
per-round ratios over eager foreach, with a bootstrap 95% confidence interval.

Usage::

    python benchmarks/compiled_step.py [--rounds 30] [--calls 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
import trainkit as tk  # noqa: E402


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(10)]).to(device)
    model(torch.rand(1024, device=device)).sum().backward()
    return model


def _variants(device: torch.device) -> Dict[str, Callable[[], None]]:
    opts = {
        "eager foreach": torch.optim.Adam(_model(device).parameters(), lr=0.01, foreach=True),
        "eager fused": torch.optim.Adam(_model(device).parameters(), lr=0.01, fused=True),
        "raw torch.compile": torch.optim.Adam(_model(device).parameters(), lr=0.01),
        "tk.compiled_step": torch.optim.Adam(_model(device).parameters(), lr=0.01),
    }
    raw_opt, tk_opt = opts["raw torch.compile"], opts["tk.compiled_step"]

    @torch.compile(fullgraph=False)
    def raw_step() -> None:
        raw_opt.step()

    @tk.compiled_step
    def tk_step() -> None:
        tk_opt.step()

    return {"eager foreach": opts["eager foreach"].step, "eager fused": opts["eager fused"].step,
            "raw torch.compile": raw_step, "tk.compiled_step": tk_step}


def _time(fn: Callable[[], None], calls: int, device: torch.device) -> float:
    """Median seconds per call over ``calls`` calls (the benchmark, not a user step, may sync)."""
    out = []
    for _ in range(calls):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _ci(ratios: List[float], *, n_boot: int = 2000, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    a = np.asarray(ratios)
    meds = np.median(rng.choice(a, size=(n_boot, a.size), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    ap.add_argument("--calls", type=int, default=5, help="timed calls per variant per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (they compile)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = (torch.cuda.get_device_name() if device.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads)")
    print(f"device: {name}; torch {torch.__version__}; rounds {args.rounds} x {args.calls} calls")
    variants = _variants(device)
    for label, fn in variants.items():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            fn()
        print(f"  warm-up {label:<18} {time.perf_counter() - t0:7.1f} s")
    names = list(variants)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(_time(variants[n], args.calls, device))
    base = times["eager foreach"]
    ratios = {n: [b / t for b, t in zip(base, times[n])] for n in names}
    print(f"\n{'variant':<18} {'median ms':>10} {'speed-up vs foreach':>20} {'95% CI':>16}")
    for n in names:
        lo, hi = _ci(ratios[n])
        print(f"{n:<18} {statistics.median(times[n]) * 1e3:10.2f} "
              f"{statistics.median(ratios[n]):19.2f}x  [{lo:5.2f}, {hi:5.2f}]")
    tk_vs_raw = [a / b for a, b in zip(ratios["tk.compiled_step"], ratios["raw torch.compile"])]
    lo, hi = _ci(tk_vs_raw)
    print(f"\ntk / raw-compile speed-up: {statistics.median(tk_vs_raw):.2f} [{lo:.2f}, {hi:.2f}] "
          f"(goal >= 0.9)")
    fastest = min(names, key=lambda n: statistics.median(times[n]))
    print(f"fastest on this machine: {fastest}")
    c = variants["tk.compiled_step"].trainkit_compiled  # type: ignore[attr-defined]
    print(f"tk.compiled_step: {c.compile_seconds:.1f} s compiling, {c.recompiles} recompiles")


if __name__ == "__main__":
    main()
