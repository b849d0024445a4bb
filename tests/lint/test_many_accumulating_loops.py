"""TK112 in a long module of many accumulating loops (a notebook exported as one script): for each
loop it scanned every call and assignment of the module, so 1,000 loops took 27 s. Now each scope
is indexed once and each loop costs a bisect and a pass over the scope's steps."""
from __future__ import annotations

import pytest

from trainkit.lint import lint_source
from trainkit.lint import _nodes, leftover_window

LOOP = """
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
    print(x, y, i)
"""


def _pos_calls(monkeypatch: pytest.MonkeyPatch, loops: int) -> int:
    calls = [0]
    real = _nodes.pos

    def counting(node: object) -> object:
        calls[0] += 1
        return real(node)  # type: ignore[arg-type]

    monkeypatch.setattr(leftover_window, "pos", counting)
    found = lint_source("\n".join([LOOP] * loops), select="TK112")
    assert len(found) == loops
    monkeypatch.setattr(leftover_window, "pos", real)
    return calls[0]


def test_work_grows_linearly_with_the_number_of_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = _pos_calls(monkeypatch, 40), _pos_calls(monkeypatch, 160)
    assert large < 6 * small  # quadratic work would be 16 times as much


def test_a_flush_counts_for_the_loops_before_it_not_after() -> None:
    flush = "if (i + 1) % accum != 0:\n    optimizer.step()\n    optimizer.zero_grad()\n"
    source = LOOP + LOOP + flush + LOOP
    found = lint_source(source, select="TK112")
    flush_line = source.splitlines().index("if (i + 1) % accum != 0:") + 1
    assert len(found) == 1 and found[0].line > flush_line
