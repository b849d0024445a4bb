"""What a session records and the values ``s.log`` takes: every step's trainkit tags and system
metrics in a patched loop (the first CPU load sample taken by the writer thread), tensors read as
the losses (a CUDA tensor's value at log time), values logged twice in a step averaged, numpy
scalars and one-element arrays, values past float32 written as inf; and what it refuses: bad log
calls, complex values, trainkit's own tags (names like its internal ones are the user's own)."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train


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
    # Nothing counts steps here: the close says the two went under one (test_session_unstepped).
    with pytest.warns(RuntimeWarning, match="'loss' logged 2 times"), \
            tk.session(logdir=tmp_path) as s:
        s.log("loss", 1.0)
        s.log("loss", 3.0)
        s.record("trainkit/region/x_ms", 2.0)
        s.record("trainkit/region/x_ms", 5.0)
    got = scalars(tmp_path)
    assert got["loss"] == [(1, 2.0)]
    assert got["trainkit/region/x_ms"] == [(1, 7.0)]


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


def test_bad_log_calls(tmp_path):
    with tk.session(logdir=tmp_path) as s:
        with pytest.raises(ValueError, match=r"shape \(2,\).*t.mean\(\)"):
            s.log("loss", torch.ones(2))
        with pytest.raises(ValueError, match="name must be a non-empty str"):
            s.log("", 1.0)  # the right type, a bad value (it was a TypeError)
        with pytest.raises(TypeError, match=r"log\(name=3\): name must be a non-empty str"):
            s.log(3, 1.0)
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
        with pytest.raises(TypeError, match="step must be an int, not float64"):
            s.log("x", 1.0, step=np.float64(2.0))
    got = scalars(tmp_path)
    assert got["at"] == [(3, 7.0)] and got["huge"] == [(1, math.inf)]
    assert (got["flag"], got["zero_d"], got["one"], got["f32"], got["plain_bool"]) == \
        ([(1, 1.0)], [(1, 2.5)], [(1, 4.0)], [(1, 0.25)], [(1, 0.0)])


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


def test_system_samples_go_under_a_step_that_exists_once_each(tmp_path):
    # A sample before the first step ended went under step 0, which no chart of steps has, and
    # samples during a slow step (a compile, a big batch) several under one step: now under the
    # last completed step (the first, before it ends), once a step.
    import time

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path) as s:
        s._recorder._sample_secs = 0.0  # every flush may sample
        tk.patch(opt)
        for _ in range(3):
            for _ in range(3):  # a slow step: flushes (and samples) during it
                s.flush()
                time.sleep(0.01)
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    for tag in ("trainkit/system/cpu_percent", "trainkit/system/rss_MB"):
        steps = [st for st, _ in got[tag]]
        assert steps == [1, 2, 3], (tag, steps)  # the close's sample: under step 3, once
    # (on a CPU the peak is decided after the first step: the sample before leaves it out)
    assert [st for st, _ in got["trainkit/memory/peak_MB"]] == [2, 3]


def test_a_name_utf8_cannot_write_is_refused_and_the_run_goes_on(tmp_path):
    # A file name's undecodable byte, as os.fsdecode gives it (a lone surrogate): before, s.log
    # took it, the writer thread failed on it, and every later step of the run was lost (with
    # a warning about disk space).
    import os

    bad = "val/" + os.fsdecode(b"caf\xe9.csv")
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        s.log("loss", 1.0)
        with pytest.raises(ValueError, match=r"'\\udce9' at 7 cannot be written as UTF-8.*"
                                             r"s.log\('val/caf\?.csv', value\)"):
            s.log(bad, 2.0)
        s.flush()
        s.log("loss", 3.0, step=2)
        s.log("café/ü", 4.0, step=2)
    got = scalars(tmp_path)
    assert got["loss"] == [(1, 1.0), (2, 3.0)] and got["café/ü"] == [(2, 4.0)]
