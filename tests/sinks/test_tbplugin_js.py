"""The tab's front end (static/index.js) run in node against a stub DOM: what it shows when the
server fails, and for a real run's report. Skipped where node is not installed."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess

import pytest

from tests.conftest import REPO


def harness(fetch: str) -> str:
    """A node script: index.js rendered on a stub DOM, ``fetch`` (JS) answering its requests,
    the page's text printed."""
    return """
class Node {}
const mk = (t) => Object.assign(new Node(), {t, kids: [], attrs: {}, style: {},
  setAttribute(k, v) { this.attrs[k] = v; }, append(...c) { this.kids.push(...c); },
  replaceChildren(...c) { this.kids = c; }, addEventListener() {}});
globalThis.Node = Node;
globalThis.document = {createElement: mk, head: mk('head'), body: mk('body')};
globalThis.window = {addEventListener() {}};
""" + fetch + """
const text = (n) => typeof n === 'string' ? n : (n.kids || []).map(text).join('');
const {render} = await import('./index.mjs');
await render();
console.log(text(document.body));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_server_error_listing_the_runs_is_said_not_a_blank_tab(tmp_path):
    """render() awaited ./runs unguarded: a 500 left the tab blank, the error only in the
    browser's console."""
    shutil.copy(os.path.join(REPO, "trainkit", "sinks", "tbplugin", "static", "index.js"),
                tmp_path / "index.mjs")
    (tmp_path / "harness.mjs").write_text(harness(
        "globalThis.fetch = async (url) => ({ok: false, status: 500, json: async () => null});"))
    out = subprocess.run(["node", "harness.mjs"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "trainkit runs cannot be listed: Error: ./runs: HTTP 500"


SHOW_REPORT = harness("""
const fs = await import('node:fs');
const report = JSON.parse(fs.readFileSync('report.json', 'utf8'));
globalThis.fetch = async (url) => ({ok: true, status: 200,
  json: async () => (url.startsWith('./runs') ? ['.'] : url.startsWith('./left_out') ? [] : report)});
""")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_traces_section_says_which_steps_the_findings_are_of(tmp_path):
    """`trainkit analyze` says which steps its traces held; the tab listed the trace files alone,
    and its findings read as the whole run's."""
    import json

    import trainkit as tk
    from tests.profiling.conftest import train
    from trainkit.sinks.tbplugin.data import TabData

    logdir = str(tmp_path / "logs")
    train(logdir, steps=12, profile=tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=2))
    # the report as the tab's server hands it over (./report?run=.)
    (tmp_path / "report.json").write_text(json.dumps(TabData(logdir).report(".")))
    shutil.copy(os.path.join(REPO, "trainkit", "sinks", "tbplugin", "static", "index.js"),
                tmp_path / "index.mjs")
    (tmp_path / "harness.mjs").write_text(SHOW_REPORT)
    out = subprocess.run(["node", "harness.mjs"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Analyzed: steps 3-5, 8-10 (2 traces), numbered as in trainkit/step_time_ms." \
        in out.stdout, out.stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_breakdown_heading_says_which_steps_it_leaves_out(tmp_path, compiled):
    """The heading said "(31 steps)" where the demo said 32: the breakdown's mean leaves out the
    first timed step (warm-up) and those that compiled, and neither the tab nor its data said so."""
    import json

    from trainkit.sinks.tbplugin.data import TabData
    from trainkit.sinks.tensorboard import EventFileWriter

    logdir = str(tmp_path / "logs")
    w = EventFileWriter(logdir)  # 12 steps as a session records them, two compiling
    for step in range(1, 13):
        values = {"trainkit/update_ms": 1.0}
        if step > 1:  # the first has no step time: no step before it
            values["trainkit/step_time_ms"] = 10.0 + step % 3
        if compiled and step in (3, 7):
            values["trainkit/compile/seconds"] = 2.0
        w.write_scalars(step=step, values=values, wall_time=1.7e9 + step)
    w.close()
    rep = TabData(logdir).report(".")
    timed = 11
    assert rep["timed_steps"] == timed
    assert rep["left_out"] == {"first": 1, "compiled": 2 if compiled else 0}
    assert rep["steps"] == timed - 1 - (2 if compiled else 0)
    (tmp_path / "report.json").write_text(json.dumps(rep))
    shutil.copy(os.path.join(REPO, "trainkit", "sinks", "tbplugin", "static", "index.js"),
                tmp_path / "index.mjs")
    (tmp_path / "harness.mjs").write_text(SHOW_REPORT)
    out = subprocess.run(["node", "harness.mjs"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    said = ("Step time breakdown (mean of 8 of the 11 timed steps: the first (warm-up) and 2 "
            "that compiled left out)" if compiled else
            "Step time breakdown (mean of 10 of the 11 timed steps: the first (warm-up) left out)")
    assert said in out.stdout, out.stdout
    # the median beside the mean: the demo's summary says the median, which the mean is not
    times = [10.0 + st % 3 for st in range(3, 13) if not (compiled and st in (3, 7))]
    assert rep["breakdown"]["median_step"] == statistics.median(times) == 11.0
    mean = sum(times) / len(times)
    assert f"mean step {mean:.2f} ms, median 11.00 ms" in out.stdout, out.stdout


@pytest.mark.skipif(shutil.which("node") is None or not hasattr(os, "mkfifo"),
                    reason="node is not installed, or no named pipes here")
def test_the_page_says_the_files_left_out(tmp_path):
    """A file left out of the analysis (a named pipe, a broken link) was listed under "skipped"
    in the report's JSON alone: the page said nothing, and its findings read as the whole run's."""
    import json

    from tests.profiling.conftest import train
    from trainkit.sinks.tbplugin.data import TabData

    logdir = str(tmp_path / "logs")
    train(logdir, steps=6)
    trace = "host_1.1700000000000000000.pt.trace.json"
    os.mkfifo(os.path.join(logdir, trace))
    os.symlink("gone.pt.trace.json", os.path.join(logdir, "link.pt.trace.json"))
    (tmp_path / "report.json").write_text(json.dumps(TabData(logdir).report(".")))
    shutil.copy(os.path.join(REPO, "trainkit", "sinks", "tbplugin", "static", "index.js"),
                tmp_path / "index.mjs")
    (tmp_path / "harness.mjs").write_text(SHOW_REPORT)
    out = subprocess.run(["node", "harness.mjs"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (f"Left out of the analysis (not read): {trace} (a named pipe (FIFO)); "
            f"link.pt.trace.json (a broken symbolic link (to 'gone.pt.trace.json', which does "
            f"not exist)); trainkit analyze on this logdir says how to fix each.") \
        in out.stdout, out.stdout
