"""The writer thread and the events it writes: records reach the file while the run goes on, each
step is one event (a value logged just after the step, a GAN's two optimizers, values logged for a
later or an earlier step), values far ahead of the steps written in order, a GPU value released only
once its step is ready, a value that cannot be resolved left out alone, records kept out of the
GC's older generations; and a step's time from its host time beside a CUDA event, or its own wait
on a GPU."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import SlowSGD, loader, mlp


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


@pytest.mark.parametrize("action", ["always", "error"])
def test_a_value_that_cannot_be_resolved_is_left_out_alone(tmp_path, action):
    """Whatever one recorded value does, the writer writes everything else (and says so), also
    where warnings are errors (python -W error): the warning, raised, was taken for a failed
    write, and everything recorded from then on dropped."""
    import warnings

    class Broken:
        def ready(self):
            return True

        def value(self, wait=False):
            raise RuntimeError("device lost")

        def release(self):
            pass

    odd = f"odd_{action}"  # said once per tag and process
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter(action)
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            s.record(odd, Broken())
            s.log("kept", 3.0)
            s.step_done(time.perf_counter())
            s.log("later", 4.0)
    said = [str(w.message) for w in shown]
    assert len(said) == 1 and f"{odd!r} could not be written (RuntimeError: device lost)" in said[0]
    got = scalars(tmp_path)
    assert got["kept"] == [(1, 3.0)] and got["later"] == [(2, 4.0)] and odd not in got


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


def test_a_failed_write_is_blamed_on_the_disk_only_when_the_disk_failed():
    from trainkit._runfile import warn_lost

    with pytest.warns(RuntimeWarning, match=r"failed \(OSError: \[Errno 28\] No space.*Free some space"):
        warn_lost("runs/x/events", OSError(28, "No space left on device"), "dropped")
    with pytest.warns(RuntimeWarning, match=r"failed \(UnicodeEncodeError.*This is a trainkit bug") as got:
        warn_lost("runs/x/events", UnicodeEncodeError("utf-8", "\udce9", 0, 1, "surrogates"), "dropped")
    assert "Free some space" not in str(got[0].message)
