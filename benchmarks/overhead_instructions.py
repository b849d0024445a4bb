"""trainkit's per-step cost in instructions and simulated cache misses: numbers noise cannot move.

``overhead.py`` times the loops, and on a shared machine its ratios drift by a few per cent, as
much as the whole cost of trainkit on a 0.35 ms step. This script runs three of its loops on the
tiny MLP 784-64-10 at batch 32 (``plain_loop``; ``floor_loop``, the same instrumentation at its
cheapest; ``trainkit_loop``: session + patch(optimizer) + patch(loader) + 3 regions + ``s.log``)
under valgrind's callgrind, counting only the training thread and only the measured steps
(callgrind's client requests, from a 3-line C helper built here with gcc), with its cache
simulator set to this machine's L1 (32 KiB) and L2 (1 MiB, as the "LL" level). It prints, per
step, instructions (Ir), L1 misses and L2 misses of each loop, and what floor and trainkit add to
plain. A loop's count repeats to within ~0.2% between runs, so a difference (about 1% of the
plain step) repeats to within about +-10%: enough to tell whether a change to a hot path made it
cheaper, which the timings cannot. The writer thread is not counted (see overhead.py for its
cost). Needs valgrind (with its callgrind.h header) and gcc; about 6 minutes (the loops run one
after the other, under valgrind's ~50x slowdown).

    python benchmarks/overhead_instructions.py [--passes 4] [--parts] [--bound]   # 50 steps a pass
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict

HELPER_C = """#include <valgrind/callgrind.h>
void tk_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void tk_stop(void) { CALLGRIND_DUMP_STATS_AT("measured"); CALLGRIND_STOP_INSTRUMENTATION; }
"""
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
VARIANTS = ("plain", "floor", "trainkit")
PARTS = ("trainkit -regions", "trainkit -loader", "trainkit -step", "trainkit -log")
BOUND = ("bound",)  # overhead_bound.py's loop: the least recording there can be (--bound)


def child(variant: str, passes: int, helper: str) -> None:
    """The loop itself, run under callgrind; only the passes between start and stop count."""
    import ctypes

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # overhead.py's own loops (importing it also puts this checkout's trainkit on the path)
    from overhead import (Block, floor_loop, make_batches, mlp, plain_loop, trainkit_loop,
                          trainkit_parts)
    import torch

    import trainkit as tk

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()
    batches = make_batches(32, 50)
    # The writer would wake on the clock far more often under valgrind's slowdown; it runs in its
    # own thread (not counted) but keep it quiet all the same.
    s = tk.session(logdir=tempfile.mkdtemp(prefix="tk-instr-"), log_every=10**9, flush_secs=10**6,
                   system_metrics=False)
    if variant == "plain":
        def one_pass() -> None:
            plain_loop(model, opt, crit, batches)
    elif variant == "floor":  # overhead.py's reference: the same recording at its cheapest
        import time

        blocks = (Block(), Block(), Block())
        kept: list = []

        def one_pass() -> None:
            floor_loop(model, opt, crit, batches, blocks, time.perf_counter, torch.Tensor.item, kept)
    elif variant == "trainkit":
        tk.patch(opt)
        loader = tk.patch(batches)

        def one_pass() -> None:
            trainkit_loop(model, opt, crit, loader, s)
    elif variant == "bound":
        from overhead_bound import bound_variant, build

        bound = bound_variant(build(tempfile.mkdtemp(prefix="tk-instr-bound-")))(model, crit, batches)

        def one_pass() -> None:
            bound["bound"]()
    else:  # "trainkit -<part>": the trainkit loop without one of its parts (--parts)
        loop = trainkit_parts(opt, batches, s, (variant.split(" -", 1)[1],))

        def one_pass() -> None:
            loop(model, opt, crit)
    cg = ctypes.CDLL(helper)
    one_pass()
    one_pass()  # warm: first-call costs, allocator
    cg.tk_start()
    for _ in range(passes):
        one_pass()
    cg.tk_stop()
    os._exit(0)  # skip teardown: nothing after the dump is measured


def measure(variant: str, passes: int, helper: str, workdir: str) -> Dict[str, float]:
    out = os.path.join(workdir, f"cg.{variant}")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           "--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64",
           f"--callgrind-out-file={out}.%p", sys.executable, os.path.abspath(__file__),
           "--child", variant, "--passes", str(passes), "--helper", helper]
    subprocess.run(cmd, check=True, capture_output=True)
    dumps = [f for f in os.listdir(workdir) if f.startswith(f"cg.{variant}.") and f.endswith(".1-01")]
    if len(dumps) != 1:
        raise RuntimeError(f"expected one measured dump of the main thread, found {dumps}")
    with open(os.path.join(workdir, dumps[0])) as f:
        lines = f.read().splitlines()
    names = next(line for line in lines if line.startswith("events:")).split()[1:]
    totals = [int(v) for v in next(line for line in lines if line.startswith("summary:")).split()[1:]]
    steps = passes * 50
    return {name: value / steps for name, value in zip(names, totals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=4, help="measured passes of 50 steps")
    ap.add_argument("--parts", action="store_true",
                    help="also the trainkit loop without each of its parts (regions, loader, step, "
                         "log): what each part adds, in instructions and misses")
    ap.add_argument("--bound", action="store_true",
                    help="also overhead_bound.py's loop (its C built here with gcc): what the "
                         "least recording there can be adds")
    ap.add_argument("--child", choices=list(VARIANTS + PARTS + BOUND), help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.passes < 1:
        ap.error(f"--passes {args.passes}: must be at least 1")
    if args.child:
        child(args.child, args.passes, args.helper)
        return
    missing = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"overhead_instructions.py needs {' and '.join(missing)} (Debian: apt install "
                 f"valgrind gcc); overhead.py measures wall time without them")
    with tempfile.TemporaryDirectory(prefix="tk-instr-") as workdir:
        src, helper = os.path.join(workdir, "cg.c"), os.path.join(workdir, "cg.so")
        with open(src, "w") as f:
            f.write(HELPER_C)
        built = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", helper, src],
                               capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"could not build the callgrind helper (is valgrind's callgrind.h installed, "
                     f"e.g. /usr/include/valgrind/callgrind.h?):\n{built.stderr}")
        import torch

        print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {args.passes * 50} "
              f"measured steps per loop, main thread only; per step:")
        variants = VARIANTS + (PARTS if args.parts else ()) + (BOUND if args.bound else ())
        got = {v: measure(v, args.passes, helper, workdir) for v in variants}
    print(f"  {'':18s}" + "".join(f"{e:>10s}" for e in EVENTS))
    for v in variants:
        print(f"  {v:18s}" + "".join(f"{got[v][e]:10.0f}" for e in EVENTS))
    for v in ("floor", "trainkit") + (BOUND if args.bound else ()):
        added = {e: got[v][e] - got["plain"][e] for e in EVENTS}
        print(f"  {v + ' - plain':18s}" + "".join(f"{added[e]:10.0f}" for e in EVENTS))
    for v in (PARTS if args.parts else ()):  # what each part adds: trainkit less trainkit without it
        part = {e: got["trainkit"][e] - got[v][e] for e in EVENTS}
        print(f"  {v.split(' -')[1] + ' adds':18s}" + "".join(f"{part[e]:10.0f}" for e in EVENTS))
    diff = {e: got["trainkit"][e] - got["plain"][e] for e in EVENTS}
    print(f"trainkit / plain instructions = {got['trainkit']['Ir'] / got['plain']['Ir']:.4f}; "
          f"L2 misses added per step (instruction + data): "
          f"{diff['ILmr'] + diff['DLmr'] + diff['DLmw']:.0f}")


if __name__ == "__main__":
    main()
