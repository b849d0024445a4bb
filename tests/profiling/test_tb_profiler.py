"""trainkit's traces load in torch-tb-profiler 0.4.3 (the ``profiler-tab`` extra)."""
from __future__ import annotations

import importlib.util
import json
import time
import urllib.parse
import urllib.request

import pytest

import trainkit as tk
from trainkit.sinks.tbplugin.launch import serve

from .conftest import train

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch_tb_profiler") is None,
                       reason="torch-tb-profiler is not installed (pip install '.[profiler-tab]' from the checkout)"),
]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("gzip", [False, True])
def test_trainkit_traces_appear_in_torch_tb_profiler(tmp_path, gzip):
    logdir = tmp_path / "logs"
    train(str(logdir / "exp1"), steps=8, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, gzip=gzip))
    with serve(str(logdir), timeout_s=120) as url:
        base = url + "/data/plugin/pytorch_profiler"
        deadline = time.monotonic() + 120
        while True:  # torch-tb-profiler parses runs in the background
            runs = get_json(base + "/runs")
            if "exp1" in runs.get("runs", []) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert "exp1" in runs["runs"], runs
        workers = get_json(base + "/workers?" + urllib.parse.urlencode({"run": "exp1", "view": "Overview"}))
        assert len(workers) == 1, workers  # one process wrote one trace
        spans = get_json(base + "/spans?" + urllib.parse.urlencode({"run": "exp1", "worker": workers[0]}))
        q = {"run": "exp1", "worker": workers[0], "span": spans[0] if spans else ""}
        overview = get_json(base + "/overview?" + urllib.parse.urlencode(q))
        assert len(overview["steps"]["rows"]) == 2, overview  # the two profiled steps
