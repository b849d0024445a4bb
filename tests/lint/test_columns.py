"""A finding's ``col`` counts characters (1-based), not the UTF-8 bytes ``ast`` counts: in
``print("損失:", loss.item())`` the ``.item()`` starts at character 22, not byte 26."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainkit.lint import lint_source

SRC = """import torch
def train(model, loader, optimizer):
    for x, y in loader:
        loss = model(x.cuda(), y.cuda())
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
        print("損失:", loss.item())
"""


def test_col_counts_characters() -> None:
    (finding,) = lint_source(SRC)
    assert (finding.code, finding.line, finding.col) == ("TK302", 7, 22)
    line = SRC.splitlines()[6]
    assert line[finding.col - 1:].startswith("loss.item()")


def test_col_after_a_crlf_and_an_astral_character() -> None:
    src = SRC.replace("\n", "\r\n").replace("損失", "😀ü")
    (finding,) = lint_source(src)
    assert finding.col == 22


def test_json_col_counts_characters(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SRC, encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "trainkit.lint", "--format", "json", str(path)],
                         capture_output=True, text=True, check=False)
    assert [d["col"] for d in json.loads(out.stdout)] == [22]
