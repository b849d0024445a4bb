"""Folders reached through a symbolic link are walked (a project that links a shared scripts
folder), once each, with no endless walk through a link to a folder above. They were skipped
silently: ``os.walk`` does not follow links by default."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainkit.lint import iter_python_files, lint_paths

SYNCING = "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step(); optimizer.zero_grad()\n    print(loss.item())\n"

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs POSIX symlinks")


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "b07_item.py").write_text(SYNCING, encoding="utf-8")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("x = 1\n", encoding="utf-8")
    (proj / "linked").symlink_to(tmp_path / "real", target_is_directory=True)
    return proj


def test_a_linked_folder_is_walked(tmp_path: Path) -> None:
    proj = _tree(tmp_path)
    files = sorted(Path(p).relative_to(proj).as_posix() for p in iter_python_files([proj]))
    assert files == ["linked/b07_item.py", "train.py"]
    assert [f.code for f in lint_paths([proj])] == ["TK302"]


def test_links_in_a_cycle_end(tmp_path: Path) -> None:
    proj = _tree(tmp_path)
    (proj / "self").symlink_to(proj, target_is_directory=True)
    (proj / "linked" / "back").symlink_to(proj, target_is_directory=True)
    (proj / "again").symlink_to(tmp_path / "real", target_is_directory=True)
    files = sorted(Path(p).relative_to(proj).as_posix() for p in iter_python_files([proj], seen=set()))
    assert files == ["again/b07_item.py", "train.py"] or files == ["linked/b07_item.py", "train.py"]
