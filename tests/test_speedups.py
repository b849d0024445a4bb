"""trainkit._speedups, the C version of the session writer's pass and writes, against the Python
code it mirrors: the same records must give byte-identical event files.

The records are made as the hot paths make them (a step's record, a batch's, regions, values
logged by the user, GPU values pending until ready, host-to-device copies) and out of the common
shape too (several values of one tag in a step, steps out of order, logged far ahead, at step 0
and past 2**32, values past float32's range, NaN, ints), then written by two recorders, one with
the C module and one without, flushed at the same points.

Also here: the build (CI builds it, it compiles warning-free, the environment can turn it off) and
profile_region's C entry and exit (the same records as the Python ones). The patched step's C
path is in test_speedups_step.py.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import sys
import threading
from typing import Any, List, Tuple

import pytest

from trainkit import recorder
from trainkit.recorder import (BATCH_REC, DATA_WAIT, H2D_BYTES, H2D_MS, H2D_PINNED_BYTES,
                               PASS_END_WAIT, STEP_REC, Recorder)

fast = recorder._fast
needs_c = pytest.mark.skipif(fast is None, reason="trainkit._speedups is not built here "
                                                  "(no C compiler at install)")


class Pending:
    """A GPU value (timing.PendingInterval) as the writer sees it: ready after a number of
    ``ready()`` questions, read once, released once."""

    def __init__(self, v: float, polls: int) -> None:
        self.v, self.polls, self.released = v, polls, 0

    def ready(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def value(self, wait: bool = False) -> float:
        assert self.released == 0, "read after its release"
        return self.v

    def release(self) -> None:
        self.released += 1


_ODD = [0.0, -0.0, 1e-45, 3.4028235e38, 3.4028236e38, 1e39, -1e39, math.inf, -math.inf, math.nan,
        123456.789, -2.5]


def _value(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.7:
        return rng.uniform(-10, 10)
    if r < 0.85:
        return rng.choice(_ODD)
    if r < 0.95:
        return rng.randint(-5, 5)  # an int, which only s.record() passes through as it is
    return ("pending", rng.uniform(0, 5), rng.randint(0, 3))


def make_script(seed: int) -> List[Tuple[str, Any]]:
    """A run as a list of actions: ("rec", spec) puts a record, ("flush", (final, slack)),
    ("done", None) completes a step."""
    rng = random.Random(seed)
    script: List[Tuple[str, Any]] = []
    t = 100.0
    step = rng.choice([0, 1, 1, 1, 2 ** 33])
    prev_end: Any = None
    tags = ["trainkit/region/forward_ms", "trainkit/region/backward_ms", "loss", "acc", "lr",
            "trainkit/amp/scale", "x/" + "long" * 40]
    for _ in range(rng.randint(5, 60)):
        for _ in range(rng.choice([1, 1, 1, 2, 3])):  # micro-batches
            t0 = t
            t += rng.uniform(1e-4, 1e-2)
            items = rng.choice([32, 32, None, -8, 7.0, 0])
            script.append(("rec", (BATCH_REC, step, t0, t, items)))
            for tag in rng.sample(tags, rng.randint(0, len(tags))):
                back = rng.random() < 0.1  # a region that began before the last step ended
                script.append(("rec", (tag, max(step - 1, 0) if back else step, _value(rng))))
            if rng.random() < 0.15:
                script.append(("rec", (H2D_BYTES, step, float(rng.choice([0, 1 << 20, 12345])))))
                script.append(("rec", (H2D_MS, step, rng.choice([0.0, 0.25, 1.5]))))
                if rng.random() < 0.5:
                    script.append(("rec", (H2D_PINNED_BYTES, step, float(1 << 19))))
            if rng.random() < 0.05:
                script.append(("rec", (DATA_WAIT, step, rng.uniform(0, 1))))
        if rng.random() < 0.1:  # a pass's end, in the step in progress (counted or not)
            script.append(("rec", (PASS_END_WAIT, step, rng.uniform(0, 50))))
        if rng.random() < 0.1:
            ahead = step + rng.choice([1, 9, 50, 500])
            script.append(("rec", ("reward", ahead, _value(rng))))
        if rng.random() < 0.9:
            t0 = t
            t += rng.uniform(1e-4, 1e-3)
            # the previous step's end: a float, none yet, or a CUDA event (left out of the time)
            prev = prev_end if rng.random() < 0.9 else ("event",)
            script.append(("rec", (STEP_REC, step, t0, t, prev)))
            prev_end = t
        step += 1
        script.append(("done", None))
        if rng.random() < 0.3:
            script.append(("flush", (False, rng.choice([0, 1]))))
    if rng.random() < 0.5:  # the last pass's end, after the last step: never counted
        script.append(("rec", (PASS_END_WAIT, step, 30.0)))
    script.append(("flush", (True, 0)))
    return script


def _materialize(spec: Any) -> Any:
    out = []
    for x in spec:
        if isinstance(x, tuple) and x and x[0] == "pending":
            x = Pending(x[1], x[2])
        elif isinstance(x, tuple) and x == ("event",):
            x = object()
        out.append(x)
    return tuple(out)


def run_script(folder: str, script: List[Tuple[str, Any]], use_c: bool,
               monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The event file's bytes after its first two records (the file's own header event and
    trainkit's versions text)."""
    done = [0]
    monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
    rec = Recorder(folder, flush_secs=1e6, sample_secs=1e6, completed=lambda: done[0])
    rec._wall0, rec._perf0 = 1.7e9, 50.0
    clock = iter(range(10 ** 9))
    monkeypatch.setattr(recorder.time, "time", lambda: 1.8e9 + next(clock) / 8)
    try:
        for action, arg in script:
            if action == "rec":
                rec.buf.append(_materialize(arg))
            elif action == "done":
                done[0] += 1
            else:
                final, slack = arg
                if final:
                    rec.close()
                else:
                    rec.flush(final=False, slack=slack)
    finally:
        monkeypatch.undo()
        rec.close()
    with open(rec.writer.path, "rb") as f:
        data = f.read()
    at = 0
    for _ in range(2):  # the file's header event, and the versions text (written at its time)
        at += 12 + int.from_bytes(data[at:at + 8], "little") + 4
    return data[at:]


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_c_and_python_write_the_same_bytes(tmp_path, monkeypatch, seed):
    script = make_script(seed)
    with _quiet():
        py = run_script(str(tmp_path / "py"), script, False, monkeypatch)
        c = run_script(str(tmp_path / "c"), script, True, monkeypatch)
    assert len(py) > 0
    assert c == py


@pytest.mark.parametrize("use_c", [pytest.param(True, marks=needs_c), False])
def test_a_pass_end_is_data_wait_of_a_counted_step_and_no_point_of_one_never_counted(
        tmp_path, monkeypatch, use_c):
    from tests.conftest import scalars

    script = [("rec", (BATCH_REC, 1, 0.0, 0.001, 32)), ("rec", (PASS_END_WAIT, 1, 40.0)),
              ("rec", (STEP_REC, 1, 0.05, 0.06, 0.0)), ("done", None),
              ("rec", (PASS_END_WAIT, 2, 30.0)), ("flush", (True, 0))]
    run_script(str(tmp_path), script, use_c, monkeypatch)
    got = scalars(str(tmp_path))
    assert got["trainkit/data_wait_ms"] == [(1, pytest.approx(41.0))]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1]


class _quiet:
    """Values that cannot be written (none here) would warn; the two runs must agree anyway."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)


@needs_c
def test_the_c_events_read_back_in_tensorboard(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    script = [("rec", (BATCH_REC, 1, 0.0, 0.001, 32)), ("rec", ("loss", 1, 2.5)),
              ("rec", (STEP_REC, 1, 0.002, 0.003, None)), ("done", None),
              ("rec", (BATCH_REC, 2, 0.003, 0.004, 32)), ("rec", ("loss", 2, 1e39)),
              ("rec", (STEP_REC, 2, 0.005, 0.007, 0.003)), ("done", None), ("flush", (True, 0))]
    run_script(str(tmp_path), script, True, monkeypatch)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert got["loss"] == [(1, 2.5), (2, math.inf)]
    assert got["trainkit/data_wait_ms"] == [(1, pytest.approx(1.0)), (2, pytest.approx(1.0))]
    assert got["trainkit/step_time_ms"] == [(2, pytest.approx(4.0))]
    assert got["trainkit/samples_per_s"] == [(2, pytest.approx(32 / 0.004, rel=1e-6))]
    assert got["trainkit/update_ms"] == [(1, pytest.approx(1.0)), (2, pytest.approx(2.0))]


@needs_c
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 200, 4097])
def test_crc32c_is_google_crc32cs(n):
    google_crc32c = pytest.importorskip("google_crc32c")
    data = random.Random(n).randbytes(n)
    assert fast.crc32c(data) == google_crc32c.value(data)


@needs_c
def test_a_write_that_fails_is_the_same_error_as_in_python(tmp_path, monkeypatch):
    script = [("rec", ("loss", 1, 2.5)), ("done", None)]
    for use_c in (False, True):
        monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
        rec = Recorder(str(tmp_path / str(use_c)), flush_secs=1e6, sample_secs=1e6,
                       completed=lambda: 1)
        rec.buf.append(script[0][1])
        f, rec.writer._file = rec.writer._file, None  # closed under the writer
        with pytest.raises(ValueError, match="is closed; open a new session"):
            rec.flush(final=False)
        rec.writer._file = f
        rec.close()
        monkeypatch.undo()


def test_pure_python_is_chosen_by_the_environment():
    import importlib.util

    built = importlib.util.find_spec("trainkit._speedups") is not None
    code = "import trainkit.recorder as r; print(r._fast is None)"
    for value, pure in (("1", "True"), ("0", str(not built)), ("", str(not built))):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, TRAINKIT_PURE_PYTHON=value), check=True)
        assert out.stdout.strip() == pure, (value, out.stderr)


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI builds the extension; elsewhere optional")
def test_ci_builds_the_extension():
    import importlib.util

    # built, whether or not this run uses it (TRAINKIT_PURE_PYTHON=1 runs the fallback)
    assert importlib.util.find_spec("trainkit._speedups") is not None, ("trainkit._speedups was not built by `pip install`: a C compiler and "
                              "Python's headers are needed (apt-get install gcc python3-dev)")


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_the_c_source_compiles_without_warnings():
    """-Wall -Wextra clean: a warning there (an unused argument, a missing initializer) has hidden
    real mistakes before, such as keyword arguments a constructor took and ignored."""
    import sysconfig

    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        pytest.skip("no Python.h here (python3-dev)")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainkit",
                       "_speedups.c")
    out = subprocess.run(["gcc", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I" + include,
                          src], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@needs_c
@pytest.mark.parametrize("make", ["RegionEnter", "RegionExit"])
def test_the_c_regions_refuse_keyword_arguments(make):
    from trainkit import timing
    from trainkit.profiling import regions

    regions.load_flags()
    args = {"RegionEnter": ([], timing.now, regions._TAP, regions._TC, regions._Region("r"),
                            threading.get_ident()),
            "RegionExit": ("t", [], None, vars(timing), vars(regions), threading.get_ident())}[make]
    getattr(fast, make)(*args)  # as trainkit makes them
    with pytest.raises(TypeError, match="no keyword arguments"):
        getattr(fast, make)(*args, extra=1)

def _region_records(tmp_path, use_c: bool, monkeypatch: pytest.MonkeyPatch) -> list:
    """The records of a scripted run of regions on a fake clock: nested entries, steps ending
    inside a region and between regions, a region before the first step and outside a session."""
    import trainkit as tk
    from trainkit import timing
    from trainkit.profiling import regions

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(timing, "now", lambda: next(ticks) * 0.25)
    monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
    outer, inner = (regions._fast_region(f"{n}_{use_c}") for n in ("outer", "inner"))
    monkeypatch.setattr(recorder, "_fast", fast)
    with outer:  # no session: nothing recorded, the stack stays balanced
        pass
    with tk.session(logdir=str(tmp_path / str(use_c)), system_metrics=False) as s:
        with s._recorder._lock:  # the writer waits: the records stay in the buffer
            with outer:
                pass  # before the first step
            for _ in range(4):
                with outer:
                    with inner:
                        with inner:  # the same name nested in itself
                            pass
                    s.step_done(timing.now())  # a step ends inside the region
                with inner:
                    pass
                s.step_done(timing.now())
            s._last_step_end = object()  # a CUDA event stands there: the host time is read
            s._last_step_host = timing.now()
            with outer:
                s._last_step_host = None
            with pytest.raises(KeyError):
                with inner:
                    raise KeyError("the user's error goes through")
            out = [r for r in s._recorder.buf if r[0].startswith("trainkit/region/")]
    monkeypatch.undo()
    return [(tag.rsplit("_", 2)[0], step, ms) for tag, step, ms in out]


@needs_c
def test_c_regions_record_what_python_regions_do(tmp_path, monkeypatch):
    py = _region_records(tmp_path, False, monkeypatch)
    c = _region_records(tmp_path, True, monkeypatch)
    assert len(py) == 15 and c == py  # the inner entry inside its name records nothing


@pytest.mark.parametrize("use_c", [pytest.param(True, marks=needs_c), False])
def test_a_region_entered_through_an_exit_stack(tmp_path, monkeypatch, use_c):
    """contextlib.ExitStack calls type(cm).__enter__(cm): with a fast region's entry made of a
    builtin (no instance taken), enter_context(tk.profile_region(...)) raised TypeError."""
    import contextlib

    import trainkit as tk
    from trainkit.profiling import regions

    monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
    monkeypatch.setattr(regions, "_regions", {})
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        with s._recorder._lock:
            with contextlib.ExitStack() as stack:
                stack.enter_context(tk.profile_region("stacked"))
            got = [r for r in s._recorder.buf if r[0] == "trainkit/region/stacked_ms"]
    assert len(got) == 1 and got[0][1] == 1 and got[0][2] >= 0
