"""The tab's front end (static/index.js) run in node against a stub DOM: what it shows when the
server fails. Skipped where node is not installed."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

HARNESS = """
class Node {}
const mk = (t) => Object.assign(new Node(), {t, kids: [], attrs: {},
  setAttribute(k, v) { this.attrs[k] = v; }, append(...c) { this.kids.push(...c); },
  replaceChildren(...c) { this.kids = c; }, addEventListener() {}});
globalThis.Node = Node;
globalThis.document = {createElement: mk, head: mk('head'), body: mk('body')};
globalThis.window = {addEventListener() {}};
globalThis.fetch = async (url) => ({ok: false, status: 500, json: async () => null});
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
    (tmp_path / "harness.mjs").write_text(HARNESS)
    out = subprocess.run(["node", "harness.mjs"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "trainkit runs cannot be listed: Error: ./runs: HTTP 500"
