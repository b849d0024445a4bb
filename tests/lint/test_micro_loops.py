"""A micro-batch loop nested in the batch loop, with the optimizer step after it (nanoGPT's shape).

The inner loop's backwards add up into the one step after it, so a ``zero_grad()`` at every
inner iteration wipes all but the last one's gradient; it once went unreported (the inner
loop has no step, the outer loop no backward of its own). Inner loops that collect gradients
one by one on purpose (gradient surgery, per-sample clipping) must stay clean.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source))]


WIPED_EACH_CHUNK = """
def fit(net, batches, opt, crit, parts):
    for a, b in batches:
        for sub_a, sub_b in zip(a.chunk(parts), b.chunk(parts)):
            opt.zero_grad()
            out = crit(net(sub_a), sub_b) / parts
            out.backward()
        opt.step()
"""


def test_a_zero_grad_in_the_micro_batch_loop_before_the_step_is_found() -> None:
    assert _pairs(WIPED_EACH_CHUNK) == [("TK103", 5)]
    (finding,) = lint_source(textwrap.dedent(WIPED_EACH_CHUNK))
    assert "micro-batch loop (line 4)" in finding.message and "step (line 8)" in finding.message
    assert "before the loop on line 4" in finding.fix


def test_the_model_s_zero_grad_and_a_while_loop_too() -> None:
    assert _pairs(WIPED_EACH_CHUNK.replace("opt.zero_grad()", "net.zero_grad()")) == [("TK103", 5)]
    src = """
    def fit(net, batches, opt, crit, parts):
        for a, b in batches:
            k = 0
            while k < parts:
                out = crit(net(a[k]), b[k]) / parts
                out.backward()
                opt.zero_grad()
                k += 1
            opt.step()
    """
    assert _pairs(src) == [("TK103", 8)]


def test_a_zero_grad_before_the_micro_batch_loop_or_under_a_condition_is_clean() -> None:
    before = WIPED_EACH_CHUNK.replace("            opt.zero_grad()\n", "").replace(
        "    for a, b in batches:\n", "    for a, b in batches:\n        opt.zero_grad()\n")
    assert _pairs(before) == []
    first = WIPED_EACH_CHUNK.replace("for sub_a, sub_b in zip(", "for k, (sub_a, sub_b) in enumerate(zip(").replace(
        "b.chunk(parts)):", "b.chunk(parts))):").replace("opt.zero_grad()", "if k == 0:\n                opt.zero_grad()")
    assert _pairs(first) == []


def test_inner_loops_that_step_or_belong_to_another_optimizer_are_clean() -> None:
    # a critic trained several times per generator step: its own loop, its own step
    src = """
    def fit(gen, critic, batches, opt_g, opt_c, rounds):
        for a in batches:
            for _ in range(rounds):
                opt_c.zero_grad()
                critic.loss(gen, a).backward()
                opt_c.step()
            opt_g.zero_grad()
            gen.loss(critic, a).backward()
            opt_g.step()
    """
    assert _pairs(src) == []
    other = WIPED_EACH_CHUNK.replace("opt.zero_grad()", "opt_probe.zero_grad()")
    assert _pairs(other) == []


def test_gradients_collected_one_by_one_on_purpose_are_clean() -> None:
    # gradient surgery over several task losses: each task's gradient is read, then combined
    surgery = """
    def fit(net, batches, opt, tasks, combine, write_grads):
        for a in batches:
            grads = []
            for task in tasks:
                opt.zero_grad()
                task(net, a).backward(retain_graph=True)
                grads.append([p.grad.clone() for p in net.parameters()])
            write_grads(net, combine(grads))
            opt.step()
    """
    assert _pairs(surgery) == []
    # the combined gradient written back by a helper between the loop and the step
    helper = """
    def fit(net, batches, opt, tasks, surgery):
        for a in batches:
            for task in tasks:
                opt.zero_grad()
                task(net, a).backward()
                surgery.store()
            surgery.set_grads(net)
            opt.step()
    """
    assert _pairs(helper) == []


# --------------------------------------------------------------------------- TK102

MICRO_STEPS = """
def fit(net, next_batch, opt, accum_micro, total):
    for it in range(total):
        for micro in range(accum_micro):
            a, b = next_batch()
            out = net(a, b)
            out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_an_undivided_loss_in_a_loop_named_for_micro_batches_is_found() -> None:
    assert _pairs(MICRO_STEPS) == [("TK102", 7)]
    (finding,) = lint_source(textwrap.dedent(MICRO_STEPS))
    assert "the update is `accum_micro` times too large" in finding.message
    assert finding.fix.startswith("`out = out / accum_micro` before backward")
    chunks = """
    def fit(net, batches, opt, crit, k):
        for a, b in batches:
            for sub_a, sub_b in zip(a.chunk(k), b.chunk(k)):
                crit(net(sub_a), sub_b).backward()
            opt.step()
            opt.zero_grad()
    """
    assert _pairs(chunks) == [("TK102", 5)]


def test_a_divided_loss_or_a_loop_over_task_losses_is_clean() -> None:
    assert _pairs(MICRO_STEPS.replace("out = net(a, b)", "out = net(a, b) / accum_micro")) == []
    # several heads' losses meant to add up: nothing says micro-batch
    tasks = MICRO_STEPS.replace("for micro in range(accum_micro):", "for head in net.heads:")
    assert _pairs(tasks) == []
    # with a wiping zero_grad inside, TK103 comes first (dividing alone would not help)
    wiped = MICRO_STEPS.replace("a, b = next_batch()", "opt.zero_grad()\n            a, b = next_batch()")
    assert _pairs(wiped) == [("TK103", 5)]


# --------------------------------------------------------------------------- TK101

LATE_IN_MICRO = MICRO_STEPS.replace("            out.backward()\n", "            out.backward()\n            out = out / accum_micro\n")


def test_a_loss_divided_after_its_backward_in_a_micro_batch_loop_is_found() -> None:
    # it once went unreported: TK102 left it to TK101, which looked only at `%` accumulation
    assert _pairs(LATE_IN_MICRO) == [("TK101", 8)]
    (finding,) = lint_source(textwrap.dedent(LATE_IN_MICRO))
    assert finding.message.startswith("`out = out / accum_micro` divides `out` after `out.backward()` on line 7")
    assert "micro-batch loop (line 4)" in finding.message and "step (line 9)" in finding.message
    assert finding.fix.startswith("move `out = out / accum_micro` before `out.backward()`")
    assert _pairs(LATE_IN_MICRO.replace("out = out / accum_micro", "out /= accum_micro")) == [("TK101", 8)]
    assert _pairs(LATE_IN_MICRO.replace("out = out / accum_micro", "out.div_(accum_micro)")) == [("TK101", 8)]


def test_a_late_division_by_the_inner_loop_s_count_is_found_whatever_its_name() -> None:
    src = LATE_IN_MICRO.replace("for micro in range(accum_micro):", "for _ in range(k):").replace(
        "accum_micro, total", "k, total").replace("out = out / accum_micro", "out = out / k")
    assert _pairs(src) == [("TK101", 8)]


def test_a_late_division_in_the_micro_batch_loop_that_is_only_for_logging_is_clean() -> None:
    # divided before the backward: the division after it is for the log
    before = LATE_IN_MICRO.replace("out = net(a, b)", "out = net(a, b) / accum_micro")
    assert _pairs(before) == []
    # rebound first: the division is of a logged copy
    detached = LATE_IN_MICRO.replace("out = out / accum_micro", "out = out.detach()\n            out /= accum_micro")
    assert _pairs(detached) == [("TK102", 7)]
    # a loop over task losses, meant to add up, divided by something else for the log
    tasks = LATE_IN_MICRO.replace("for micro in range(accum_micro):", "for head in net.heads:").replace(
        "out = out / accum_micro", "out = out / len(net.heads)")
    assert _pairs(tasks) == []
    # a wiping zero_grad inside: TK103 comes first
    wiped = LATE_IN_MICRO.replace("a, b = next_batch()", "opt.zero_grad()\n            a, b = next_batch()")
    assert _pairs(wiped) == [("TK103", 5)]
