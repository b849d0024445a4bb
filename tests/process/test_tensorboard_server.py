"""A real TensorBoard server, on loopback, shows what a trainkit session wrote."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from ._util import REPO, child_env, free_port, stop_server

STEPS = 6
TAGS = ["trainkit/step_time_ms", "trainkit/data_wait_ms", "trainkit/samples_per_s",
        "trainkit/update_ms", "trainkit/region/forward_ms", "loss"]


def _make_run(logdir) -> None:
    import torch

    import trainkit as tk

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(STEPS)]
    try:
        with tk.session(logdir=logdir) as s:
            tk.patch(opt)
            for x, y in tk.patch(data):
                x, y = tk.to_device((x, y), "cpu")
                with tk.profile_region("forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                s.log("loss", loss)
    finally:
        tk.unpatch(opt)


def _get(port: int, path: str, timeout: float = 10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read().decode())


@pytest.mark.timeout(120)
def test_tensorboard_serves_the_session_scalars(tmp_path):
    root = tmp_path / "logs"
    _make_run(root / "exp")
    port = free_port()
    log = open(tmp_path / "tensorboard.log", "wb")  # a file, not a pipe nobody drains
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "1"],
        cwd=str(REPO), env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        runs = None
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "tensorboard.log").read_text()[-3000:]
            try:
                runs = _get(port, "/data/runs", timeout=2)
            except (urllib.error.URLError, ConnectionError, OSError):
                runs = None
            if runs and "exp" in runs:
                break
            time.sleep(0.5)
        assert runs == ["exp"], runs

        tags = _get(port, "/data/plugin/scalars/tags")
        assert set(tags) == {"exp"}, tags
        for tag in TAGS:
            assert tag in tags["exp"], (tag, sorted(tags["exp"]))

        query = urllib.parse.urlencode({"run": "exp", "tag": "trainkit/step_time_ms"})
        points = _get(port, f"/data/plugin/scalars/scalars?{query}")
        assert len(points) == STEPS, points
        assert [p[1] for p in points] == list(range(1, STEPS + 1))
        assert all(p[2] > 0 for p in points)

        query = urllib.parse.urlencode({"run": "exp", "tag": "trainkit/region/forward_ms"})
        assert [p[1] for p in _get(port, f"/data/plugin/scalars/scalars?{query}")] == list(
            range(1, STEPS + 1))
    finally:
        stop_server(server, log)
