"""Every example runs as a user would run it, and writes the TensorBoard run it promises."""
from __future__ import annotations

import os
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
    found = {f for f in os.listdir(os.path.join(REPO, "examples")) if f.endswith(".py")}
    assert found == set(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(tmp_path, name):
    args, tag = CASES[name]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logdir = tmp_path / "run"
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", name), "--logdir", str(logdir),
                          *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert tag in scalars(logdir)


@pytest.mark.slow
def test_compiled_optimizer_example_trains_with_its_defaults(tmp_path):
    """Its loss went from 0.005 to 1e7 (max_lr=0.05 for Adam): a run that looked broken by compile."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logdir = tmp_path / "run"
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "compiled_optimizer.py"),
                          "--logdir", str(logdir)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [v for _, v in sorted(scalars(logdir)["loss"])]
    assert max(losses) <= losses[0] * 1.5 and losses[-1] < losses[0] / 2, losses
