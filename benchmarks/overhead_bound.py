"""How low (a) could go: the issue's loop with the least recording there can be, next to trainkit.

``benchmarks/overhead.py`` (a) times the tiny MLP's step plain and under trainkit (goal: <= 1.03x).
This script adds a sixth variant, **bound**: the same loop (a patched loader, 3 regions, a
patched ``optimizer.step``, the loss logged) where each of those is the cheapest C that records
the same numbers: a ``clock_gettime`` and a store into a C array (``overhead_bound.c``, built
here at run time with the C compiler that builds trainkit's own extension). It keeps none of
what makes the numbers usable: no session, no step logic (a step's records under their step, a
batch's under the step it feeds), no check for a profiler, CUDA or ``torch.compile``, no
TensorBoard events (its round ends by reading the logged losses and emptying the store, not by
encoding and writing them). So its ratio is a lower bound on what any implementation of the
issue's loop costs on this machine, not something trainkit could ship; "trainkit / bound" is
what trainkit costs above it.

Variants, rounds and ratios are overhead.py's (one model, each variant's own optimizer, a fresh
random order each round, medians of per-round ratios pooled over fresh processes, bootstrap 95%
CIs); "by hand" is left out to keep rounds short.

``--parts`` adds, in the same rounds, the trainkit loop less each of its parts (overhead.py's
``--without``, one variant each: regions, loader, step, log) and less the round's flush (the
records kept, the writer's work for them not done): what each part costs, side by side, where
``--without`` measured each in a run of its own.

    python benchmarks/overhead_bound.py [--processes 6] [--rounds 40] [--parts]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import overhead  # noqa: E402

VARIANTS = ("plain", "plain again", "floor", "trainkit", "bound")


def build(out_dir: str) -> Any:
    """Compile overhead_bound.c into ``out_dir`` and import it."""
    src = os.path.join(HERE, "overhead_bound.c")
    so = os.path.join(out_dir, "overhead_bound" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    cmd = cc + ["-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], src, "-o", so]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        said = done.stderr if done.returncode != 0 else None
    except OSError as exc:  # no compiler at all
        said = str(exc)
    if said is not None:
        sys.exit(f"building {src} failed ({' '.join(cmd)}):\n{said}\n"
                 f"This script needs a C compiler and Python's headers, as trainkit's own "
                 f"extension does (apt install gcc python3-dev).")
    spec = importlib.util.spec_from_file_location("overhead_bound", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def bound_variant(mod: Any) -> Callable[..., Dict[str, Callable]]:
    """overhead.make_variants's ``extra``: the bound's loop on the shared model."""

    def extra(model: torch.nn.Module, crit: Any, batches: List) -> Dict[str, Callable]:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        opt.step = mod.patch(opt.step)
        loop = overhead.loop_with(mod.wrap(batches), mod.region, mod.log)

        def bound() -> None:
            loop(model, opt, crit)
            mod.drain()  # the writer's least work: the logged values read, the stores emptied

        return {"bound": bound}

    return extra


PARTS = tuple("-" + part for part in overhead.PARTS) + ("-flush",)


def parts_variants(extra: Callable[..., Dict[str, Callable]]) -> Callable[..., Dict[str, Callable]]:
    """``extra`` and, beside it, the trainkit loop less each part (:data:`PARTS`), each variant
    with its own patched optimizer on the shared model."""
    import collections
    import importlib

    sessions = importlib.import_module("trainkit.session")

    def more(model: torch.nn.Module, crit: Any, batches: List) -> Dict[str, Callable]:
        out = extra(model, crit, batches)
        s = sessions._active
        for part in overhead.PARTS:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            loop = overhead.trainkit_parts(opt, batches, s, (part,))

            def less(loop: Callable = loop, opt: Any = opt) -> None:
                loop(model, opt, crit)
                s.flush()

            out["-" + part] = less
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loop = overhead.trainkit_parts(opt, batches, s, ())

        def unflushed() -> None:  # the records made and kept, then dropped: no writer's work
            kept = s._buf
            s._buf = collections.deque()
            try:
                loop(model, opt, crit)
            finally:
                s._buf = kept

        out["-flush"] = unflushed
        return out

    return more


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--parts", action="store_true",
                    help="also the trainkit loop less each of its parts, in the same rounds")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)  # its seed
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = VARIANTS + (PARTS if args.parts else ())
    if args.child is not None:
        with tempfile.TemporaryDirectory(prefix="overhead-bound-") as d:
            extra = bound_variant(build(d))
            if args.parts:
                extra = parts_variants(extra)
            per_step = overhead.run_rounds("a", args.steps, args.rounds, args.child, "cpu",
                                           extra=extra, only=names)
        print(json.dumps(per_step))
        return
    print(f"torch {torch.__version__}, 1 thread, {time.strftime('%Y-%m-%d')}, "
          f"cpu count {os.cpu_count()}")
    runs = []
    for i in range(args.processes):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(i),
                              "--rounds", str(args.rounds), "--steps", str(args.steps)]
                             + (["--parts"] if args.parts else []),
                             check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    per_step = {n: np.array([v for run in runs for v in run[n]]) for n in names}
    print(f"\n(a: MLP 784-64-10, batch 32, cpu) median plain step "
          f"{np.median(per_step['plain']):.3f} ms, {args.processes} processes x {args.rounds} "
          f"rounds x {args.steps} steps")
    pairs = [(n, "plain") for n in VARIANTS[1:]] + [("trainkit", "bound")]
    pairs += [(n, "plain") for n in (PARTS if args.parts else ())]
    for num, den in pairs:
        ratios = per_step[num] / per_step[den]
        lo, hi = overhead.bootstrap_ci(ratios)
        each = " ".join(f"{np.median(np.array(run[num]) / np.array(run[den])):.3f}"
                        for run in runs)
        print(f"  {('trainkit ' + num) if num in PARTS else num:17s} / {den:5s} = "
              f"{np.median(ratios):.3f}x  (95% CI {lo:.3f}-{hi:.3f})"
              f"   per process: {each}")


if __name__ == "__main__":
    main()
