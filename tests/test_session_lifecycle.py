"""A session's lifecycle: one at a time (two threads starting one at once get one, a forked child
starts its own), usable without ``with`` and closed twice, an exception that propagates unchanged
with the records kept, refused as a decorator, what closing does to another thread's values and to a
Ctrl-C during the final write, log calls after the close refused, and nothing recorded and nothing
broken with no session at all."""
from __future__ import annotations

import os
import time
import warnings

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train


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
    with pytest.warns(RuntimeWarning, match="'a' logged 2 times"), \
            tk.session(logdir=tmp_path / "parent", system_metrics=False) as s:
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
    """A pending value whose reading, in the final write, meets a Ctrl-C. Ready only once the
    session is closing: the writer's wake a second in (a loaded CI machine gets there) wrote it
    ahead (its step is far past the first), and the Ctrl-C came before the close."""

    def __init__(self, s):
        self.s = s

    def ready(self):
        return self.s.closed

    def value(self, wait):
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        return 2.0

    def release(self):
        pass


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler, whatever the runner had: one started in the background by a
    shell without job control (`bash .ci/run &`) inherits SIGINT ignored, and so is the replay."""
    import signal

    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, prev)


def test_a_ctrl_c_during_close_acts_once_everything_is_written(tmp_path, python_ctrl_c):
    import signal

    s = tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60)
    for i in range(1, 101):
        s.log("x", float(i), step=i)
    s._buf.append(("y", 100, _Interrupting(s)))
    with pytest.raises(KeyboardInterrupt):
        s.close()  # the KeyboardInterrupt comes from here, after the close
    assert [st for st, _ in scalars(tmp_path)["x"]] == list(range(1, 101))
    assert scalars(tmp_path)["y"] == [(100, 2.0)]
    assert s.closed and s._recorder.writer._file is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # trainkit's handler is gone


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


@pytest.mark.parametrize("err", [KeyError("users own"), KeyboardInterrupt(), SystemExit(3)],
                         ids=["exception", "ctrl-c", "sys.exit"])
def test_an_exception_leaving_the_block_goes_on_under_warnings_as_errors(tmp_path, err):
    # Under `python -W error` (or pytest's filterwarnings = "error") the close's own warning,
    # here "no step counted", was raised from __exit__ in place of the user's exception: an
    # `except KeyError` around the block missed it, and sys.exit(3) exited 1.
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        with pytest.raises(type(err)) as info:
            with tk.session(logdir=tmp_path / "a", system_metrics=False) as s:
                s.log("loss", 1.0)
                s.log("loss", 2.0)
                raise err
        assert info.value is err
        assert [w.filename for w in shown] == [__file__], shown  # the `with` line, as warned
        said = str(shown[0].message)
        assert "counted no step" in said and type(err).__name__ in said, said
        assert scalars(tmp_path / "a")["loss"] == [(1, 1.5)]
        # Leaving the block normally, the warning is the error that was asked for.
        with pytest.raises(RuntimeWarning, match="counted no step"):
            with tk.session(logdir=tmp_path / "b", system_metrics=False) as s:
                s.log("loss", 1.0)
                s.log("loss", 2.0)
    assert scalars(tmp_path / "b")["loss"] == [(1, 1.5)]


def test_a_failed_start_raises_its_own_error_under_warnings_as_errors(tmp_path, monkeypatch):
    # The start's own error (a schedule with no warm-up, warned) goes on; the close that undoes
    # the half-started session warned that TRAINKIT_TECHNIQUES sets a name nothing asked for, and
    # that warning, raised over it, replaced the start's error. It is shown, at the user's line.
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fuse": true}')
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="has no warm-up step"):
            tk.session(logdir=tmp_path / "a", system_metrics=False,
                       profile=tk.ProfileSchedule(wait=0, warmup=0, active=1))
    assert tk.active() is None
    assert [w.filename for w in shown] == [__file__], shown
    assert "TRAINKIT_TECHNIQUES sets 'fuse'" in str(shown[0].message)


def test_one_session_at_a_time(tmp_path):
    with tk.session(logdir=tmp_path / "a") as s:
        with pytest.raises(RuntimeError, match="already active"):
            tk.session(logdir=tmp_path / "b")
        assert tk.active() is s
    assert not (tmp_path / "b").exists()  # refused before anything was created


def test_no_session_means_nothing_recorded_and_nothing_breaks(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.profile_region("forward"):
        train(model, opt, tk.patch(loader(n=16)))
    assert tk.to_device(torch.ones(2), "cpu").sum() == 2
    assert list(tmp_path.iterdir()) == []
