"""A named pipe (FIFO) named as an event file or a trace in a logdir made ``trainkit analyze``
(and the tab, listing the runs) wait forever for a writer; a broken link to a trace was left out
with no word. Each is left out, said with its path and what it is (a warning: stderr for
``trainkit analyze``), and the rest of the run is analyzed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import train

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS = "events.out.tfevents.1700000000.host.1.0"
TRACE = "host_1.1700000000000000000.pt.trace.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    logdir = str(tmp_path_factory.mktemp("good"))
    train(logdir, steps=12)
    return logdir


def _with_specials(good: str, folder: str) -> str:
    shutil.copytree(good, folder)
    os.mkfifo(os.path.join(folder, EVENTS))
    os.mkfifo(os.path.join(folder, TRACE))
    os.symlink("gone.pt.trace.json", os.path.join(folder, "link.pt.trace.json"))
    return folder


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))


def test_trainkit_analyze_leaves_them_out_and_says_so(good, tmp_path):
    run = _with_specials(good, str(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-m", "trainkit", "analyze", run], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    assert "no findings" in done.stdout
    for name in (EVENTS, TRACE):
        assert (f"{os.path.join(run, name)!r} is a named pipe (FIFO), not a regular file: left "
                f"out") in done.stderr, done.stderr
    assert (f"{os.path.join(run, 'link.pt.trace.json')!r} is a broken symbolic link (to "
            f"'gone.pt.trace.json', which does not exist)") in done.stderr


def test_a_folder_of_a_fifo_alone_says_it_in_the_error(tmp_path):
    os.mkfifo(tmp_path / EVENTS)
    done = _python("import sys, trainkit as tk; tk.analyze(sys.argv[1])", str(tmp_path))
    assert "no trainkit run" in done.stderr and "is a named pipe (FIFO)" in done.stderr, \
        done.stderr[-2000:]


def test_the_tab_lists_and_reports_the_run(good, tmp_path):
    logdir = str(tmp_path / "logs")
    _with_specials(good, os.path.join(logdir, "exp"))
    done = _python("import sys, json; from trainkit.sinks.tbplugin.data import TabData; "
                   "d = TabData(sys.argv[1]); print(json.dumps([d.runs(), d.report('exp')]))",
                   logdir)
    assert done.returncode == 0, done.stderr[-2000:]
    runs, rep = json.loads(done.stdout)
    assert runs == ["exp"] and rep["steps"] > 0 and rep["traces"] == []
    assert sorted(rep["skipped"]) == [
        [EVENTS, "a named pipe (FIFO)"], [TRACE, "a named pipe (FIFO)"],
        ["link.pt.trace.json", "a broken symbolic link (to 'gone.pt.trace.json', which does "
                               "not exist)"]]


@pytest.mark.parametrize("kind", ["fifo", "broken link"])
def test_a_run_of_such_a_file_alone_is_listed_and_its_report_says_it(tmp_path, kind):
    # A run whose only event file is a named pipe made the tab's runs list (and has_runs, which
    # TensorBoard asks to show the tab at all) wait forever: the permission check opened it.
    # A broken link alone was passed over in silence. Each is listed, its report a TA110.
    folder = tmp_path / "logs" / "exp"
    folder.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(folder / EVENTS)
        what = "is a named pipe (FIFO)"
    else:
        os.symlink("gone.tfevents", folder / EVENTS)
        what = "is a broken symbolic link"
    done = _python("import sys, json; from trainkit.sinks.tbplugin.data import TabData; "
                   "d = TabData(sys.argv[1]); print(json.dumps([d.runs(), d.has_runs(), "
                   "d.report('exp')]))", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stderr[-2000:]
    runs, active, rep = json.loads(done.stdout)
    assert runs == ["exp"] and active is True
    (finding,) = [f for f in rep["findings"] if f["code"] == "TA110"]
    assert what in json.dumps(finding), finding
