"""Early exits inside ``try``, ``with`` and ``match`` blocks, and the ones that belong to a nested loop.

``try: ... if (i + 1) % n != 0: continue`` in the batch loop ends the batch loop's iteration
as the plain ``if`` does, so the step after the ``try`` runs every ``n`` batches; so does the
same exit inside a ``with`` block, or a ``match`` on ``(i + 1) % n`` whose other cases
``continue``. Each once left the step looking unconditional (no finding). A ``continue`` or
``break`` in a nested loop ends only that loop, a ``finally`` block runs even after the
exit, and an exit in an ``except`` handler is taken only on an exception: none of them may
make the step look periodic.
"""
from __future__ import annotations

import sys
import textwrap
from typing import List, Tuple

import pytest

from trainkit.lint import lint_source

needs_match = pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements need Python 3.10+")


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


def _swap(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


# --------------------------------------------------------------------------- try

IN_TRY = """
def fit(net, batches, opt, crit, k):
    for j, (a, b) in enumerate(batches):
        try:
            out = crit(net(a), b)
            out.backward()
            if (j + 1) % k != 0:
                continue
        except RuntimeError:
            opt.zero_grad()
            continue
        opt.step()
        opt.zero_grad()
"""


def test_an_exit_in_a_try_body_guards_the_step_after_the_try() -> None:
    assert _pairs(IN_TRY) == [("TK102", 6)]
    assert _pairs(_swap(IN_TRY, "out = crit(net(a), b)", "out = crit(net(a), b) / k")) == []
    # its fix names the exit inside the try, where the step's code must go
    wiped = _swap(IN_TRY, "out = crit(net(a), b)", "opt.zero_grad()\n            out = crit(net(a), b) / k")
    (finding,) = lint_source(textwrap.dedent(wiped), ignore="TK112")
    assert (finding.code, finding.line) == ("TK103", 5)
    assert "below `if (j + 1) % k != 0: continue` (line 8) with the step" in finding.fix


def test_an_exit_in_a_try_body_with_a_zero_based_index_is_a_first_window_of_one() -> None:
    src = _swap(_swap(IN_TRY, "out = crit(net(a), b)", "out = crit(net(a), b) / k"), "(j + 1) % k", "j % k")
    assert _pairs(src) == [("TK108", 7)]


TRY_THEN = """
def fit(net, batches, opt, crit, k):
    for j, (a, b) in enumerate(batches):
        try:
            crit(net(a), b).backward()
            if (j + 1) % k != 0:
                continue
        BLOCK
            opt.step()
            opt.zero_grad()
"""


def test_an_exit_in_a_try_body_guards_its_else_block() -> None:
    src = _swap(TRY_THEN, "        BLOCK\n", "        except ValueError:\n            continue\n        else:\n")
    assert _pairs(src) == [("TK102", 5)]


def test_a_step_in_finally_runs_after_the_exit_too() -> None:
    assert _pairs(_swap(TRY_THEN, "BLOCK", "finally:")) == []


def test_an_exit_in_an_except_handler_is_taken_only_on_an_exception() -> None:
    # skipping a batch that ran out of memory: the step still runs on (nearly) every batch
    src = """
    import torch

    def fit(net, batches, opt, crit, k):
        for j, (a, b) in enumerate(batches):
            try:
                crit(net(a), b).backward()
            except torch.cuda.OutOfMemoryError:
                if j % k != 0:
                    continue
                raise
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == []


def test_a_periodic_log_exit_in_a_try_body_exempts_the_sync_after_it() -> None:
    src = """
    def fit(net, batches, opt, crit, log_every, log):
        for step, (a, b) in enumerate(batches):
            out = crit(net(a), b)
            out.backward()
            opt.step()
            opt.zero_grad()
            try:
                if step % log_every != 0:
                    continue
            finally:
                pass
            log(out.item())
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "step % log_every != 0", "step is None")) == [("TK302", 13)]


# --------------------------------------------------------------------------- with

IN_WITH = """
import torch

def fit(net, batches, opt, crit, k):
    for j, (a, b) in enumerate(batches):
        with torch.autocast("cuda"):
            out = crit(net(a), b)
            out.backward()
            if (j + 1) % k != 0:
                continue
        opt.step()
        opt.zero_grad()
"""


def test_an_exit_in_a_with_block_guards_the_step_after_it() -> None:
    assert _pairs(IN_WITH) == [("TK102", 8)]
    assert _pairs(_swap(IN_WITH, "out = crit(net(a), b)", "out = crit(net(a), b) / k")) == []
    # nested blocks pass it on too, with `break` as well as `continue`
    src = """
    import torch

    def fit(net, batches, opt, crit, k, timer):
        for j, (a, b) in enumerate(batches):
            with timer("step"):
                try:
                    crit(net(a), b).backward()
                    if (j + 1) % k != 0:
                        break
                except KeyError:
                    pass
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == [("TK102", 8)]


# --------------------------------------------------------------------------- nested loops


def test_an_exit_of_a_nested_loop_does_not_exit_the_batch_loop() -> None:
    # the inner `continue` skips a parameter group; the step still runs on every batch
    src = """
    def fit(net, batches, opt, crit, k):
        for j, (a, b) in enumerate(batches):
            with net.no_sync():
                crit(net(a), b).backward()
                for group in opt.param_groups:
                    if (j + 1) % k != 0:
                        continue
                    group["lr"] *= 0.9
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == []
    assert _pairs(_swap(src, "continue", "break")) == []
    in_try = _swap(_swap(src, "            with net.no_sync():\n", "            try:\n"), "            opt.step()\n",
                   "            except KeyError:\n                pass\n            opt.step()\n")
    assert _pairs(in_try) == []
    in_while = _swap(src, "for group in opt.param_groups:", "while opt.pending():")
    assert _pairs(in_while) == []


# --------------------------------------------------------------------------- match

IN_MATCH = """
def fit(net, batches, opt, crit, k):
    for j, (a, b) in enumerate(batches):
        crit(net(a), b).backward()
        match (j + 1) % k:
            case 0:
                pass
            case _:
                continue
        opt.step()
        opt.zero_grad()
"""


_CASES = "case 0:\n                pass\n            case _:\n                continue"


@needs_match
def test_a_match_whose_other_cases_exit_guards_the_step() -> None:
    assert _pairs(IN_MATCH) == [("TK102", 4)]
    assert _pairs(_swap(IN_MATCH, "crit(net(a), b).backward()", "(crit(net(a), b) / k).backward()")) == []
    # on a case's guard, the captured name standing for the subject
    guarded = _swap(_swap(IN_MATCH, "match (j + 1) % k:", "match j:"), _CASES,
                    "case n if (n + 1) % k != 0:\n                continue")
    assert _pairs(guarded) == [("TK102", 4)]
    # an `|` pattern
    either = _swap(IN_MATCH, "case 0:", "case 0 | None:")
    assert _pairs(either) == [("TK102", 4)]


@needs_match
def test_a_match_exit_taken_on_the_multiples_or_after_a_data_pattern_is_no_accumulation() -> None:
    # evaluation every `k` batches that may stop training: the step still runs on the others
    stop = _swap(IN_MATCH, _CASES, "case 0 if evaluate(net):\n                break")
    assert _pairs(stop) == []
    # a class pattern is no plain test: the exits after it are not followed
    data = _swap(_swap(IN_MATCH, "match (j + 1) % k:", "match a:"), _CASES,
                 "case Skip():\n                pass\n            case _ if (j + 1) % k != 0:\n                continue")
    assert _pairs(data) == []
    # every case exits: the step is never reached, nothing to report
    never = _swap(IN_MATCH, "                pass", "                continue")
    assert _pairs(never) == []
