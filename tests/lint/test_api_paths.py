"""The Python API takes paths as ``str`` or ``os.PathLike`` (``pathlib.Path``), one path or a
collection of them, and refuses anything else with a ``TypeError`` that repeats the value and shows
the fix. ``lint_paths([Path(...)])`` crashed with ``'PosixPath' object has no attribute
'endswith'``, ``lint_paths(Path('.'))`` with ``'PosixPath' object is not iterable``, and
``lint_source(b"...")`` said ``a bytes-like object is required, not 'str'`` (backwards)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainkit.lint import iter_python_files, lint_file, lint_paths, lint_source

SYNCING = "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step(); optimizer.zero_grad()\n    print(loss.item())\n"


class _PathLike:
    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "train.py"
    path.write_text(SYNCING, encoding="utf-8")
    return path


def test_lint_file_takes_a_path(script: Path) -> None:
    found = lint_file(script)
    assert [(f.code, f.path) for f in found] == [("TK302", str(script))]


def test_lint_paths_takes_a_list_of_paths_and_path_likes(script: Path) -> None:
    for paths in ([script], [_PathLike(str(script))], (script.parent,)):
        found = lint_paths(paths)
        assert [(f.code, f.path) for f in found] == [("TK302", str(script))]
        assert isinstance(found[0].path, str)


@pytest.mark.parametrize("single", ["path", "str", "pathlike"])
def test_lint_paths_takes_a_single_path(script: Path, single: str) -> None:
    folder = script.parent
    value = {"path": folder, "str": str(folder), "pathlike": _PathLike(str(folder))}[single]
    assert [f.code for f in lint_paths(value)] == ["TK302"]


def test_iter_python_files_takes_paths(script: Path) -> None:
    assert list(iter_python_files([script.parent])) == [str(script)]


@pytest.mark.parametrize("bad", [42, [42], [b"train.py"], None])
def test_lint_paths_refuses_other_values_with_the_fix(bad: object) -> None:
    with pytest.raises(TypeError) as info:
        lint_paths(bad)  # type: ignore[arg-type]
    text = str(info.value)
    assert "lint_paths(" in text and "os.PathLike" in text and "lint_paths(['train.py'])" in text
    shown = bad[0] if isinstance(bad, list) else bad
    assert repr(shown) in text


def test_lint_file_refuses_a_non_path() -> None:
    with pytest.raises(TypeError, match=r"lint_file\(42\).*str or os\.PathLike.*lint_file\('train\.py'\)"):
        lint_file(42)  # type: ignore[arg-type]


def test_lint_source_refuses_bytes_saying_how_to_decode() -> None:
    with pytest.raises(TypeError) as info:
        lint_source(SYNCING.encode())  # type: ignore[arg-type]
    text = str(info.value)
    assert "source must be a str" in text and "got bytes" in text and ".decode(" in text
    assert "a bytes-like object is required" not in text


def test_lint_source_refuses_a_path_pointing_to_lint_file(script: Path) -> None:
    with pytest.raises(TypeError, match=r"got PosixPath|got WindowsPath") as info:
        lint_source(script)  # type: ignore[arg-type]
    assert "lint_file(" in str(info.value)


def test_os_fspath_of_a_str_path_is_unchanged(script: Path) -> None:
    assert lint_paths([os.fspath(script)]) == lint_paths([script])
