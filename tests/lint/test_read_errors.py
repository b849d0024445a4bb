"""A file that is not valid UTF-8 (and declares no other encoding): the error names the line of
the first bad byte and the fix. It said ``cannot read: 'utf-8' codec can't decode byte 0xe9 in
position 24`` (a byte offset in the file), or, for a bad byte on line 1 or 2, ``invalid or
missing encoding declaration``."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainkit.lint import LintError, lint_file


@pytest.mark.parametrize("data, line", [
    (b"# caf\xe9\nx = 1\n", 1),
    (b"x = 1\n# ok\ny = 2\nz = 3\n# caf\xe9\n", 5),
    (b"x = 1\r\ny = 2\r\n# caf\xe9\r\n", 3),
])
def test_non_utf8_byte_gives_its_line_and_the_fix(tmp_path: Path, data: bytes, line: int) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(data)
    with pytest.raises(LintError) as info:
        lint_file(path)
    assert info.value.line == line
    reason = info.value.reason
    assert "byte 0xe9" in reason and "not valid UTF-8" in reason
    assert "save the file as UTF-8" in reason and "# -*- coding: latin-1 -*-" in reason


def test_a_declared_encoding_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\nx = 1\n")
    assert lint_file(path) == []


def test_a_byte_invalid_in_the_declared_encoding_names_it(tmp_path: Path) -> None:
    path = tmp_path / "ascii.py"
    path.write_bytes(b"# -*- coding: ascii -*-\nx = 1\n# caf\xe9\n")
    with pytest.raises(LintError) as info:
        lint_file(path)
    assert info.value.line == 3
    assert "not valid ascii" in info.value.reason
