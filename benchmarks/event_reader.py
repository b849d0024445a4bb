"""How much faster trainkit's event reader (``read_scalars``, what the trainkit tab reads a run
with) is than TensorBoard's EventAccumulator on the same files: both read a run of 10,000 steps of
6 tags, alternately, several times; prints the median of the per-round ratios. Goal: >= 3x with
google-crc32c installed (a dependency), >= 1.5x without it (both then pay tensorboard's
pure-Python CRC). It was a timed assert in tests/profiling/test_event_reader.py, which a loaded
CI machine failed once (1.6x); the test keeps the two readers' equality.

Run: python benchmarks/event_reader.py [--rounds 7] [--steps 10000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainkit.profiling.runs import read_scalars  # noqa: E402
from trainkit.sinks.tensorboard import EventFileWriter  # noqa: E402


def accumulator(folder: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(folder, size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, float(e.value)) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    try:
        import google_crc32c  # noqa: F401
        crc, goal = "google-crc32c", 3.0
    except ImportError:
        crc, goal = "pure-Python CRC", 1.5
    tags = tuple(f"trainkit/t{i}" for i in range(6))
    ratios, ours_s, theirs_s = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        w = EventFileWriter(folder)
        for step in range(1, args.steps + 1):
            w.write_scalars(step=step, values={t: step * (i + 1) / 7.0 for i, t in enumerate(tags)})
        w.close()
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            ours = read_scalars(folder)
            t1 = time.perf_counter()
            theirs = accumulator(folder)
            t2 = time.perf_counter()
            assert ours == theirs
            ours_s.append(t1 - t0)
            theirs_s.append(t2 - t1)
            ratios.append((t2 - t1) / (t1 - t0))
    ratio = statistics.median(ratios)
    print(f"{args.steps} steps x {len(tags)} tags, {args.rounds} rounds, {crc}")
    print(f"read_scalars {statistics.median(ours_s) * 1e3:.0f} ms, EventAccumulator "
          f"{statistics.median(theirs_s) * 1e3:.0f} ms: EventAccumulator / read_scalars = "
          f"{ratio:.2f}x (per round: {' '.join(f'{r:.2f}' for r in ratios)})  goal >= {goal:g}x: "
          f"{'met' if ratio >= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
