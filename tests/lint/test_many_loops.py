"""A long script of many training loops at module level (notebook exports, generated sweeps).

TK302 looks for the names bound to Python numbers in each loop's scope: it walked the whole
module once per loop, so a file of 300 such loops took 17 s, and one of 1,800 ten minutes.
"""
from __future__ import annotations

import pytest

from trainkit.lint import lint_source
from trainkit.lint import sync

LOOP = """
running = 0.0
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    running += loss.item() / 10
    history.append(loss.item())
"""


def test_each_scope_is_walked_once_not_once_per_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    walked = []
    real = sync._python_numbers

    def counting(*args: object) -> object:
        walked.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sync, "_python_numbers", counting)
    source = "\n".join([LOOP] * 20) + "\ndef train():\n" + LOOP.replace("\n", "\n    ")
    found = lint_source(source, select="TK302")
    assert len(found) == 21 * 2  # each loop's two .item() calls, once each
    assert len(walked) == 2  # the module, and train()


PRINTED = """
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    loss_sum = {value}
    print(loss_sum)
"""


def test_the_scopes_numbers_are_still_told_apart() -> None:
    """``loss_sum`` is a float in train(), a tensor at module level: each scope answers for itself."""
    module = PRINTED.format(value="loss.detach()")
    function = "\ndef train():" + PRINTED.format(value="0.0").replace("\n", "\n    ")
    found = lint_source(function + module + module, select="TK302")
    assert [f.line for f in found] == [17, 25]  # the module's print(loss_sum), not train()'s
