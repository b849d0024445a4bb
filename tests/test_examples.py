"""Every example runs as a user would run it, and writes the TensorBoard run it promises."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, scalars

CASES = {
    "mnist_cnn.py": (["--train-size", "256"], "trainkit/region/forward_ms"),
    "closure_step.py": ([], "trainkit/closure_ms"),
    "accumulate_amp.py": (["--train-size", "320"], "trainkit/step_time_ms"),
    "compiled_optimizer.py": (["--steps", "6", "--width", "32"], "trainkit/compile/seconds"),
}


def test_every_example_is_covered():
    # _args.py: the examples' argparse types, no example of its own
    found = {f for f in os.listdir(os.path.join(REPO, "examples"))
             if f.endswith(".py") and not f.startswith("_")}
    assert found == set(CASES)


#: compiled_optimizer.py compiles Adam under OneCycleLR, which moves its betas: refused on the
#: CPU below torch 2.5 (trainkit.techniques._hyper.TENSOR_BETAS_ON_CPU).
OLD_TORCH = tuple(int(v) for v in __import__("torch").__version__.split(".")[:2]) < (2, 5)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(tmp_path, name):
    if name == "compiled_optimizer.py" and OLD_TORCH:
        pytest.skip("a compiled CPU Adam step with moving betas needs torch >= 2.5")
    args, tag = CASES[name]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logdir = tmp_path / "run"
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", name), "--logdir", str(logdir),
                          *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = scalars(logdir)
    assert tag in got
    # the loss of each step is filed under that step: not under the next one, one past the end
    assert {s for s, _ in got["loss"]} == {s for s, _ in got["trainkit/update_ms"]}


@pytest.mark.slow
def test_compiled_optimizer_example_trains_with_its_defaults(tmp_path):
    """Its loss went from 0.005 to 1e7 (max_lr=0.05 for Adam): a run that looked broken by compile."""
    if OLD_TORCH:
        pytest.skip("a compiled CPU Adam step with moving betas needs torch >= 2.5")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logdir = tmp_path / "run"
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "compiled_optimizer.py"),
                          "--logdir", str(logdir)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [v for _, v in sorted(scalars(logdir)["loss"])]
    assert max(losses) <= losses[0] * 1.5 and losses[-1] < losses[0] / 2, losses


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["mnist_cnn.py", "accumulate_amp.py"])
def test_a_train_size_beyond_memory_trains(tmp_path, name):
    """They made every image up front: --train-size 10000000 (31 GB) failed at once in 8 GB of
    address space, or took the machine's memory. Now the images are made as they are read: the
    run records steps and goes on until it is stopped (SIGTERM here)."""
    import resource
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")  # CUDA reserves far more address space than 8 GB
    limit = 8 * 2 ** 30
    logdir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "examples", name), "--logdir", str(logdir),
         "--train-size", "10000000"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    try:
        deadline = time.monotonic() + 180
        steps = []
        while proc.poll() is None and time.monotonic() < deadline and len(steps) < 2:
            time.sleep(1)
            if logdir.exists():
                steps = scalars(logdir).get("trainkit/step_time_ms", [])
        running = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert running and len(steps) >= 2, err[-3000:]


def _run_example(name, args, monkeypatch):
    """The example run as ``python examples/NAME ARGS`` runs it (its own argparse, its
    ``__main__``), in this process: torch is imported once for all the cases."""
    import runpy

    path = os.path.join(REPO, "examples", name)
    monkeypatch.setattr(sys, "argv", [path, *args])
    monkeypatch.syspath_prepend(os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


@pytest.mark.parametrize("name, option, value", [
    ("accumulate_amp.py", "--accumulate", "0"),  # was accumulate()'s ValueError traceback, exit 1
    ("accumulate_amp.py", "--train-size", "0"),  # SyntheticMNIST's ValueError
    ("compiled_optimizer.py", "--steps", "0"),  # OneCycleLR's ValueError
    ("compiled_optimizer.py", "--width", "0"),  # "succeeded" with a model of no weights
    ("mnist_cnn.py", "--train-size", "-1"),  # SyntheticMNIST's ValueError
    ("mnist_cnn.py", "--epochs", "0"),  # "succeeded" with an empty run
    ("mnist_cnn.py", "--epochs", "1.5"),
])
def test_a_bad_value_is_a_usage_error_before_anything_is_written(tmp_path, monkeypatch, capsys,
                                                                 name, option, value):
    logdir = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        _run_example(name, [option, value, "--logdir", str(logdir)], monkeypatch)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"{name}: error: argument {option}: must be a positive int (1 or more), "
                        f"not {value!r}\n"), err
    assert not logdir.exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_help_says_every_option_and_keeps_the_usage_line(monkeypatch, capsys, name):
    """No option had help text, and the docstring's `python examples/...` line ran into its
    prose."""
    with pytest.raises(SystemExit) as exited:
        _run_example(name, ["--help"], monkeypatch)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert f"\n    python examples/{name} " in out  # a line of its own, as in the docstring
    # argparse's heading: "options:" from Python 3.10, "optional arguments:" before
    options = re.split(r"\n(?:options|optional arguments):\n", out, maxsplit=1)[1]
    entries = [e for e in options.split("\n  -")[1:]]  # "-h, --help ...", "-logdir DIR ..."
    assert len(entries) >= 2
    for entry in entries:
        invocation, _, said = entry.strip().partition("  ")
        assert said.strip(), f"{name}: option -{invocation} has no help text:\n{out}"
