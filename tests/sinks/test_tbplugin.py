"""The trainkit tab in a real TensorBoard server on loopback."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import urllib.error
import urllib.request

import pytest

import trainkit as tk
from trainkit.sinks.tbplugin.data import TabData
from trainkit.sinks.tbplugin.launch import serve

from ..profiling.conftest import FIXTURES, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.headers, resp.read()


def get_json(url: str):
    return json.loads(get(url)[2])


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    train(str(root / "exp1"), steps=8, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2))
    (root / "gpu").mkdir()
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), root / "gpu")
    (root / "other").mkdir()  # a folder that is no trainkit run
    (root / "other" / "notes.txt").write_text("x")
    return str(root)


def test_a_real_tensorboard_lists_the_tab_and_serves_its_routes(logdir):
    with serve(logdir) as url:
        listing = get_json(url + "/data/plugins_listing")
        assert listing["trainkit"]["enabled"] is True
        assert listing["trainkit"]["loading_mechanism"]["module_path"] == "/data/plugin/trainkit/index.js"

        base = url + "/data/plugin/trainkit"
        assert get_json(base + "/runs") == ["exp1", "gpu"]

        rep = get_json(base + "/report?run=exp1")
        assert rep["steps"] >= 5
        assert set(rep["breakdown"]) == {"data_wait", "h2d", "forward", "backward", "optimizer",
                                         "other", "step", "median_step"}
        assert rep["breakdown"]["forward"] > 0 and rep["breakdown"]["backward"] > 0
        assert rep["ablation"] == {"rows": [], "message": "no ablation recorded"}
        (trace,) = rep["traces"]
        assert trace.endswith(".pt.trace.json")

        gpu = get_json(base + "/report?run=gpu")
        assert [f["code"] for f in gpu["findings"]] == ["TA103", "TA102"]

        status, headers, body = get(f"{base}/trace?run=exp1&file={trace}")
        assert status == 200 and "attachment" in headers["Content-Disposition"]
        assert json.loads(body)["traceEvents"]

        status, headers, body = get(base + "/index.js")
        assert "javascript" in headers["Content-Type"] and b"export async function render" in body
        assert b"http://" not in body.replace(b"https://ui.perfetto.dev", b"")


@pytest.mark.parametrize("query", ["run=exp1&file=../gpu/gpu_syncs.pt.trace.json",
                                   "run=../exp1&file=x", "run=exp1&file=/etc/passwd",
                                   "run=exp1&file=events.out.tfevents.0", "run=exp1"])
def test_trace_route_rejects_anything_not_listed(logdir, query):
    data = TabData(logdir)
    args = dict(p.split("=", 1) for p in query.split("&"))
    assert data.trace_path(args["run"], args.get("file", "")) is None


def test_report_of_an_unknown_run_is_none(logdir):
    assert TabData(logdir).report("other") is None
    assert TabData(logdir).report("nope") is None


def test_the_tab_is_inactive_without_trainkit_runs(tmp_path):
    from tensorboard.plugins import base_plugin

    from trainkit.sinks.tbplugin import TrainkitPlugin

    (tmp_path / "notes.txt").write_text("x")
    assert not TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path))).is_active()


def test_an_entry_point_listed_twice_gives_one_tab(tmp_path):
    # Python 3.9's importlib.metadata lists trainkit's entry point once per sys.path entry that
    # holds it (a checkout's root is there twice under `python -m tensorboard` run from it, with
    # an editable install): TensorBoard refused to start ("Duplicate plugins for name trainkit").
    import argparse

    from tensorboard.backend import application

    from trainkit.sinks.tbplugin import TrainkitPluginLoader

    flags = argparse.Namespace(path_prefix="", logdir=str(tmp_path), samples_per_plugin={}, window_title="")
    app = application.TensorBoardWSGIApp(flags, [TrainkitPluginLoader, TrainkitPluginLoader], None, None, None)
    assert [p.plugin_name for p in app._plugins] == ["trainkit"]

def test_an_ablation_file_is_shown(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "gpu_healthy.pt.trace.json"), tmp_path)
    rows = [{"technique": "amp", "verdict": "helped", "ratio": 0.71}]
    (tmp_path / "ablation.json").write_text(json.dumps({"rows": rows}))
    assert TabData(str(tmp_path)).report(".")["ablation"] == {"rows": rows, "message": ""}


def test_entry_point_is_declared_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    entry = cfg["options.entry_points"]["tensorboard_plugins"].strip()
    name, target = (part.strip() for part in entry.split("="))
    module, attr = target.split(":")
    assert name == "trainkit"
    import importlib

    from tensorboard.plugins import base_plugin

    loader = getattr(importlib.import_module(module), attr)
    assert issubclass(loader, base_plugin.TBLoader)
    assert "sinks/tbplugin/static/*" in cfg["options.package_data"]["trainkit"]


def test_listing_runs_and_is_active_analyze_no_run(logdir, monkeypatch):
    """TensorBoard asks is_active() at every page load: it must not read whole runs (a live run of
    200,000 steps held the page for 18 s each time it grew)."""
    from tensorboard.plugins import base_plugin

    from trainkit.sinks.tbplugin import TrainkitPlugin, data

    def refuse(*args, **kwargs):
        raise AssertionError("a run was analyzed to list the runs")

    monkeypatch.setattr(data, "analyze_run", refuse)
    assert TabData(logdir).runs() == ["exp1", "gpu"]
    assert TrainkitPlugin(base_plugin.TBContext(logdir=logdir)).is_active()


def test_a_run_found_once_its_trainkit_scalars_arrive(tmp_path):
    from trainkit.sinks.tensorboard import EventFileWriter

    w = EventFileWriter(str(tmp_path / "live"))
    for step in range(1, 200):  # a user's own scalars only, for now: not a trainkit run
        w.write_scalars(step=step, values={"loss": 1.0 / step, "not_trainkit/x": 1.0})
    w.flush()
    data = TabData(str(tmp_path))
    assert data.runs() == [] and not data.has_runs()
    w.write_scalars(step=200, values={"loss": 0.1, "trainkit/step_time_ms": 5.0})
    w.flush()
    assert data.runs() == ["live"] and data.report("live")["trainkit"] is True
    w.close()


def test_a_tilde_logdir_is_expanded_as_tensorboard_does(tmp_path, monkeypatch):
    """``tensorboard --logdir=~/runs``: TensorBoard's tabs expand the ~; the trainkit tab did not
    and stayed off."""
    from tensorboard.plugins import base_plugin

    from trainkit.sinks.tbplugin import TrainkitPlugin

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "runs" / "a").mkdir(parents=True)
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path / "runs" / "a")
    assert TabData("~/runs").runs() == ["a"]
    assert TrainkitPlugin(base_plugin.TBContext(logdir="~/runs")).is_active()


@pytest.mark.parametrize("name", ["训练_1.123.pt.trace.json", 'a"b.pt.trace.json',
                                  "hôst_1.123.pt.trace.json"])
def test_a_trace_of_any_name_downloads_under_its_name(tmp_path, name):
    """The header went out as the raw name: beyond Latin-1 the server died mid-response, and a
    quote cut the name short."""
    from tensorboard.plugins import base_plugin
    from werkzeug.http import parse_options_header
    from werkzeug.test import Client

    from trainkit.sinks.tbplugin import TrainkitPlugin

    (tmp_path / "r").mkdir()
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path / "r" / name)
    plugin = TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path)))
    resp = Client(plugin.get_plugin_apps()["/trace"]).get("/trace", query_string={"run": "r",
                                                                               "file": name})
    assert resp.status_code == 200 and json.loads(resp.data)["traceEvents"]
    header = resp.headers["Content-Disposition"]
    header.encode("latin-1")  # what the HTTP server writes; it raised UnicodeEncodeError
    assert parse_options_header(header) == ("attachment", {"filename": name})


def test_a_trace_removed_after_its_listing_is_a_404_that_says_so(tmp_path):
    """A trace deleted between the listing that vouched for it and its reading (a run folder
    cleaned up while the tab is open) made the route raise: a 500 with no word of why."""
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from trainkit.sinks.tbplugin import TrainkitPlugin

    name = "gpu_syncs.pt.trace.json"
    (tmp_path / "r").mkdir()
    shutil.copy(os.path.join(FIXTURES, name), tmp_path / "r" / name)
    plugin = TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path)))
    listed = plugin.data.trace_path

    def listed_then_removed(run, file):
        path = listed(run, file)
        os.remove(path)
        return path

    plugin.data.trace_path = listed_then_removed
    resp = Client(plugin.get_plugin_apps()["/trace"]).get("/trace", query_string={"run": "r",
                                                                               "file": name})
    assert resp.status_code == 404, resp.status_code
    assert "cannot be read now" in json.loads(resp.data)["error"] and name in resp.get_data(True)


def test_a_run_deleted_while_its_report_is_asked_is_a_404_not_a_server_error(tmp_path):
    """A run folder removed between the listing that found it and the reading of its files (a
    run cleaned up while the tab is open, which polls its report) made the route raise
    FileNotFoundError: a 500 with no word of why (seen on a real server, 1 request in ~3,700
    while a run was deleted and made again)."""
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from trainkit.sinks.tbplugin import TrainkitPlugin

    train(str(tmp_path / "r"), steps=4)
    plugin = TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path)))
    found = plugin.data._is_trainkit

    def found_then_removed(folder):
        held = found(folder)
        shutil.rmtree(folder)
        return held

    plugin.data._is_trainkit = found_then_removed
    resp = Client(plugin.get_plugin_apps()["/report"]).get("/report", query_string={"run": "r"})
    assert resp.status_code == 404, resp.status_code
    assert json.loads(resp.data) == {"error": "no trainkit run 'r'"}


def test_a_run_deleted_while_its_trace_is_asked_is_a_404_not_a_server_error(tmp_path):
    """The trace route looked the run's folder up again after its report listed the trace: a
    run deleted between the two made that a KeyError, a 500."""
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from trainkit.sinks.tbplugin import TrainkitPlugin

    name = "gpu_syncs.pt.trace.json"
    (tmp_path / "r").mkdir()
    shutil.copy(os.path.join(FIXTURES, name), tmp_path / "r" / name)
    plugin = TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path)))
    reported = plugin.data.report

    def reported_then_removed(run):
        rep = reported(run)
        shutil.rmtree(tmp_path / "r")
        return rep

    plugin.data.report = reported_then_removed
    resp = Client(plugin.get_plugin_apps()["/trace"]).get("/trace", query_string={"run": "r",
                                                                               "file": name})
    assert resp.status_code == 404, resp.status_code
    assert name in json.loads(resp.data)["error"]


def test_ablation_rows_that_are_not_objects_are_left_out_and_said(tmp_path):
    """{"rows": [null, ...]}: the tab's table read the first row's keys, and a null one threw,
    replacing the whole run's report with an error."""
    rows = [None, {"technique": "amp", "ratio": 0.8}, 3]
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path)
    (tmp_path / "ablation.json").write_text(json.dumps({"rows": rows}))
    assert TabData(str(tmp_path)).report(".")["ablation"] == {
        "rows": [rows[1]], "message": "2 row(s) of ablation.json are not objects and are not shown"}


def test_a_symlinked_run_is_listed_as_tensorboard_lists_it(tmp_path):
    """TensorBoard follows a run linked into the logdir; the tab left it out."""
    elsewhere = tmp_path / "elsewhere" / "exp"
    elsewhere.mkdir(parents=True)
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), elsewhere)
    logdir = tmp_path / "logdir"
    (logdir / "real").mkdir(parents=True)
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), logdir / "real")
    os.symlink(elsewhere, logdir / "linked")
    os.symlink(logdir, logdir / "real" / "loop")  # a link back up the tree must end
    data = TabData(str(logdir))
    assert data.runs() == ["linked", "real"]
    assert data.report("linked")["traces"] == ["gpu_syncs.pt.trace.json"]


def test_logdir_spec_runs_are_named_as_tensorboard_names_them(tmp_path):
    """``tensorboard --logdir_spec a:runs/a,runs/b``: no --logdir, so the tab was off."""
    import argparse

    from tensorboard.plugins import base_plugin

    from trainkit.sinks.tbplugin import TrainkitPlugin

    for folder in ("a", "b/exp"):
        (tmp_path / folder).mkdir(parents=True)
        shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path / folder)
    spec = f"grp:{tmp_path / 'a'},{tmp_path / 'b'}"
    context = base_plugin.TBContext(logdir="", flags=argparse.Namespace(logdir_spec=spec))
    plugin = TrainkitPlugin(context)
    assert plugin.is_active() and plugin.data.runs() == ["exp", "grp/."]
    rep = plugin.data.report("grp/.")
    assert rep["run"] == "grp/." and {f["run"] for f in rep["findings"]} == {"grp/."}
    assert plugin.data.trace_path("exp", "gpu_syncs.pt.trace.json") == os.path.realpath(
        tmp_path / "b" / "exp" / "gpu_syncs.pt.trace.json")


def test_the_report_is_json_a_browser_parses_whatever_the_numbers(tmp_path):
    """An ablation.json dumped with a NaN ratio came back as ``NaN``: JSON.parse refused the whole
    report, and the tab showed a SyntaxError for the run."""
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from trainkit.sinks.tbplugin import TrainkitPlugin

    (tmp_path / "r").mkdir()
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path / "r")
    rows = [{"technique": "amp", "ratio": float("nan"), "ci": [float("-inf"), 1.0]}]
    (tmp_path / "r" / "ablation.json").write_text(json.dumps({"rows": rows}))
    plugin = TrainkitPlugin(base_plugin.TBContext(logdir=str(tmp_path)))
    resp = Client(plugin.get_plugin_apps()["/report"]).get("/report", query_string={"run": "r"})
    strict = json.loads(resp.data, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict["ablation"]["rows"] == [{"technique": "amp", "ratio": None, "ci": [None, 1.0]}]


def test_an_ablation_file_nested_too_deep_is_said_not_a_server_error(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "gpu_syncs.pt.trace.json"), tmp_path)
    (tmp_path / "ablation.json").write_text("[" * 100_000 + "]" * 100_000)
    got = TabData(str(tmp_path)).report(".")["ablation"]
    assert got["rows"] == [] and got["message"].startswith("ablation.json cannot be read: ")


def test_a_findings_text_names_the_run_as_the_tab_does(tmp_path):
    # The tab analyzed each run folder as a logdir of its own: TA100's evidence said "in run '.'".
    run = tmp_path / "exp1"
    run.mkdir()
    trace = run / "host_1.1.pt.trace.json"
    trace.write_text('{"traceEvents": [')
    os.utime(trace, (1e9, 1e9))  # long unchanged: broken, not being written
    found = TabData(str(tmp_path)).report("exp1")["findings"]
    ta100 = [f for f in found if f["code"] == "TA100"]
    assert len(ta100) == 1 and ta100[0]["run"] == "exp1"
    assert "in run 'exp1' cannot be read" in ta100[0]["evidence"]
