"""What a long run costs to read and analyze: ``load_run`` and ``analyze_run`` on a run of N
steps (time, and peak RSS: each in a fresh subprocess, ``ru_maxrss``), and the trainkit tab's
refresh once the run grew by G steps (``TabData.report``, its ``EventReader`` having read the run
before: only the appended records are parsed, so the rest is analysis).

The run is written directly with trainkit's EventFileWriter (a real session writes ~1,500 steps a
second on 2 cores: 11 minutes for 1,000,000), one event per step holding the tags a session
writes for a loop with a patched optimizer, a patched DataLoader and two regions (those of
tests/test_audit_long_runs.py: step time, data wait, forward and backward, update, samples per
second, a logged loss; gc_ms every 5th step; system metrics every 20th), plus the loader's
recorded settings (2 workers, not persistent) and its passes, every 5,000 steps, whose first two
steps wait 150 ms for the workers to start: TA101's advice is then fitted to the loader, as for
a real session's run. The findings' JSON is hashed, so that two versions of trainkit can be seen
to find the same.

Run: python benchmarks/analyze_long.py [--steps 1000000] [--grow 1000] [--refreshes 3]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainkit.recorder import (DATA_WAIT, GC_MS, PREFIX, SAMPLES_PER_S, STEP_TIME,  # noqa: E402
                               UPDATE_MS)
from trainkit.sinks.tensorboard import EventFileWriter  # noqa: E402

RUN = "exp"
PASS_STEPS = 5000
WORKERS = 2
PASSES = PREFIX + "loader/0/passes"
LOADER = {"batch_size": 64, "cuda_available": False, "dataset": "ImageFolder",
          "in_memory": False, "num_workers": WORKERS, "persistent_workers": False,
          "pin_memory": False, "prefetch_factor": 2, "role": "train", "type": "DataLoader"}


def write_steps(w: EventFileWriter, first: int, last: int) -> None:
    """Steps ``first`` to ``last``, as tests/test_audit_long_runs.py writes them, with the
    loader's passes."""
    for s in range(first, last + 1):
        st = 40.0 + (s % 7)
        wait = 8.0 + (s % 3)
        values = {}
        if (s - 1) % PASS_STEPS == 0:
            values[PASSES] = float((s - 1) // PASS_STEPS + 1)
        if (s - 1) % PASS_STEPS < WORKERS:  # a pass's first batches wait for its workers
            wait, st = wait + 150.0, st + 150.0
        if s % 5 == 0:
            values[GC_MS] = 12.0
        values.update({DATA_WAIT: wait, PREFIX + "region/forward_ms": 12.0,
                       PREFIX + "region/backward_ms": 15.0, UPDATE_MS: 2.5, STEP_TIME: st,
                       "loss": 1.0 / s, SAMPLES_PER_S: 8000.0 / st})
        w.write_scalars(step=s, values=values, wall_time=1.7e9 + s * 0.05)
        if s % 20 == 0:
            w.write_scalars(step=s, values={PREFIX + "system/cpu_percent": 50.0,
                                            PREFIX + "system/rss_MB": 900.0},
                            wall_time=1.7e9 + s * 0.05)
    w.flush()


class _Appender(EventFileWriter):
    """An EventFileWriter writing on at the end of an existing event file (as the session's
    writer, still open, does)."""

    def __init__(self, path: str) -> None:  # not super().__init__, which starts a new file
        self.path = path
        self._file = open(path, "ab")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _timing_reads() -> List[float]:
    """Times each ``load_run`` that ``analyze_run`` makes (its reading), into the list returned."""
    from trainkit.profiling import analyze

    real, took = analyze.load_run, []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            took.append(time.perf_counter() - t0)

    analyze.load_run = timed
    return took


def _digest(report: Dict[str, Any]) -> Dict[str, Any]:
    report = {k: v for k, v in report.items() if k != "ablation"}
    text = json.dumps(report, sort_keys=True)
    return {"codes": [f["code"] for f in report["findings"]], "steps": report["steps"],
            "sha1": hashlib.sha1(text.encode()).hexdigest()[:12]}


def child(what: str, folder: str, steps: int, grow: int, refreshes: int) -> Dict[str, Any]:
    if what == "load":
        from trainkit.profiling.runs import load_run

        t0 = time.perf_counter()
        run = load_run(folder, folder)
        took = time.perf_counter() - t0
        return {"s": took, "peak_MB": _peak_mb(), "tags": len(run.scalars)}
    if what == "analyze":
        from trainkit.profiling.analyze import analyze_run

        reads = _timing_reads()
        t0 = time.perf_counter()
        report = analyze_run(folder, folder, name=RUN).to_dict()
        took = time.perf_counter() - t0
        return {"s": took, "read_s": sum(reads), "peak_MB": _peak_mb(), **_digest(report)}
    # refresh: the tab on a copy of the run (the copy grows), read whole once, then grown
    from trainkit.sinks.tbplugin.data import TabData

    with tempfile.TemporaryDirectory() as logdir:
        run = shutil.copytree(folder, os.path.join(logdir, RUN))
        path = os.path.join(run, os.listdir(run)[0])
        reads = _timing_reads()
        data = TabData(logdir)
        t0 = time.perf_counter()
        assert data.report(RUN) is not None
        first = time.perf_counter() - t0
        w = _Appender(path)
        took, read = [], []
        for i in range(refreshes):
            write_steps(w, steps + i * grow + 1, steps + (i + 1) * grow)
            del reads[:]
            t0 = time.perf_counter()
            report = data.report(RUN)
            took.append(time.perf_counter() - t0)
            read.append(sum(reads))
        w.close()
        return {"first_s": first, "s": statistics.median(took), "read_s": statistics.median(read),
                "each_s": took, "peak_MB": _peak_mb(), **_digest(report)}


def _run_child(what: str, folder: str, a: argparse.Namespace) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--folder", folder,
           "--steps", str(a.steps), "--grow", str(a.grow), "--refreshes", str(a.refreshes)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"{what} failed (exit status {out.returncode}); its stderr is above")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--grow", type=int, default=1000, help="steps appended before a refresh")
    ap.add_argument("--refreshes", type=int, default=3, help="refreshes timed (the median)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.folder, a.steps, a.grow, a.refreshes)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, f"run-{a.steps}")
        t0 = time.perf_counter()
        w = EventFileWriter(folder)
        w.write_text(PREFIX + "meta/loader/0", json.dumps(LOADER, sort_keys=True))
        write_steps(w, 1, a.steps)
        w.close()
        wrote = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        load = _run_child("load", folder, a)
        full = _run_child("analyze", folder, a)
        tab = _run_child("refresh", folder, a)
    import torch

    print(f"{a.steps:,} steps ({load['tags']} tags, {size / 2**20:.0f} MiB of events, written in "
          f"{wrote:.1f} s), torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    print(f"load_run:              {load['s']:6.2f} s, peak RSS {load['peak_MB']:5.0f} MB")
    rules = full["s"] - full["read_s"]
    print(f"analyze_run:           {full['s']:6.2f} s (reading {full['read_s']:.2f} s, analysis "
          f"{rules:.2f} s), peak RSS {full['peak_MB']:5.0f} MB; "
          f"analysis / reading: {rules / full['read_s']:.2f}x time, "
          f"{full['peak_MB'] / load['peak_MB']:.2f}x peak RSS of load_run alone")
    print(f"tab, first report:     {tab['first_s']:6.2f} s")
    print(f"tab refresh +{a.grow:,} steps: {tab['s']:6.2f} s median of {a.refreshes} (reading "
          f"{tab['read_s']:.2f} s, analysis {tab['s'] - tab['read_s']:.2f} s; each "
          f"{' '.join(f'{s:.2f}' for s in tab['each_s'])}), peak RSS {tab['peak_MB']:.0f} MB")
    print(f"findings: analyze_run {' '.join(full['codes'])} over {full['steps']:,} steps, "
          f"sha1 {full['sha1']}; tab after growing {' '.join(tab['codes'])} over "
          f"{tab['steps']:,} steps, sha1 {tab['sha1']}")


if __name__ == "__main__":
    main()
