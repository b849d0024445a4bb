"""``trainkit demo`` in-process: what it prints is this run's, and a run it cannot do is said."""
from __future__ import annotations

import math

import pytest

from trainkit import cli, demo


def tiny(logdir, **kw):
    return demo.DemoConfig(logdir=str(logdir), epochs=1, train_size=128, val_size=64,
                           batch_size=64, progress=False, **kw)


def test_a_second_demo_into_the_same_folder_counts_its_own_steps(tmp_path):
    """It read back every event file of the folder: the second run said 4 steps, not 2."""
    assert demo.run(tiny(tmp_path / "x")).steps == 2
    again = demo.run(tiny(tmp_path / "x"))
    assert again.steps == 2 and str(again).startswith("2 optimizer steps, ")
    assert len(list((tmp_path / "x").glob("*tfevents*"))) == 2


def test_samples_per_s_counts_the_images_a_step_had_not_the_batch_size(tmp_path):
    """10 training images at --batch-size 64: one step of 10 images, which the summary said was
    64 (a short last batch, or a batch size above the data's, was counted as a full batch)."""
    result = demo.run(demo.DemoConfig(logdir=str(tmp_path / "x"), epochs=1, train_size=10,
                                      val_size=64, batch_size=64, progress=False))
    assert result.steps == 1
    assert result.samples_per_s == pytest.approx(10 / (result.median_step_ms / 1e3), rel=1e-5)


def test_no_step_in_time_is_said_not_a_traceback(tmp_path, capsys):
    """max_seconds over before the first step: UnboundLocalError on `loss`."""
    result = demo.run(tiny(tmp_path / "x", max_seconds=1e-9))
    assert result.steps == 0 and math.isnan(result.final_loss)
    assert demo.main(tiny(tmp_path / "y", max_seconds=1e-9)) == 1
    err = capsys.readouterr().err
    assert "no optimizer step finished within --max-seconds 1e-09" in err and "--max-seconds 50" in err


def test_an_unwritable_default_folder_exits_2_naming_it(tmp_path, monkeypatch, capsys):
    """Without --logdir the folder was not checked: a traceback and exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the default folder goes")
    assert cli.main(["demo", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit demo: ") and "runs/demo-" in err and "--logdir DIR" in err
    assert "Traceback" not in err


def test_the_help_names_the_options_values_as_the_messages_do(capsys):
    """The help said --logdir LOGDIR and --max-seconds MAX_SECONDS, the messages (above)
    --logdir DIR and the examples --epochs N."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["demo", "--help"])
    assert exited.value.code == 0
    usage = " ".join(capsys.readouterr().out.split("\n\n", 1)[0].split())
    assert usage == ("usage: trainkit demo [-h] [--logdir DIR] [--epochs N] [--train-size N] "
                     "[--max-seconds SECONDS] [--batch-size N] [--no-progress]")


@pytest.mark.parametrize("name", ["afile", "a file's"])
def test_a_logdir_that_is_a_file_is_said_as_the_option_with_its_fix(tmp_path, capsys, name):
    # It said the Python call's words: "session(logdir='afile') ... e.g. logdir='afile_runs'".
    import shlex

    path = tmp_path / name
    path.write_text("")
    assert cli.main(["demo", "--no-progress", "--logdir", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainkit demo: --logdir {shlex.quote(str(path))}: ")
    assert err.rstrip().endswith(f"e.g. --logdir {shlex.quote(str(path) + '_runs')}")
    assert "session(" not in err and "logdir=" not in err


@pytest.mark.parametrize("args, said", [
    (["--epochs", "0"], "--epochs 0: must be a positive int, e.g. --epochs 2"),
    (["--train-size", "0"], "--train-size 0: must be a positive int, e.g. --train-size 6400"),
    (["--batch-size", "-1"], "--batch-size -1: must be a positive int, e.g. --batch-size 64"),
    (["--max-seconds", "-1"], "--max-seconds -1: must be > 0, e.g. --max-seconds 50"),
    (["--max-seconds", "-0.5"], "--max-seconds -0.5: must be > 0, e.g. --max-seconds 50"),
    (["--max-seconds", "nan"], "--max-seconds nan: must be > 0, e.g. --max-seconds 50")])
def test_a_bad_option_is_said_as_given(tmp_path, capsys, args, said):
    # "trainkit demo: demo epochs=0: ..." said "demo" twice, and not the option's name; and
    # "--max-seconds -1.0" for the -1 typed. The example is the default: it was "--batch-size 2".
    assert cli.main(["demo", "--logdir", str(tmp_path / "r"), *args]) == 2
    assert capsys.readouterr().err == f"trainkit demo: {said}\n"


def test_the_printed_tensorboard_command_is_quoted(tmp_path):
    result = demo.DemoResult(logdir=str(tmp_path / "my runs" / "demo-1"), steps=1,
                             median_step_ms=1.0, samples_per_s=1.0, data_wait_share=0.0,
                             final_loss=1.0, accuracy=1.0)
    line = demo.summary_lines(result)["open"]
    assert f"tensorboard --logdir '{tmp_path / 'my runs' / 'demo-1'}' " in line
    assert str(result).startswith("1 optimizer step, ")


@pytest.mark.parametrize("logdir, opens", [
    ("/tmp/demo", "/tmp/demo"), ("demo", "demo"), ("runs/demo-20261123-181500", "runs"),
    ("./runs/mine", "./runs")])
def test_the_printed_command_opens_the_run_not_whatever_holds_it(logdir, opens):
    """`--logdir /tmp/demo` printed `tensorboard --logdir /tmp`: TensorBoard then reads all of
    /tmp (every few seconds), showing every other run there; `--logdir ~/demo`, all of home."""
    result = demo.DemoResult(logdir=logdir, steps=1, median_step_ms=1.0, samples_per_s=1.0,
                             data_wait_share=0.0, final_loss=1.0, accuracy=1.0)
    assert f"Open it: tensorboard --logdir {opens} (" in demo.summary_lines(result)["open"]


def test_a_train_size_beyond_memory_trains_in_a_few_mb(tmp_path):
    """--train-size 10000000 made all its images up front: 31 GB, a MemoryError-like
    RuntimeError (or the OOM killer) long before --max-seconds would have used them. The child
    runs on the CPU in 8 GB of address space: enough for the demo, a quarter of the old data."""
    import resource
    import subprocess
    import sys

    from tests.test_switches_cli_import import REPO, _env

    env = dict(_env(), CUDA_VISIBLE_DEVICES="")  # CUDA reserves far more address space than 8 GB
    limit = 8 * 2 ** 30
    out = subprocess.run(
        [sys.executable, "-m", "trainkit", "demo", "--logdir", str(tmp_path / "big"),
         "--train-size", "10000000", "--epochs", "1", "--max-seconds", "1", "--no-progress"],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert " optimizer step" in out.stdout and f"TensorBoard run: {tmp_path / 'big'}" in out.stdout


def test_a_batch_that_cannot_fit_is_refused_before_anything_is_made(tmp_path, capsys):
    """A step of 10,000,000 images (about 4 TB) was tried after making the data."""
    logdir = tmp_path / "x"
    assert cli.main(["demo", "--logdir", str(logdir), "--train-size", "10000000",
                     "--batch-size", "10000000", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit demo: --batch-size 10000000: ") and "e.g. --batch-size " in err
    assert "Traceback" not in err and not logdir.exists()
    # A batch larger than the data is the data: no false refusal.
    demo.check_memory(demo.DemoConfig(train_size=128, batch_size=10 ** 9))


def test_demos_started_in_the_same_second_get_a_folder_each(tmp_path, monkeypatch, capsys):
    """Two demos started within one second wrote into one folder (one run in TensorBoard, steps
    of both); a bad --batch-size still makes no folder at all."""
    import datetime
    import os

    from trainkit import _logdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_logdir, "run_start_time", lambda: datetime.datetime(2026, 11, 23, 9, 0, 0))
    assert cli.main(["demo", "--train-size", "10000000", "--batch-size", "10000000",
                     "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()
    capsys.readouterr()
    first, second = demo.default_logdir(), demo.default_logdir()
    assert first == os.path.join("runs", "demo-20261123-090000") and second == first + "-2"
    assert os.path.isdir(first) and os.path.isdir(second)


def test_epochs_after_max_seconds_are_not_run(tmp_path, monkeypatch):
    """Each epoch left after --max-seconds still fetched a batch and evaluated the model."""
    calls = []
    monkeypatch.setattr(demo, "_evaluate", lambda *a: calls.append(1) or (0.5, 64))
    result = demo.run(demo.DemoConfig(logdir=str(tmp_path / "x"), epochs=1000, train_size=128,
                                      val_size=64, batch_size=64, progress=False,
                                      max_seconds=1e-9))
    assert result.steps == 0 and len(calls) == 1


def test_the_default_folder_under_torchrun_is_the_launchers_time(tmp_path, monkeypatch):
    """Each rank named the folder by its own clock: ranks a second apart wrote to two folders."""
    import datetime
    import os

    import psutil

    monkeypatch.chdir(tmp_path)  # the rank claims runs/<folder>/rank1 there
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    started = datetime.datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    folder = os.path.join("runs", started.strftime("demo-%Y%m%d-%H%M%S"))
    assert demo.default_logdir() == folder and os.listdir(folder) == ["rank1"]


def test_under_torchrun_a_rerun_counts_its_own_steps(tmp_path, monkeypatch):
    """A rank writes <logdir>/rank<N>, but the files were compared in <logdir>: a second run into
    the same folder said 4 steps for 2. One rank of a torchrun world of 1, in this process (the
    two-process run is tests/process/test_demo_torchrun.py)."""
    from tests.process._util import free_port

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                        ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    first = demo.run(tiny(tmp_path / "x"))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    again = demo.run(tiny(tmp_path / "x"))
    assert (first.steps, again.steps) == (2, 2)
    assert again.logdir == str(tmp_path / "x" / "rank0") and [r.steps for r in again.ranks] == [2]
    assert len(list((tmp_path / "x" / "rank0").glob("*tfevents*"))) == 2
    import torch.distributed as dist

    assert not dist.is_initialized()  # the demo's process group is gone


class _PublicOnly:
    """A session seen through its public names only (no ``_recorder`` and the like)."""

    def __init__(self, s):
        self._s = s

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(f"the demo used the session's private {name!r}")
        return getattr(self._s, name)

    def __enter__(self):
        self._s.__enter__()
        return self

    def __exit__(self, *exc):
        return self._s.__exit__(*exc)


def test_the_demo_reads_its_run_back_through_the_public_api_only(tmp_path, monkeypatch):
    """It found its own event file through s._recorder.writer.path. Rerun into the same folder,
    it still counts only its own run's steps."""
    import trainkit

    real = trainkit.session
    monkeypatch.setattr(trainkit, "session", lambda *a, **k: _PublicOnly(real(*a, **k)))
    assert demo.run(tiny(tmp_path / "x")).steps == 2
    assert demo.run(tiny(tmp_path / "x")).steps == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("torchrun", [False, True])
def test_a_huge_val_size_ends_at_max_seconds(tmp_path, monkeypatch, torchrun):
    """val_size=10**9 (API only) validated on every image whatever max_seconds: hours. Validation
    now ends at the deadline too, once it has seen VAL_AT_LEAST images, and says so; under
    torchrun every rank stops at the same batch (one rank here: the all-reduce is run)."""
    import time

    if torchrun:
        from tests.process._util import free_port

        for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
            monkeypatch.setenv(name, value)
    t0 = time.monotonic()
    result = demo.run(demo.DemoConfig(logdir=str(tmp_path / "x"), epochs=3, train_size=128,
                                      val_size=10 ** 9, batch_size=64, progress=False,
                                      max_seconds=2))
    assert time.monotonic() - t0 < 60
    assert result.steps == 2  # one epoch: the deadline came in its validation
    assert demo.VAL_AT_LEAST <= result.val_images < 10 ** 9 and 0 <= result.accuracy <= 1
    assert str(result).endswith(f"% (the first {result.val_images:,} of 1,000,000,000 "
                                "validation images: --max-seconds)")


def test_a_validation_batch_that_cannot_fit_is_refused_before_anything_is_made(tmp_path):
    """The memory check looked at the training batch only (min(batch_size, train_size)): with a
    small train_size, a huge batch_size and val_size made validation batches of 10**7 images."""
    config = demo.DemoConfig(logdir=str(tmp_path / "x"), train_size=128, val_size=10 ** 7,
                             batch_size=10 ** 7, progress=False)
    with pytest.raises(ValueError, match=r"^--batch-size 10000000: one validation batch "
                                         r"\(val_size=10,000,000\) .* e\.g\. --batch-size \d+$"):
        demo.check_memory(config)
    with pytest.raises(ValueError, match="one validation batch"):
        demo.run(config)
    assert not (tmp_path / "x").exists()


def test_a_bad_val_size_is_named_with_its_fix():
    """2**62 validation images were blamed on train_size; val_size=0 pointed to a --val-size
    flag the CLI does not have."""
    with pytest.raises(ValueError, match=r"^demo val_size=4611686018427387904: at most 2\*\*62 "
                                         r"images, .* e\.g\. DemoConfig\(val_size=2048\)$"):
        demo.DemoConfig(val_size=2 ** 62)
    with pytest.raises(ValueError, match=r"^demo val_size=0: .* e\.g\. DemoConfig\(val_size=2048\)$"):
        demo.DemoConfig(val_size=0)


def test_a_deadline_passed_in_validation_runs_no_further_epoch(tmp_path, monkeypatch):
    """--max-seconds passed while the whole validation set was evaluated: the next epoch still
    fetched a batch and evaluated the same model again, after the deadline."""
    import dataclasses

    class Clock:  # the demo's deadline clock: the deadline passes during the first validation
        now = 0.0

        @staticmethod
        def monotonic():
            return Clock.now

    calls = []

    def evaluate(*args):
        calls.append(1)
        Clock.now = 1e9
        return 0.5, 64

    monkeypatch.setattr(demo, "time", Clock)
    monkeypatch.setattr(demo, "_evaluate", evaluate)
    result = demo.run(dataclasses.replace(tiny(tmp_path / "x"), epochs=3, max_seconds=10))
    assert result.steps == 2 and len(calls) == 1


def test_a_malformed_techniques_override_is_a_usage_error_before_anything_is_made(
        tmp_path, monkeypatch, capsys):
    """TRAINKIT_TECHNIQUES='{"amp": "no"}': a traceback and exit 1, after the run folder was
    made and the model built; now said as a bad option is, exit 2, nothing made."""
    from trainkit import switches

    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"amp": "no"}')
    monkeypatch.setattr(switches, "_env_raw", None)  # parsed again (it is cached by value)
    monkeypatch.setattr(switches, "_from_env", None)
    logdir = tmp_path / "run"
    assert cli.main(["demo", "--no-progress", "--logdir", str(logdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit demo: TRAINKIT_TECHNIQUES=") and "'amp' is 'no'" in err
    assert "Traceback" not in err and not logdir.exists()


def test_a_ctrl_c_before_training_began_ends_by_sigint_without_a_traceback(tmp_path):
    """Ctrl-C in the demo's first seconds (torch still importing, in check_memory) printed a
    KeyboardInterrupt traceback; the run's own handler only covers the training."""
    import os
    import signal
    import subprocess
    import sys

    code = ("from trainkit import cli, demo\n"
            "def interrupted(config):\n"
            "    raise KeyboardInterrupt\n"
            "demo.check_memory = interrupted\n"
            "raise SystemExit(cli.main(['demo', '--no-progress', '--logdir', %r]))\n"
            % str(tmp_path / "run"))
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == ("trainkit demo: interrupted before training began; nothing "
                                   "was recorded"), proc.stderr
    assert not (tmp_path / "run").exists()
