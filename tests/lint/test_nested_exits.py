"""Early exits beyond the plain ``if ... % n != 0: continue``, and ``if x:`` against ``if not x:``.

An exit nested in an inner ``if``, a ``break`` or ``return`` in place of ``continue``, and
an ``if`` whose every branch exits once left the step below looking unconditional, so a
hand-written accumulation went unreported. Two ``if`` statements on one name, one of them
negated, take opposite branches; read as unrelated, they once made a backward look like
it ran on batches that do not step. The near misses (an exit taken *on* the multiples, a
data filter) must stay clean.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), ignore="TK112")]


# --------------------------------------------------------------------------- nested exits

WARMUP_THEN_ACCUMULATE = """
def fit(net, batches, opt, crit, k, warm):
    for j, (a, b) in enumerate(batches):
        out = crit(net(a), b)
        out.backward()
        if j >= warm:
            if (j + 1) % k != 0:
                continue
        opt.step()
        opt.zero_grad()
"""


def test_a_modulo_exit_nested_in_another_if_guards_the_step() -> None:
    # after the warm-up the step runs every k batches: undivided, that is k times too large
    assert _pairs(WARMUP_THEN_ACCUMULATE) == [("TK102", 5)]
    divided = WARMUP_THEN_ACCUMULATE.replace("out = crit(net(a), b)", "out = crit(net(a), b) / k")
    assert _pairs(divided) == []


def test_a_wipe_above_a_nested_exit_names_the_exit_in_its_fix() -> None:
    src = WARMUP_THEN_ACCUMULATE.replace("out = crit(net(a), b)", "opt.zero_grad()\n        out = crit(net(a), b) / k")
    (finding,) = lint_source(textwrap.dedent(src), ignore="TK112")
    assert (finding.code, finding.line) == ("TK103", 4)
    assert "below `if j >= warm and (j + 1) % k != 0: continue` (line 7)" in finding.fix


def test_a_nested_exit_with_a_zero_based_index_is_no_first_window_of_one() -> None:
    # the step also runs before the warm-up ends: the windows after it are not counted from 0
    src = WARMUP_THEN_ACCUMULATE.replace("out = crit(net(a), b)", "out = crit(net(a), b) / k").replace(
        "(j + 1) % k", "j % k")
    assert _pairs(src) == []


def test_every_branch_of_an_inner_if_exiting_makes_the_outer_if_an_exit() -> None:
    src = """
    def fit(net, batches, opt, crit, k, verbose):
        for j, (a, b) in enumerate(batches):
            crit(net(a), b).backward()
            if (j + 1) % k != 0:
                if verbose:
                    print("accumulating")
                    continue
                else:
                    continue
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == [("TK102", 4)]


def test_an_inner_exit_that_keeps_the_last_batch_is_a_short_last_window() -> None:
    src = """
    def fit(net, batches, opt, crit, k):
        for j, (a, b) in enumerate(batches):
            out = crit(net(a), b) / k
            out.backward()
            if (j + 1) % k != 0:
                if j + 1 != len(batches):
                    continue
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == [("TK110", 4)]


def test_break_and_return_exit_like_continue() -> None:
    src = """
    def fit(net, batches, opt, crit, k):
        for j, (a, b) in enumerate(batches):
            crit(net(a), b).backward()
            if (j + 1) % k != 0:
                EXIT
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src.replace("EXIT", "break")) == [("TK102", 4)]
    assert _pairs(src.replace("EXIT", "return")) == [("TK102", 4)]


def test_an_exit_taken_on_the_multiples_leaves_the_rest_on_nearly_every_batch() -> None:
    # evaluation every `every` batches that may stop training: the step still runs on the others
    src = """
    def fit(net, batches, opt, crit, every, evaluate):
        for j, (a, b) in enumerate(batches):
            crit(net(a), b).backward()
            if j % every == 0:
                if evaluate(net) < 0.01:
                    break
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("break", "return")) == []


# --------------------------------------------------------------------------- `if x:` / `if not x:`


def test_a_backward_under_if_x_runs_with_a_step_behind_if_not_x_continue() -> None:
    # a DQN learning every `every` environment steps: nothing is accumulated
    src = """
    def run(agent, opt, every, total):
        for t in range(total):
            err = agent.td_error()
            learn = t % every == 0
            if learn:
                opt.zero_grad()
                err.backward()
            if not learn:
                continue
            opt.step()
    """
    assert _pairs(src) == []


def test_opposite_tests_on_one_flag_never_mix_a_scaled_backward_with_a_plain_step() -> None:
    src = """
    import torch

    def fit(net, batches, opt, crit, half):
        scaler = torch.amp.GradScaler("cuda")
        for a, b in batches:
            out = crit(net(a), b)
            if half:
                scaler.scale(out).backward()
                scaler.step(opt)
                scaler.update()
            if not half:
                out.backward()
                opt.step()
            opt.zero_grad()
    """
    assert _pairs(src) == []
    # the flag reassigned between the two tests: they may both run, as before
    assert _pairs(src.replace("            if not half:", "            half = not half\n            if not half:")) == [
        ("TK202", 15)]


def test_equal_and_not_equal_are_one_test_negated() -> None:
    src = """
    def run(agent, opt, every, total):
        for t in range(total):
            err = agent.td_error()
            if t % every == 0:
                opt.zero_grad()
                err.backward()
            if t % every != 0:
                continue
            opt.step()
    """
    assert _pairs(src) == []


def test_a_plain_exit_taken_on_the_multiples_is_no_accumulation_either() -> None:
    # `continue` here once made the step look every-`every` (TK102); `break` must not start to
    src = """
    def fit(net, batches, opt, crit, every, evaluate, target):
        for j, (a, b) in enumerate(batches):
            crit(net(a), b).backward()
            if j % every == 0 and evaluate(net) > target:
                EXIT
            opt.step()
            opt.zero_grad()
    """
    for exit_ in ("continue", "break", "return"):
        assert _pairs(src.replace("EXIT", exit_)) == [], exit_
    # the same test negated is an exit on the other batches: the step runs every `every`
    assert _pairs(src.replace("j % every == 0 and", "(j + 1) % every != 0 or not").replace("EXIT", "continue")) == [
        ("TK102", 4)]


def test_many_data_filter_exits_cost_linear_time() -> None:
    # every exit is kept for TK302's checks now, not only those on a `%` test: a block of
    # thousands of `if ...: continue` filters, each followed by a sync, once took ~40 s
    import time

    lines = ["def fit(batches, opt):", "    for a in batches:", "        out = a.sum()", "        out.backward()"]
    for i in range(2000):
        lines += [f"        if a{i} is None:", "            continue", f"        t{i} = out.item()"]
    lines.append("        opt.step(); opt.zero_grad()")
    start = time.perf_counter()
    found = lint_source("\n".join(lines) + "\n")
    assert len(found) == 2000
    assert time.perf_counter() - start < 15
