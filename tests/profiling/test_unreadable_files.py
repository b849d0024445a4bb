"""An event file or a trace the user may not read, or a run folder the user may not list
(``chmod 000``), inside an analyzed logdir was passed over in silence by ``trainkit analyze``
(``find_runs``, the trainkit-tag scan); each is now left out with a warning naming the path and
the ``chmod`` that fixes it, as a named pipe is, and the tab's JSON lists the file in ``skipped``.
So is a folder that may be listed but not entered (``chmod u-x``), whose files were passed over
and whose subfolders were each said as a folder to ``chmod u+rx``. The tab lists a run whose event
file it may not read (with TA110 saying why), and its page says the folders it cannot list or
enter (``GET .../left_out``): it showed neither.

Permissions do not stop root: as root, the commands run without the capabilities that let root
pass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, dropped from the bounding set by ``setpriv``),
still as uid 0, so that this venv's Python under /root can run; where that cannot be done, the
tests skip.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from typing import List, Optional

import pytest

from .conftest import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE = "host_1.1700000000000000000.pt.trace.json"
_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
           "--inh-caps=-dac_override,-dac_read_search"]


@lru_cache(maxsize=None)
def _runner() -> Optional[List[str]]:
    """The command prefix that runs this Python where permissions stop it; None: none here."""
    if os.name != "posix":
        return None
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        return None
    with tempfile.TemporaryDirectory() as probe:
        locked = os.path.join(probe, "locked")
        with open(locked, "w") as fh:
            fh.write("x")
        os.chmod(locked, 0)
        done = subprocess.run(_NO_DAC + [sys.executable, "-c", "import sys, trainkit\ntry:\n"
                                         "    open(sys.argv[1])\nexcept PermissionError:\n"
                                         "    sys.exit(0)\nsys.exit(1)", locked],
                              cwd=ROOT, env=_env(), capture_output=True, timeout=60)
    return _NO_DAC + [sys.executable] if done.returncode == 0 else None


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, PYTHONDONTWRITEBYTECODE="1")


def _run(*args: str) -> subprocess.CompletedProcess:
    runner = _runner()
    if runner is None:
        pytest.skip("no way to run as a process that file permissions stop (root without "
                    "setpriv, or capabilities that cannot be dropped)")
    return subprocess.run(runner + list(args), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    logdir = str(tmp_path_factory.mktemp("good"))
    train(logdir, steps=12)
    return logdir


@pytest.fixture
def logdir(tmp_path, good):
    """``a``: a run; ``b``: a run folder locked; ``c``: a run whose one event file is locked;
    ``d``: a run with a trace locked beside its event file; ``e``: a run folder that may be
    listed but not entered, with a run in a folder of its own."""
    root = tmp_path / "logs"
    for name in "abcde":
        shutil.copytree(good, root / name)
    shutil.copytree(good, root / "e" / "sub")
    with open(root / "d" / TRACE, "w") as fh:
        fh.write("{}")
    (events,) = [f for f in os.listdir(root / "c") if "tfevents" in f]
    locked = [root / "b", root / "c" / events, root / "d" / TRACE, root / "e"]
    for path in locked[:3]:
        os.chmod(path, 0)
    os.chmod(root / "e", 0o644)  # u-x: its names are listed, none of its entries opened
    yield str(root), [str(p) for p in locked]
    for path in locked:
        if os.path.lexists(path):
            os.chmod(path, 0o755)


def test_trainkit_analyze_says_each_and_analyzes_the_rest(logdir):
    root, (folder, events, trace, _) = logdir
    done = _run("-m", "trainkit", "analyze", root)
    assert done.returncode == 0, done.stderr
    err = " ".join(done.stderr.split())
    assert (f"{folder!r} is a folder you have no permission to list: the runs in it are not "
            f"analyzed; make it readable (chmod u+rx {folder})") in err, err
    assert (f"{events!r} is a file you have no permission to read: left out; make it readable "
            f"(chmod u+r {events})") in err, err
    assert f"{trace!r} is a file you have no permission to read" in err, err
    assert "[a]" in done.stdout and "[d]" in done.stdout and "Traceback" not in done.stderr


def test_a_logdir_of_locked_runs_alone_says_them_in_the_error(logdir):
    root, (folder, events, *_) = logdir
    shutil.rmtree(os.path.join(root, "a"))
    shutil.rmtree(os.path.join(root, "d"), ignore_errors=True)
    done = _run("-c", "import sys, trainkit as tk; tk.analyze(sys.argv[1])", root)
    assert "no trainkit run" in done.stderr, done.stderr[-2000:]
    assert f"chmod u+rx {folder}" in done.stderr and f"chmod u+r {events}" in done.stderr


def test_the_tab_lists_the_locked_trace_in_skipped(logdir):
    root, _ = logdir
    done = _run("-c", "import sys, json; from trainkit.sinks.tbplugin.data import "
                "TabData; d = TabData(sys.argv[1]); print(json.dumps(d.report('d')))", root)
    assert done.returncode == 0, done.stderr[-2000:]
    rep = json.loads(done.stdout)
    assert rep["steps"] > 0 and rep["skipped"] == [[TRACE, "a file you have no permission to "
                                                           "read"]]


NO_LIST = "a folder you have no permission to list"
NO_ENTER = "a folder you have permission to list but not to enter (no x permission)"


def test_a_folder_listed_but_not_entered_is_said_once_with_its_fix(logdir):
    """Its own event file was passed over in silence, and its subfolder said as one to make
    readable (chmod u+rx e/sub), which fixes nothing: the x is missing on e."""
    root, (*_, folder) = logdir
    done = _run("-m", "trainkit", "analyze", root)
    assert done.returncode == 0, done.stderr
    err = " ".join(done.stderr.split())
    assert (f"{folder!r} is {NO_ENTER}: the runs in it are not analyzed; make it searchable "
            f"(chmod u+x {folder})") in err, err
    assert os.path.join(folder, "sub") not in err, err
    assert "[a]" in done.stdout and "[e]" not in done.stdout


_SERVED = """
import json, sys, urllib.request
from trainkit.sinks.tbplugin.launch import serve
with serve(sys.argv[1]) as url:
    get = lambda route: json.loads(urllib.request.urlopen(
        url + "/data/plugin/trainkit/" + route, timeout=60).read())
    print(json.dumps({"runs": get("runs"), "left_out": get("left_out"),
                      "c": get("report?run=c")}))
"""


def test_a_real_tensorboard_lists_the_locked_run_and_the_folders_left_out(logdir):
    """The tab listed neither the run whose one event file it may not read (the trainkit-tag
    scan's OSError read as no trainkit run) nor anything of the folders it could not list or
    enter: ``trainkit analyze`` warned of all three, the tab said nothing."""
    root, (folder, events, _, unentered) = logdir
    done = _run("-c", _SERVED, root)
    assert done.returncode == 0, done.stderr[-2000:]
    served = json.loads(done.stdout)
    assert served["runs"] == ["a", "c", "d"]
    assert [(f["path"], f["what"]) for f in served["left_out"]] == [(folder, NO_LIST),
                                                                   (unentered, NO_ENTER)]
    said = " ".join(f["said"] for f in served["left_out"])
    assert f"chmod u+rx {folder}" in said and f"chmod u+x {unentered}" in said
    (finding,) = served["c"]["findings"]
    assert finding["code"] == "TA110" and f"chmod u+r {events}" in finding["fix"], finding
    assert served["c"]["skipped"] == [[os.path.basename(events), "a file you have no "
                                                                  "permission to read"]]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_page_says_the_folders_left_out(logdir, tmp_path):
    """The page said nothing of a folder it could not list or enter: its runs were missing from
    the list without a word."""
    from tests.sinks.test_tbplugin_js import harness

    root, (folder, _, _, unentered) = logdir
    done = _run("-c", "import sys, json; from trainkit.sinks.tbplugin.data import TabData; "
                "print(json.dumps(TabData(sys.argv[1]).left_out()))", root)
    assert done.returncode == 0, done.stderr[-2000:]
    page = tmp_path / "page"
    page.mkdir()
    (page / "left_out.json").write_text(done.stdout)
    shutil.copy(os.path.join(ROOT, "trainkit", "sinks", "tbplugin", "static", "index.js"),
                page / "index.mjs")
    (page / "harness.mjs").write_text(harness("""
const fs = await import('node:fs');
const leftOut = JSON.parse(fs.readFileSync('left_out.json', 'utf8'));
globalThis.fetch = async (url) => ({ok: true, status: 200,
  json: async () => (url.startsWith('./left_out') ? leftOut : [])});
"""))
    out = subprocess.run(["node", "harness.mjs"], cwd=page, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"Not read: {folder!r} is {NO_LIST}: the runs in it are not "
                                 f"analyzed; make it readable (chmod u+rx {folder}); "
                                 f"{unentered!r} is {NO_ENTER}"), out.stdout
    assert "No trainkit runs in this logdir" in out.stdout


def test_the_tab_reads_a_file_once_made_readable(logdir):
    """The tab's report was kept while the run's files kept their sizes and times, which a chmod
    leaves: the file made readable as the page says stayed "not read" until the server ended."""
    root, (_, _, trace, _) = logdir
    done = _run("-c", "import os, sys, json; from trainkit.sinks.tbplugin.data import TabData; "
                "d = TabData(sys.argv[1]); before = d.report('d')['skipped']; "
                "os.chmod(sys.argv[2], 0o644); print(json.dumps([before, d.report('d')]))",
                root, trace)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = json.loads(done.stdout)
    assert before == [[TRACE, "a file you have no permission to read"]]
    assert after["skipped"] == [] and TRACE in after["writing"] + after["traces"], after
