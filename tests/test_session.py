"""The session recorder: event files read back, lazy logging, bad input, lifecycle."""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import SlowSGD, loader, mlp, train


def test_loop_records_every_step_in_tensorboard(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path) as s:
        tk.patch(opt)
        batches = tk.patch(loader(n=80, batch_size=8))
        for x, y in batches:
            with tk.profile_region("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with tk.profile_region("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
    got = scalars(tmp_path)
    steps = list(range(1, 11))
    for tag in ("trainkit/step_time_ms", "trainkit/data_wait_ms", "trainkit/samples_per_s",
                "trainkit/update_ms", "trainkit/region/forward_ms", "trainkit/region/backward_ms", "loss"):
        assert [st for st, _ in got[tag]] == steps, tag
        assert all(v >= 0 for _, v in got[tag]), tag
    # samples/s is the batch's items over that step's wall time.
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(8 / (ms / 1e3), rel=1e-4)
    # A step's time covers its parts.
    for (_, ms), (_, fw), (_, bw) in zip(got["trainkit/step_time_ms"], got["trainkit/region/forward_ms"],
                                          got["trainkit/region/backward_ms"]):
        assert ms >= fw + bw
    for tag in ("trainkit/system/cpu_percent", "trainkit/system/rss_MB", "trainkit/memory/peak_MB"):
        assert got[tag], tag
    assert got["trainkit/memory/peak_MB"][-1][1] >= got["trainkit/system/rss_MB"][-1][1] * 0.5


def test_the_first_cpu_load_sample_taken_by_another_thread_is_the_load_since_the_start():
    # The writer thread samples; the sampler is made in the session's. psutil's own interval
    # state is per thread, so the first sample read an interval of ~0 (0.0%).
    import threading

    import psutil

    from trainkit.sinks.system import CPU_PERCENT, SystemSampler

    sampler = SystemSampler()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.4:  # one core busy
        pass
    got = []
    t = threading.Thread(target=lambda: got.append(sampler()[CPU_PERCENT]))
    t.start()
    t.join()
    one_core = 100.0 / (psutil.cpu_count() or 1)  # the load is of all cores: one is 100/n %
    assert one_core / 4 <= got[0] <= 100.0, (got, one_core)  # the bug read ~0.0


def test_log_after_close_and_a_closed_session_entered_again_are_refused(tmp_path):
    s = tk.session(logdir=tmp_path, system_metrics=False)
    s.log("loss", 1.0)
    s.close()
    with pytest.raises(RuntimeError, match=r"log\('val_loss', \.\.\.\) after the session was closed"):
        s.log("val_loss", 0.5)
    with pytest.raises(RuntimeError, match="is closed and records nothing more; start a new one"):
        with s:
            pass
    assert scalars(tmp_path)["loss"] == [(1, 1.0)]


def test_two_threads_starting_a_session_at_once_get_one(tmp_path):
    import threading

    for trial in range(5):
        barrier = threading.Barrier(2)
        got, errors = [], []

        def start(i):
            barrier.wait()
            try:
                got.append(tk.session(logdir=tmp_path / f"{trial}_{i}", system_metrics=False))
            except RuntimeError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 1 and len(errors) == 1, (got, errors)
        assert "already active" in errors[0] and tk.active() is got[0]
        got[0].close()


def test_a_forked_child_starts_a_session_of_its_own(tmp_path):
    # A fork while the parent records (a sweep's worker pool): the inherited session is the
    # parent's, not the child's to close or to be blocked by.
    with tk.session(logdir=tmp_path / "parent", system_metrics=False) as s:
        s.log("a", 1.0)
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                with tk.session(logdir=tmp_path / "child", system_metrics=False) as c:
                    c.log("b", 2.0)
                code = 0 if tk.active() is None else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert tk.active() is s
        s.log("a", 3.0)
    assert scalars(tmp_path / "child")["b"] == [(1, 2.0)]
    assert scalars(tmp_path / "parent")["a"] == [(1, 2.0)]  # 1.0 and 3.0 in one step: the mean


def test_sessions_without_a_logdir_started_in_the_same_second_get_a_folder_each(tmp_path,
                                                                                monkeypatch):
    """runs/<time>_<host> named by the second: two runs started in one second shared it and
    TensorBoard showed them as one. Under torchrun the ranks still share theirs."""
    import datetime

    from trainkit import _logdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_logdir, "run_start_time", lambda: datetime.datetime(2026, 11, 23, 9, 0, 0))
    with tk.session(system_metrics=False) as first:
        first.log("x", 1.0)
    with tk.session(system_metrics=False) as second:
        second.log("x", 2.0)
    assert second.logdir == first.logdir + "-2"
    assert first.logdir.startswith(os.path.join("runs", "Nov23_09-00-00_"))
    assert scalars(first.logdir)["x"] == [(1, 1.0)] and scalars(second.logdir)["x"] == [(1, 2.0)]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    shared = os.path.join("runs", "shared")
    assert _logdir.fresh_folder(shared) == shared and not os.path.exists(shared)


def test_ranks_started_seconds_apart_pick_one_default_logdir():
    # Under torchrun every rank writes <logdir>/rank<N> of one logdir: without logdir=, the
    # folder's time is the launcher's (here this process, the parent of both), not the rank's.
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, RANK="0", WORLD_SIZE="2", PYTHONPATH=REPO)
    code = "from trainkit.session import _default_logdir; print(_default_logdir())"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    time.sleep(1.1)
    second = subprocess.run([sys.executable, "-c", code], env=dict(env, RANK="1"),
                            capture_output=True, text=True)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout and first.stdout.startswith("runs" + os.sep)


def test_session_as_a_decorator_is_refused_and_leaves_no_session_active(tmp_path):
    with pytest.raises(TypeError, match="is no decorator.*with tk.session"):
        @tk.session(logdir=tmp_path / "a")
        def train():
            pass
    with tk.session(logdir=tmp_path / "b") as s:  # not "a session is already active"
        s.log("x", 1.0)
    assert scalars(tmp_path / "b")["x"] == [(1, 1.0)]


def test_values_another_thread_logs_while_the_session_closes_are_written_or_refused(tmp_path):
    import threading

    s = tk.session(logdir=tmp_path, system_metrics=False)
    accepted, stop = [], threading.Event()

    def log_forever():
        i = 0
        while not stop.is_set():
            try:
                s.log("x", float(i), step=i)
            except RuntimeError:  # the session is closed: said, not dropped
                return
            accepted.append(i)
            i += 1

    t = threading.Thread(target=log_forever)
    t.start()
    time.sleep(0.05)
    s.close()
    stop.set()
    t.join()
    assert accepted and [st for st, _ in scalars(tmp_path)["x"]] == accepted


class _Interrupting:
    """A pending value whose reading, in the final write, meets a Ctrl-C."""

    def ready(self):
        return True

    def value(self, wait):
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        return 2.0

    def release(self):
        pass


def test_a_ctrl_c_during_close_acts_once_everything_is_written(tmp_path):
    import signal

    s = tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60)
    for i in range(1, 101):
        s.log("x", float(i), step=i)
    s._buf.append(("y", 100, _Interrupting()))
    with pytest.raises(KeyboardInterrupt):
        s.close()  # the KeyboardInterrupt comes from here, after the close
    assert [st for st, _ in scalars(tmp_path)["x"]] == list(range(1, 101))
    assert scalars(tmp_path)["y"] == [(100, 2.0)]
    assert s.closed and s._recorder.writer._file is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # trainkit's handler is gone


def test_logged_tensor_values_are_the_losses(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    with tk.session(logdir=tmp_path) as s:
        tk.patch(opt)
        train(model, opt, tk.patch(loader(n=32)), log=lambda n, v: (s.log(n, v), expected.append(v.item())))
        s.log("epoch/metric", 0.25, step=100)
    got = scalars(tmp_path)
    assert [v for _, v in got["loss"]] == pytest.approx(expected, rel=1e-6)
    assert got["epoch/metric"] == [(100, 0.25)]


def test_values_logged_twice_in_a_step_are_averaged_and_times_summed(tmp_path):
    with tk.session(logdir=tmp_path) as s:
        s.log("loss", 1.0)
        s.log("loss", 3.0)
        s.record("trainkit/region/x_ms", 2.0)
        s.record("trainkit/region/x_ms", 5.0)
    got = scalars(tmp_path)
    assert got["loss"] == [(1, 2.0)]
    assert got["trainkit/region/x_ms"] == [(1, 7.0)]


def test_usable_without_with_and_close_twice(tmp_path):
    s = tk.session(logdir=tmp_path, system_metrics=False)
    assert tk.active() is s
    s.log("x", 1)
    s.close()
    s.close()
    assert tk.active() is None and s.closed
    assert scalars(tmp_path)["x"] == [(1, 1.0)]
    assert "trainkit/system/rss_MB" not in scalars(tmp_path)


def test_exception_propagates_unchanged_and_records_survive(tmp_path):
    err = RuntimeError("boom")
    with pytest.raises(RuntimeError) as info:
        with tk.session(logdir=tmp_path) as s:
            s.log("before", 7.0)
            raise err
    assert info.value is err
    assert scalars(tmp_path)["before"] == [(1, 7.0)]


def test_one_session_at_a_time(tmp_path):
    with tk.session(logdir=tmp_path / "a") as s:
        with pytest.raises(RuntimeError, match="already active"):
            tk.session(logdir=tmp_path / "b")
        assert tk.active() is s
    assert not (tmp_path / "b").exists()  # refused before anything was created


def test_logdir_that_is_a_file_is_refused_before_anything_starts(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"is a file.*pass a folder"):
        tk.session(logdir=f)
    assert tk.active() is None


def test_logdir_that_cannot_be_created_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="cannot create the folder"):
        tk.session(logdir=f / "sub")
    with pytest.raises(ValueError, match="cannot create"):
        tk.session(logdir="/proc/trainkit-nope")


@pytest.mark.parametrize("kwargs, exc, text", [
    ({"logdir": 42}, TypeError, "logdir=42"),
    ({"logdir": "runs/a\0b"}, ValueError, r"logdir='runs/a\\x00b'\): a path cannot hold a NUL"),
    ({"log_every": 0}, ValueError, "log_every=0"),
    ({"flush_secs": -1}, ValueError, "flush_secs=-1"),
    ({"flush_secs": float("nan")}, ValueError, "flush_secs=nan"),
    ({"system_metrics": "yes"}, TypeError, "system_metrics='yes'"),
    ({"profile": {"wait": 1}}, TypeError, "ProfileSchedule"),
    ({"steps_done": -1}, ValueError, r"steps_done=-1\): .*steps_done=checkpoint\['step'\]"),
    ({"steps_done": True}, ValueError, "steps_done=True"),
    ({"steps_done": 12.0}, ValueError, "steps_done=12.0"),
    ({"steps_done": "12"}, ValueError, "steps_done='12'"),
])
def test_bad_session_arguments(tmp_path, kwargs, exc, text):
    kwargs.setdefault("logdir", tmp_path / "run")
    with pytest.raises(exc, match=text):
        tk.session(**kwargs)
    assert tk.active() is None
    if "logdir" not in text:
        assert not (tmp_path / "run").exists()  # refused before anything was made


def test_a_resumed_session_numbers_its_steps_on_from_steps_done(tmp_path):
    """steps_done=N (a numpy integer too): the first step is N + 1, the file starts with
    SessionLog.START there, and what is logged lands on the resumed steps."""
    from tensorboard.compat.proto import event_pb2

    from trainkit.profiling.runs import event_records

    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False, steps_done=np.int64(40)) as s:
        assert s.step == 41 and s.steps_done == 40 and "step 41" in repr(s)
        for _ in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            s.log("loss", loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert s.step == 44 and s.steps_done == 43
    got = scalars(str(tmp_path))
    assert [st for st, _ in got["loss"]] == [41, 42, 43]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [42, 43]
    (path,) = [p for p in tmp_path.iterdir() if "tfevents" in p.name]
    events = [event_pb2.Event.FromString(r) for r in event_records(str(path))]
    start = event_pb2.SessionLog.START  # twice: TensorBoard's legacy loader skips a run's first
    assert [(e.session_log.status, e.step) for e in events[1:3]] == [(start, 41)] * 2
    assert not any(e.HasField("session_log") for e in events[3:])
    tk.unpatch(opt)


def test_bad_log_calls(tmp_path):
    with tk.session(logdir=tmp_path) as s:
        with pytest.raises(ValueError, match=r"shape \(2,\).*t.mean\(\)"):
            s.log("loss", torch.ones(2))
        with pytest.raises(TypeError, match="name must be a non-empty str"):
            s.log("", 1.0)
        with pytest.raises(TypeError, match="value must be a real number"):
            s.log("x", "high")
        with pytest.raises(ValueError, match=r"shape \(3,\).*a.mean\(\)"):
            s.log("x", np.ones(3))
        with pytest.raises(TypeError, match="value must be a real number"):
            s.log("x", np.complex64(1 + 2j))
        with pytest.raises(ValueError, match="step=-1"):
            s.log("x", 1.0, step=-1)


def test_numpy_scalars_and_one_element_arrays_are_logged(tmp_path):
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        s.log("flag", np.bool_(True))
        s.log("zero_d", np.array(2.5))
        s.log("one", np.array([[4]], dtype=np.int64))
        s.log("f32", np.float32(0.25))
        s.log("plain_bool", False)
        s.log("at", 7.0, step=np.int64(3))
        s.log("huge", 10 ** 400)
        with pytest.raises(TypeError, match="value must be a real number"):
            s.log("x", np.timedelta64(1, "D"))
        with pytest.raises(ValueError, match="step must be a non-negative int"):
            s.log("x", 1.0, step=np.float64(2.0))
    got = scalars(tmp_path)
    assert got["at"] == [(3, 7.0)] and got["huge"] == [(1, math.inf)]
    assert (got["flag"], got["zero_d"], got["one"], got["f32"], got["plain_bool"]) == \
        ([(1, 1.0)], [(1, 2.5)], [(1, 4.0)], [(1, 0.25)], [(1, 0.0)])


def test_rank_folder_under_torchrun_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with tk.session(logdir=tmp_path) as s:
        s.log("x", 1.0)
    assert s.logdir == os.path.join(str(tmp_path), "rank1")
    assert scalars(tmp_path / "rank1")["x"] == [(1, 1.0)]


def test_writer_thread_flushes_without_close(tmp_path):
    """Records reach the file while the run goes on (what makes SIGKILL lose at most flush_secs)."""
    with tk.session(logdir=tmp_path, flush_secs=0.2, system_metrics=False):
        tk.patch(opt := torch.optim.SGD(mlp().parameters(), lr=0.1))
        for _ in range(3):
            opt.step()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = scalars(tmp_path)
            if len(got.get("trainkit/update_ms", [])) == 3:
                break
            time.sleep(0.1)
        assert [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3]
    tk.unpatch(opt)


def test_value_logged_after_the_step_joins_that_steps_event(tmp_path):
    """With log_every=1 the writer is woken at every step's end, before the loss of that step is
    logged (just after optimizer.step()); it keeps the step back, so each step is one event."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, log_every=1, flush_secs=60, system_metrics=False) as s:
        for x, y in tk.patch(loader(n=64, batch_size=8)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)  # the writer, woken by the step, runs now
            s.log("loss", loss)
    events = {}
    for path in tmp_path.iterdir():
        for ev in EventFileLoader(str(path)).Load():
            tags = {v.tag for v in ev.summary.value}
            if "trainkit/update_ms" in tags or "loss" in tags:
                events.setdefault(ev.step, []).append(tags)
    assert sorted(events) == list(range(1, 9))
    for step, tag_sets in events.items():
        assert len(tag_sets) == 1 and {"loss", "trainkit/update_ms"} <= tag_sets[0], (step, tag_sets)


def test_user_names_never_taken_for_internal_records(tmp_path):
    """Names like trainkit's internal ones ("_t", "_items", "_step") are the user's own tags."""
    opt = tk.patch(torch.optim.SGD(mlp().parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for _ in range(2):
            opt.step()
            for i, name in enumerate(("_t", "_items", "_step", "_batch")):
                s.log(name, float(i))
    got = scalars(tmp_path)
    assert {name: [v for _, v in got[name]] for name in ("_t", "_items", "_step", "_batch")} == {
        "_t": [0.0, 0.0], "_items": [1.0, 1.0], "_step": [2.0, 2.0], "_batch": [3.0, 3.0]}
    assert [st for st, _ in got["trainkit/update_ms"]] == [1, 2]


def test_no_session_means_nothing_recorded_and_nothing_breaks(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.profile_region("forward"):
        train(model, opt, tk.patch(loader(n=16)))
    assert tk.to_device(torch.ones(2), "cpu").sum() == 2
    assert list(tmp_path.iterdir()) == []


def test_bad_technique_overrides_leave_no_session_open(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"tf32": ')
    with pytest.raises(ValueError, match="TRAINKIT_TECHNIQUES"):
        tk.session(logdir=tmp_path / "run")
    assert tk.active() is None
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_log_refuses_trainkits_own_tags_and_keeps_them_intact(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for name, fix in (("trainkit/step_time_ms", "'my/step_time_ms'"), ("\0t", "'t'")):
            with pytest.raises(ValueError) as e:
                s.log(name, torch.tensor(1e9))
            assert repr(name) in str(e.value) and fix in str(e.value)
        for x, y in tk.patch(loader(n=16, batch_size=8)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            s.log("trainkit_loss", torch.tensor(2.0))  # a name merely starting alike is the user's
    tk.unpatch(opt)
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2]
    assert all(v < 1e6 for _, v in got["trainkit/step_time_ms"])  # nothing of the refused 1e9
    assert got["trainkit_loss"] == [(1, 2.0), (2, 2.0)]


def test_values_past_float32_are_written_as_inf_and_complex_is_refused(tmp_path):
    import math

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        with pytest.raises(TypeError, match="complex"):
            s.log("z", torch.tensor(1 + 1j))
        for i, (x, y) in enumerate(tk.patch(loader(n=40, batch_size=8))):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
            if i == 1:  # a perplexity exp(loss) past float32, as a float64 tensor and a float
                s.log("ppl", torch.tensor(1e39, dtype=torch.float64))
                s.log("neg", -math.exp(90.0))
    tk.unpatch(opt)
    got = scalars(tmp_path)
    assert [st for st, _ in got["loss"]] == [1, 2, 3, 4, 5]  # nothing after the big value is lost
    assert got["ppl"] == [(2, math.inf)] and got["neg"] == [(2, -math.inf)]
    assert "z" not in got


def test_a_value_that_cannot_be_resolved_is_left_out_alone(tmp_path):
    """Whatever one recorded value does, the writer writes everything else (and says so)."""

    class Broken:
        def ready(self):
            return True

        def value(self, wait=False):
            raise RuntimeError("device lost")

        def release(self):
            pass

    with pytest.warns(RuntimeWarning, match="'odd' could not be written.*device lost"):
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            s.record("odd", Broken())
            s.log("kept", 3.0)
            s.step_done(time.perf_counter())
            s.log("later", 4.0)
    got = scalars(tmp_path)
    assert got["kept"] == [(1, 3.0)] and got["later"] == [(2, 4.0)] and "odd" not in got


class _Pending:
    """A stand-in for a GPU value (timing.PendingInterval): ready when told; its event goes back
    to a pool on release, so reading it after a release would read another record's time."""

    def __init__(self, v, ready=True):
        self.v, self.is_ready, self.released = v, ready, 0

    def ready(self):
        return self.is_ready

    def value(self, wait=False):
        assert self.released == 0, "read after its release"
        return self.v

    def release(self):
        self.released += 1


def test_a_step_waiting_for_the_gpu_releases_nothing_until_all_its_values_are_ready(tmp_path):
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        rec = s._recorder
        with rec._lock:
            early, late = _Pending(1.5), _Pending(2.5, ready=False)
            s.record("a_early", early)
            s.record("b_late", late)
            s.step_done(time.perf_counter())
            s.step_done(time.perf_counter())
            rec.flush(final=False)  # step 1 waits for b_late: nothing of it is resolved yet
            assert early.released == 0 and late.released == 0
            late.is_ready = True
            rec.flush(final=False)
            assert early.released == 1 and late.released == 1
    got = scalars(tmp_path)
    assert got["a_early"] == [(1, 1.5)] and got["b_late"] == [(1, 2.5)]


def test_records_and_the_writer_stay_out_of_the_older_gc_generations(tmp_path):
    """A run records thousands of steps between two writes: the records must be untracked by
    the GC once it sees them, and writing them must not hold them all as containers at once
    (promoted by the ten thousand, they brought on full collections that stalled training)."""
    import gc

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=64, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        rec = s._recorder
        with rec._lock:  # the writer thread waits: the records stay in the buffer
            for _ in range(250):  # 2000 steps
                for x, y in tk.patch(batches):
                    with tk.profile_region("forward"):
                        loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    s.log("loss", loss)
            assert len(rec.buf) >= 2000 * 4
            gc.collect(0)  # (it records its own time under step 2001, after it ran)
            assert not [r for r in rec.buf if r[1] <= 2000 and gc.is_tracked(r)][:3]
            collections = []
            gc.callbacks.append(lambda phase, info: collections.append(info["generation"])
                                if phase == "start" else None)
            try:
                rec.flush(final=False)
            finally:
                gc.callbacks.pop()
            assert len(collections) <= 1, collections
    tk.unpatch(opt)
    assert [st for st, _ in scalars(tmp_path)["loss"]] == list(range(1, 2001))


def _one_event_per_step(logdir):
    """``tag -> [(step, value)]``, checking that no tag has two events at one step."""
    got = scalars(logdir)
    for tag, points in got.items():
        steps = [st for st, _ in points]
        assert len(steps) == len(set(steps)), (tag, steps)
    return got


@pytest.mark.parametrize("patched_loader", [True, False], ids=["patched-loader", "plain-loader"])
@pytest.mark.parametrize("log_every", [1, 1000])
def test_a_gans_two_optimizers_make_one_event_per_step(tmp_path, log_every, patched_loader):
    # A GAN: D's optimizer makes the steps, G's update (a second optimizer) adds to the step of
    # the batch it trained on (with a plain loader: the step D ended). Records do not come in
    # step order: region "g" starts after D's step ended and goes under the step in progress,
    # while G's update, inside it, goes under the step D ended. Each step is still one event,
    # its update_ms D's and G's together.
    D, G = torch.nn.Linear(4, 1), torch.nn.Linear(4, 4)
    od = tk.patch(torch.optim.SGD(D.parameters(), lr=0.01))
    og = tk.patch(SlowSGD(G.parameters(), lr=0.01))
    data = [torch.randn(8, 4) for _ in range(12)]
    with tk.session(logdir=tmp_path, system_metrics=False, log_every=log_every) as s:
        for i, x in enumerate(tk.patch(data) if patched_loader else data):
            with tk.profile_region("d"):
                D(x).mean().backward()
                od.step()
                od.zero_grad()
            with tk.profile_region("g"):
                (-D(G(x)).mean()).backward()
                og.step()
                og.zero_grad()
            s.log("loss", float(i))
            s.log("loss", float(i) + 2)
    got = _one_event_per_step(tmp_path)
    later = 0 if patched_loader else 1  # without a loader: the step in progress, after D's
    assert got["loss"] == [(i + 1 + later, i + 1.0) for i in range(12)]
    assert [st for st, _ in got["trainkit/update_ms"]] == list(range(1, 13))
    assert all(ms >= 5.0 for _, ms in got["trainkit/update_ms"])  # G's 5 ms sleep is in each
    # "d" wraps D's step: it goes under that step either way
    assert [st for st, _ in got["trainkit/region/d_ms"]] == list(range(1, 13))
    assert [st for st, _ in got["trainkit/region/g_ms"]] == list(range(2, 14))
    assert all(ms >= 5.0 for _, ms in got["trainkit/region/g_ms"])


def test_values_for_a_later_step_and_an_earlier_one_join_their_steps(tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for i in range(6):
            k = s.step
            s.log("y", 1.0)
            s.log("ahead", 0.5, step=k + 1)  # known ahead, for the next step
            s.log("y", 3.0)
            if i == 5:
                s.log("late", 100.0, step=2)  # a few steps back, joins step 2's event
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    got = _one_event_per_step(tmp_path)
    assert got["y"] == [(k, 2.0) for k in range(1, 7)]
    assert got["ahead"] == [(k, 0.5) for k in range(2, 8)]
    assert got["late"] == [(2, 100.0)]


def test_values_logged_far_ahead_of_the_steps_are_written_while_the_run_goes_on(tmp_path):
    # An RL loop logs each episode's reward by environment step, ahead of the optimizer's count
    # (one update per 4 environment steps). They were held until the session closed: nothing in
    # TensorBoard meanwhile, and a SIGKILL lost them all.
    p = torch.nn.Parameter(torch.zeros(2))
    opt = tk.patch(torch.optim.SGD([p], lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60) as s:
        for t in range(1, 401):
            if t % 4 == 0:
                p.sum().backward()
                opt.step()
                opt.zero_grad()
            if t % 25 == 0:
                s.log("episode/reward", float(t), step=t)
        s.log("next", 1.0, step=s.step + 1)  # just ahead: waits to join its step's event
        s.flush()
        mid = scalars(tmp_path)
    # in order in the file too: TensorBoard's data server drops a tag's points past a step that
    # goes back (written ahead, 125 came before 100, and TensorBoard showed no 125)
    assert mid["episode/reward"] == [(t, float(t)) for t in range(25, 401, 25)]
    assert "next" not in mid
    got = _one_event_per_step(tmp_path)
    assert got["episode/reward"] == mid["episode/reward"] and got["next"] == [(102, 1.0)]
    tk.unpatch(opt)


def test_a_step_written_ahead_never_comes_before_an_earlier_one_of_its_tags(tmp_path):
    # The writer's flush while the optimizer is at step 95: the reward of environment step 100
    # (not past the step in progress by enough to be written ahead) is held back, so the one of
    # step 125 is too; a tag of its own at step 150 is written at once.
    from trainkit.recorder import Recorder

    done = [95]
    rec = Recorder(str(tmp_path), flush_secs=3600, completed=lambda: done[0])
    try:
        rec.buf.extend([("r", 100, 1.0), ("r", 125, 2.0), ("other", 150, 3.0)])
        rec.flush(final=False)
        assert scalars(tmp_path) == {"other": [(150, 3.0)]}
        done[0] = 100
        rec.flush(final=False)
        assert scalars(tmp_path)["r"] == [(100, 1.0), (125, 2.0)]
    finally:
        rec.close()


def test_a_step_begun_at_a_cuda_event_and_ended_on_the_host_is_timed_from_its_host_time(tmp_path):
    # CUDA in use before the first batch (pinned memory, a device query) while the optimizer's
    # parameters are on the CPU: the step began at a CUDA event and ends at a host time. It is
    # timed from the host time kept beside the event (before, float - Event raised in the step).
    class RecordedEvent:  # stands in for the torch.cuda.Event a GPU session would hold here
        pass

    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        t0 = time.perf_counter()
        s._last_step_end, s._last_step_host = RecordedEvent(), t0
        s.step_done(t0 + 0.25)
    assert scalars(tmp_path)["trainkit/step_time_ms"] == [(1, pytest.approx(250.0))]


@pytest.mark.cuda
def test_a_cuda_tensor_logged_is_the_value_at_log_time(tmp_path):
    # Copied to the host as the step queues it: changed in place afterwards, it is still the
    # value logged (before, the writer read the live tensor up to a flush later).
    total = torch.zeros((), device="cuda")
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        total += 1.0
        s.log("total", total)
        total += 41.0
    assert scalars(tmp_path)["total"] == [(1, 1.0)]


@pytest.mark.cuda
def test_on_a_gpu_a_batch_step_holds_its_own_wait(tmp_path):
    # Batches as steps with CUDA in use: a step ends as the next wait begins (its CUDA event is
    # recorded before the wait, as the CPU path takes the host time), so each step's time holds
    # its own batch's wait and body, the first one's included.
    class Slow:
        def __iter__(self):
            for delay in (0.05, 0.005, 0.03):
                time.sleep(delay)
                yield torch.zeros(4, 2)

    torch.zeros(1, device="cuda")
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in tk.patch(Slow()):
            time.sleep(0.01)
    got = scalars(tmp_path)
    waits = [v for _, v in got["trainkit/data_wait_ms"]]
    steps = [v for _, v in got["trainkit/step_time_ms"]]
    assert len(steps) == 3 and all(st >= w + 10.0 - 1.0 for st, w in zip(steps, waits)), (steps, waits)


def test_log_inside_code_torch_compile_traces_records_each_value(tmp_path):
    # An auxiliary loss logged in a compiled model's forward: traced, s.log's appends to the
    # buffer the writer thread empties failed dynamo's guards ("Guard failed on the same frame
    # it was created") and the training crashed. It now runs outside the graph, as print()
    # would, and every value is written under its step.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 3)

        def forward(self, x):
            h = self.a(x)
            tk.active().log("aux", h.pow(2).mean())
            return h

    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, backend="eager")
    opt = tk.patch(torch.optim.SGD(net.parameters(), lr=0.1))
    xs = [torch.randn(4, 8) for _ in range(4)]
    with torch.no_grad():
        first = net.a(xs[0]).pow(2).mean().item()  # the first step's, before any update
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x in xs:
            compiled(x).sum().backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)["aux"]
    assert [st for st, _ in got] == [1, 2, 3, 4]
    assert got[0][1] == pytest.approx(first, rel=1e-6)


class _LogsFiveKinds(torch.nn.Module):
    """A forward that logs a tensor, a float, an int, an int tensor and a value at a step."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)
        s = tk.active()
        s.log("t", h.mean())
        s.log("f", 2.5)
        s.log("i", 3)
        s.log("count", (h > 0).sum())
        s.log("at", h.sum(), step=42)
        return h


def _dynamo_clean():
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.reset()
    counters.clear()
    return counters, guard_failures


@pytest.mark.parametrize("log_frames", ["skipped_at_start", "compiled_once"])
def test_log_in_compiled_code_recompiles_nothing_whatever_it_logs(tmp_path, monkeypatch,
                                                                  log_frames):
    # The graph break of s.log was inside log itself: its frame was compiled too, and one resume
    # function in log, shared by every call site, recompiled for each kind of value and step
    # logged (5 here; past recompile_limit, 8, dynamo warned and gave up on it). The break is now
    # at each call site, and log's own frames run as they are: skipped by dynamo from the
    # session's start, or (torch.compile first imported later, as here after a reset) from the
    # first time dynamo compiles one.
    import torch._dynamo.eval_frame

    from trainkit import _compiled

    if not hasattr(torch._dynamo.eval_frame, "set_code_exec_strategy"):
        pytest.skip("this torch's dynamo cannot be told to run s.log's frames as they are "
                    "(no eval_frame.set_code_exec_strategy, torch 2.4 and older)")
    counters, guard_failures = _dynamo_clean()
    if log_frames == "compiled_once":  # the skip the session's start made was lost (a reset)
        monkeypatch.setattr(_compiled, "_log_frames_skipped", True)
        torch._dynamo.eval_frame.reset_code(sys.modules["trainkit.session"].Session.log.__code__)
    else:
        monkeypatch.setattr(_compiled, "_log_frames_skipped", False)
    torch.manual_seed(0)
    net = _LogsFiveKinds()
    compiled = torch.compile(net, backend="eager")
    xs = [torch.randn(4, 8) for _ in range(3)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x in xs:
            compiled(x)
    assert dict(guard_failures) == {}
    breaks = counters["graph_break"]  # one at each call site, traced once
    assert sum(n for reason, n in breaks.items() if "Session.log" in reason) == 5, breaks
    if log_frames == "compiled_once":  # that path was taken: log's frame compiled, once
        assert sum(n for r, n in breaks.items() if "_log_from_compiled_frame" in r) == 1, breaks
    got = scalars(tmp_path)
    with torch.no_grad():
        means = [net.a(x).mean().item() for x in xs]
    assert got["t"] == [(1, pytest.approx(sum(means) / 3, rel=1e-6))]  # one step: averaged
    assert got["f"] == [(1, 2.5)] and got["i"] == [(1, 3.0)]
    assert [st for st, _ in got["at"]] == [42] and len(got["count"]) == 1


def test_log_in_a_fullgraph_compiled_forward_says_what_to_do(tmp_path):
    # Under fullgraph=True the graph break is refused: the error named only torch's own
    # torch.compiler.disable ("Remove the torch.compiler.disable call", reason: None), which the
    # user never called. It now says it is trainkit's s.log, and what to do.
    import inspect

    if "_torchdynamo_disable_msg" not in inspect.getsource(torch._dynamo.eval_frame):
        pytest.skip("this torch's dynamo shows no reason for a disabled function (torch 2.4 "
                    "and older): its error names torch.compiler.disable only")
    _dynamo_clean()
    compiled = torch.compile(_LogsFiveKinds(), backend="eager", fullgraph=True)
    with tk.session(logdir=tmp_path, system_metrics=False):
        with pytest.raises(Exception, match=r"trainkit: s.log .*fullgraph=True, return the value"):
            compiled(torch.randn(4, 8))
