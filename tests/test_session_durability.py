"""What a session keeps whatever the input and the process do: steps past TensorBoard's int64
refused (they were written wrapped around), a flush_secs past threading's longest wait (it made
the close raise over the user's exception, with nothing written) or a numpy one (the writer
died), forked DataLoader workers that record nothing (their copy of the buffer, never drained,
grew for the whole run), a run folder deleted mid-run, a session closed by another thread during
a step, a multiprocessing child's unclosed session, and values logged by ``step=`` alone."""
from __future__ import annotations

import gc
import re
import signal
import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def test_steps_past_int64_are_refused_not_wrapped_around(tmp_path):
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for step in (2**64 + 5, 2**63):
            with pytest.raises(ValueError, match=rf"log\(step={step}\): .*up to 2\*\*63 - 1"):
                s.log("x", 1.0, step=step)
        s.log("x", 2.0, step=2**63 - 1)
        s.log("x", 3.0, step=5)
    assert scalars(tmp_path)["x"] == [(5, 3.0), (2**63 - 1, 2.0)]
    with pytest.raises(ValueError, match=r"steps_done=9223372036854775807\): .*below 2\*\*63"):
        tk.session(logdir=tmp_path / "b", steps_done=2**63 - 1)
    assert not (tmp_path / "b").exists()  # refused before anything was created


@pytest.mark.parametrize("flush_secs", [1e10, 1e300])
def test_a_flush_secs_past_threadings_longest_wait_writes_and_keeps_the_users_error(tmp_path,
                                                                                   flush_secs):
    err = KeyError("users own")
    with pytest.raises(KeyError) as info:
        with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=flush_secs) as s:
            s.log("x", 1.0)
            raise err
    assert info.value is err and info.value.__context__ is None
    assert s.closed and s._recorder.writer._file is None
    assert scalars(tmp_path)["x"] == [(1, 1.0)]


class _Items(torch.utils.data.Dataset):
    """Each item: whether the worker sees a session, and how many records its copy holds."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        with tk.profile_region("decode"):  # timed in the worker: where would it go?
            s = tk.active()
        held = 0 if s is None else len(s._buf)
        return torch.tensor([float(s is not None), float(held)])


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="no fork here")
def test_forked_dataloader_workers_record_nothing(tmp_path):
    sigchld = signal.getsignal(signal.SIGCHLD)  # torch's workers set theirs, for good
    try:
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            loader = torch.utils.data.DataLoader(_Items(), batch_size=8, num_workers=2,
                                                 multiprocessing_context="fork")
            seen = torch.cat([b for b in tk.patch(loader)])
            s.log("x", 1.0)
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
    assert seen.shape == (64, 2)
    assert seen[:, 0].sum() == 0, "a worker saw the parent's session as its own"
    assert seen[:, 1].sum() == 0, "a worker's records piled up in a buffer nobody drains"
    assert [v for _, v in scalars(tmp_path)["x"]] == [1.0]


@pytest.mark.parametrize("action", ["always", "error"])
def test_a_run_folder_deleted_mid_run_is_said_and_made_again_for_what_comes_next(tmp_path, action):
    # "error": where warnings are errors (python -W error), the warning, raised in the write,
    # was taken for a failed write: "trainkit bug", and everything after it dropped.
    import shutil
    import warnings

    logdir = tmp_path / "run"
    s = tk.session(logdir=logdir, system_metrics=False, flush_secs=60)
    for i in range(1, 21):
        s.log("x", float(i), step=i)
    s.flush()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter(action)
        shutil.rmtree(logdir)  # `rm -rf runs/*` to clean up old runs, this one caught too
        for i in range(21, 31):
            s.log("x", float(i), step=i)
        s.close()
    said = [str(w.message) for w in shown]
    assert len(said) == 1 and re.search(r"was deleted while the run went on .*goes to", said[0]), said
    steps = [st for st, _ in scalars(logdir)["x"]]
    assert steps[-10:] == list(range(21, 31)), steps  # before: nothing, and nothing said


def test_numpy_numbers_are_taken_where_python_ones_are(tmp_path):
    import fractions

    import numpy as np

    for flush_secs in (np.float32(0.5), fractions.Fraction(1, 2)):
        with tk.session(logdir=tmp_path / "f", system_metrics=False, flush_secs=flush_secs) as s:
            s._recorder._wake.set()
            time.sleep(0.2)  # before: the writer died at its first wait (TypeError), unsaid
            assert s._recorder._thread.is_alive()
    with tk.session(logdir=tmp_path, system_metrics=False, log_every=np.int64(2),
                    steps_done=np.int64(4)) as s:
        s.log("x", 1.0, step=np.int64(7))
    assert s._log_every.__class__ is int  # the patched step's C code reads it as an int
    assert scalars(tmp_path)["x"] == [(7, 1.0)]


class _ClosedMeanwhile(torch.optim.SGD):
    """Its step ends with the session closed by another thread (a watchdog's, a UI's stop)."""

    def step(self, closure=None):
        import threading

        out = super().step(closure)
        if self.state.get("close_now"):
            t = threading.Thread(target=tk.active().close)
            t.start()
            t.join()
        return out


def test_a_session_closed_by_another_thread_during_a_step_fails_no_step(tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(_ClosedMeanwhile(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for i in range(1, 4):
            model(torch.ones(2, 4)).sum().backward()
            opt.state["close_now"] = i == 3
            opt.step()  # before: RuntimeError "log('\x00step', ...) after the session was closed"
            opt.zero_grad()
            if i < 3:
                s.log("x", float(i))
        assert s.closed and tk.active() is None
        with pytest.raises(RuntimeError, match=r"log\('x', \.\.\.\) after the session was closed"):
            s.log("x", 3.0)  # what the user logs is still refused, not dropped unsaid
    assert scalars(tmp_path)["x"] == [(2, 1.0), (3, 2.0)]  # logged after each step


def _unclosed_session(logdir):
    s = tk.session(logdir=logdir, system_metrics=False, flush_secs=60)  # "usable without `with`"
    for i in range(1, 6):
        s.log("x", float(i), step=i)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_multiprocessing_childs_unclosed_session_is_flushed_at_its_exit(tmp_path, method):
    # Such a child ends by os._exit, which runs no atexit: everything it recorded was lost.
    import multiprocessing

    child = multiprocessing.get_context(method).Process(target=_unclosed_session,
                                                        args=(str(tmp_path),))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert [st for st, _ in scalars(tmp_path).get("x", [])] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("collect", [False, True])
def test_values_logged_by_step_alone_are_written_while_the_run_goes_on(tmp_path, collect):
    # Nothing patched, so no step is ever counted: steps 1..9 waited for the count to reach
    # them, and every later step of their tags waited behind them, until the close. And with
    # them still, while a collection's gc_ms (trainkit's own, for the step in progress) sat in
    # step 1: one garbage collection held all of it until the close.
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.1) as s:
        for i in range(1, 31):
            s.log("loss", float(i), step=i)
            if collect and i == 1:
                gc.collect()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(scalars(tmp_path).get("loss", [])) < 30:
            time.sleep(0.2)
        assert scalars(tmp_path).get("loss", []) == [(i, float(i)) for i in range(1, 31)]
    assert scalars(tmp_path)["loss"] == [(i, float(i)) for i in range(1, 31)]


@pytest.mark.filterwarnings("ignore:trainkit. writing the run:RuntimeWarning")  # no folder
def test_a_trace_that_cannot_be_written_at_the_close_never_replaces_the_users_error(tmp_path):
    import shutil

    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    err = KeyError("users own")
    with pytest.warns(UserWarning, match=r"a profiler trace of step 4 could not be written"):
        with pytest.raises(KeyError) as info:
            with tk.session(logdir=tmp_path / "run", system_metrics=False,
                            profile=tk.ProfileSchedule(wait=1, warmup=1, active=50)):
                for _ in range(4):
                    model(torch.ones(2, 4)).sum().backward()
                    opt.step()
                    opt.zero_grad()
                shutil.rmtree(tmp_path / "run")  # the cycle under way is written at the close,
                (tmp_path / "run").write_text("x")  # where a file now stands
                raise err
    assert info.value is err and info.value.__context__ is None  # before: FileNotFoundError


def test_a_ctrl_c_just_before_the_close_holds_signals_leaves_the_session_to_the_exit(tmp_path):
    """The close marked the session closed and inactive, then held the signals: a KeyboardInterrupt
    between the two left it closed, inactive and never written (the exit closes only the active
    session). Raised here by a tracer at the line that starts holding them."""
    import inspect
    import sys

    from trainkit.session import Session

    lines, first = inspect.getsourcelines(Session._close)  # close() calls it
    at = first + next(i for i, line in enumerate(lines) if "with _signals.held()" in line)
    code = Session._close.__code__

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == at:
                sys.settrace(None)
                frame.f_trace = None
                raise KeyboardInterrupt
            return local
        return local

    s = tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60)
    s.log("x", 1.0)
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            s.close()
    finally:
        sys.settrace(None)
    assert not s.closed and tk.active() is s  # what the exit closes
    s.close()
    assert scalars(tmp_path)["x"] == [(1, 1.0)]


@pytest.mark.parametrize("patched_loader", [False, True])
def test_values_of_a_first_step_longer_than_flush_secs_make_one_point(tmp_path, patched_loader):
    # An accumulation window's first micro-batches, before any step was counted: the writer took
    # the run for one that counts no steps and wrote step 1 at each wake, so step 1 showed a
    # point per flush ([(1, 0.0), (1, 1.0), (1, 2.0), (1, 3.0)]), not their mean.
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.ones(2, 4)] * 8
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
        tk.patch(opt)
        with tk.accumulate(4, opt):
            for i, x in enumerate(tk.patch(batches) if patched_loader else batches):
                s.log("x", float(i))
                time.sleep(0.12)  # more than two wakes of the writer
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
    assert scalars(tmp_path)["x"] == [(1, 1.5), (2, 5.5)]


def test_a_slow_first_batch_of_an_evaluation_makes_one_point(tmp_path):
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
        for x in tk.patch([1.0, 3.0]):
            for _ in range(2):
                s.log("x", x)
                time.sleep(0.12)
    assert scalars(tmp_path)["x"] == [(1, 1.0), (2, 3.0)]


def test_values_logged_by_step_before_a_patched_optimizers_first_step_are_written_meanwhile(tmp_path):
    # An RL warm-up: the optimizer is patched, and steps only once the replay buffer is full; the
    # rewards go by environment step. The first step in progress waits for its end (its values
    # make one point), but its values of tags logged by step= ahead of it were held with it, and
    # every later step of those tags behind them: none written until the close.
    model = torch.nn.Linear(3, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
        s.log("buffer", 1.0)  # logged by the step in progress: waits for its end
        for t in range(1, 31):
            s.log("env/reward", float(t), step=t)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(scalars(tmp_path).get("env/reward", [])) < 30:
            time.sleep(0.05)
        got = scalars(tmp_path)
        assert got.get("env/reward", []) == [(t, float(t)) for t in range(1, 31)]
        assert "buffer" not in got
        s.log("buffer", 3.0)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert scalars(tmp_path)["buffer"] == [(1, 2.0)]


def test_patching_while_the_writer_asks_whether_steps_are_coming_never_stops_it(tmp_path):
    # The writer thread read the set of patched optimizers while the training thread patched
    # more: "Set changed size during iteration" ended the writer, and the rest of the run was
    # lost. Thread switches made frequent to meet the window within seconds (before: ~0.2 s).
    import sys

    param = torch.nn.Parameter(torch.zeros(1))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
            keep = []
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and s._recorder.failed is None:
                keep.append(tk.patch(torch.optim.SGD([param], lr=0.1)))
                if len(keep) > 200:
                    for opt in keep[:100]:
                        tk.unpatch(opt)
                    del keep[:100]
                s.log("x", 1.0)
            assert s._recorder.failed is None
    finally:
        sys.setswitchinterval(interval)
