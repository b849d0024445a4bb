"""The TensorBoard plugin: routes under ``/data/plugin/trainkit/`` and the ES module frontend.

Routes:
    ``runs``: JSON list of run names holding trainkit records or traces.
    ``left_out``: JSON list of the logdir's folders whose runs cannot be found (no permission to
    list or to enter them), each ``{"path", "what", "said"}`` (``said``: with the fix).
    ``report?run=RUN``: JSON with the step breakdown, findings, ablation and trace names.
    ``trace?run=RUN&file=NAME``: one of the run's listed traces, as a download.
    ``index.js``: the frontend (plain DOM, no framework, nothing fetched from the network).
"""
from __future__ import annotations

import json
import math
import mimetypes
import os
import unicodedata
import urllib.parse
from typing import Any, Callable, Dict, Optional

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import http, wrappers

from .data import TabData

PLUGIN_NAME = "trainkit"
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


def _finite(data: Any) -> Any:
    """``data`` with NaN and infinities as None: JSON has no such numbers, and the browser's
    JSON.parse refuses the ``NaN`` Python writes (an ablation.json dumped with a NaN ratio)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _json(request: Any, data: Any, code: int = 200) -> wrappers.Response:
    # http_util.Respond adds the headers TensorBoard requires (nosniff, caching, CSP).
    return http_util.Respond(request, json.dumps(_finite(data), allow_nan=False),
                             "application/json", code=code)


def _attachment(name: str) -> str:
    """``Content-Disposition`` for a download named ``name``, whatever its characters.

    Header values are Latin-1 on the wire: a name beyond it goes in RFC 6266's ``filename*``
    (UTF-8, percent-encoded), with an ASCII ``filename`` for old clients; quotes are escaped.
    """
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    fallback = http.quote_header_value(ascii_name or "trace.json", allow_token=False)
    value = f"attachment; filename={fallback}"
    if ascii_name != name:
        value += f"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"
    return value


class TrainkitPlugin(base_plugin.TBPlugin):
    """The ``trainkit`` tab. Active when the logdir holds trainkit runs.

    Example::

        plugin = TrainkitPlugin(base_plugin.TBContext(logdir="runs"))
        plugin.is_active()
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        flags = getattr(context, "flags", None)
        self.data = TabData(getattr(context, "logdir", "") or "",
                            getattr(flags, "logdir_spec", "") or "")

    def get_plugin_apps(self) -> Dict[str, Callable[..., Any]]:
        return {
            "/runs": self._serve_runs,
            "/left_out": self._serve_left_out,
            "/report": self._serve_report,
            "/trace": self._serve_trace,
            "/index.js": self._serve_static,
        }

    def is_active(self) -> bool:
        return self.data.has_runs()

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="trainkit")

    @wrappers.Request.application
    def _serve_runs(self, request: Any) -> wrappers.Response:
        return _json(request, self.data.runs())

    @wrappers.Request.application
    def _serve_left_out(self, request: Any) -> wrappers.Response:
        return _json(request, self.data.left_out())

    @wrappers.Request.application
    def _serve_report(self, request: Any) -> wrappers.Response:
        run = request.args.get("run")
        if run is None:
            return _json(request, {"error": "missing ?run=RUN; GET runs lists them"}, 400)
        rep = self.data.report(run)
        if rep is None:
            return _json(request, {"error": f"no trainkit run {run!r}"}, 404)
        return _json(request, rep)

    @wrappers.Request.application
    def _serve_trace(self, request: Any) -> wrappers.Response:
        run, name = request.args.get("run"), request.args.get("file")
        if run is None or name is None:
            return _json(request, {"error": "missing ?run=RUN&file=NAME"}, 400)
        path = self.data.trace_path(run, name)
        if path is None:  # only names the report lists are served: no path traversal
            return _json(request, {"error": f"no trace {name!r} in run {run!r}"}, 404)
        try:
            with open(path, "rb") as fh:
                body = fh.read()
        except OSError as exc:  # removed (or made unreadable) since the run was listed
            return _json(request, {"error": f"trace {name!r} in run {run!r} cannot be read now "
                                            f"({exc.strerror or exc}); reload the tab"}, 404)
        kind = "application/gzip" if name.endswith(".gz") else "application/json"
        return http_util.Respond(request, body, kind, headers=[
            ("Content-Disposition", _attachment(os.path.basename(path)))])

    @wrappers.Request.application
    def _serve_static(self, request: Any) -> wrappers.Response:
        name = os.path.basename(request.path)
        with open(os.path.join(STATIC, name), "rb") as fh:
            body = fh.read()
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith(".js"):  # ES modules must come as JavaScript whatever the OS's mime table
            kind = "text/javascript"
        return http_util.Respond(request, body, kind)


class TrainkitPluginLoader(base_plugin.TBLoader):
    """Loads :class:`TrainkitPlugin`; the ``tensorboard_plugins`` entry point names it.

    Example::

        program.TensorBoard(plugins=default.get_plugins() + [TrainkitPluginLoader()])
    """

    def load(self, context: Any) -> Optional[TrainkitPlugin]:
        # None (TensorBoard skips it) where the tab is loaded already: Python 3.9's
        # importlib.metadata lists an entry point once per sys.path entry that holds trainkit
        # (a checkout's root, on the path as the current folder and as an editable install),
        # and TensorBoard refused to start ("Duplicate plugins for name trainkit").
        if PLUGIN_NAME in (getattr(context, "plugin_name_to_instance", None) or {}):
            return None
        return TrainkitPlugin(context)
