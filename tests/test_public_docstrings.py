"""Every public name of ``trainkit`` has a Google-style docstring with an ``Example::`` (DESIGN.md,
Style): what ``help(tk.NAME)`` shows a newcomer."""
from __future__ import annotations

import inspect

import pytest

import trainkit as tk


@pytest.mark.parametrize("name", tk.__all__)
def test_a_public_name_has_a_docstring_with_an_example(name):
    """``tk.active`` said only "The active session, or None." """
    doc = inspect.getdoc(getattr(tk, name)) or ""
    assert "Example::" in doc, f"tk.{name}: no Example:: in its docstring"
