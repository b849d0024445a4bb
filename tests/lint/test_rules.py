"""Each rule against planted mistakes (exact code and line) and correct loops (no findings)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List, Set, Tuple

import pytest

from tests.lint._helpers import BAD, CLEAN, FIXTURES, expected, ids
from trainkit.lint import RULES, lint_paths, lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str, **kwargs: object) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), **{"ignore": "TK112", **kwargs})]  # type: ignore[arg-type]


@pytest.mark.parametrize("path", BAD, ids=ids(BAD))
def test_planted_mistakes_are_found_at_their_lines(path: Path) -> None:
    want = expected(path)
    assert want, f"{path.name} declares no '# expect:' markers"
    got = {(f.code, f.line) for f in lint_paths([str(path)])}
    assert got == want


@pytest.mark.parametrize("path", CLEAN, ids=ids(CLEAN))
def test_correct_loops_have_no_findings(path: Path) -> None:
    assert [f.format() for f in lint_paths([str(path)])] == []


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_has_a_planted_and_a_correct_fixture(code: str) -> None:
    planted: Set[str] = {c for path in BAD for c, _ in expected(path)}
    assert code in planted
    family = code[:3].lower() + "xx"
    assert any(code.lower() in p.stem or family in p.stem for p in CLEAN), f"no clean fixture for {code}"


def test_efficient_template_fires_every_expected_code() -> None:
    findings = lint_paths([str(FIXTURES / "bad" / "efficient_template.py")])
    codes = {f.code for f in findings}
    assert codes == {"TK101", "TK301", "TK401", "TK501", "TK502"}
    # The late division is one mistake: TK101 reports it, TK102 stays quiet.
    assert [f.line for f in findings if f.code == "TK101"] == [26]
    assert [f.line for f in findings if f.code == "TK301"] == [31, 32]
    assert all(f.severity == "error" for f in findings if f.code == "TK101")


def test_nested_loops_report_once_at_the_inner_loop() -> None:
    src = """
    import gc
    for epoch in range(3):
        for x in data:
            loss = model(x)
            loss.backward()
            opt.step(); opt.zero_grad()
            gc.collect()
    """
    assert _pairs(src) == [("TK301", 8)]


def test_while_loop_is_a_training_loop() -> None:
    src = """
    import torch
    while True:
        loss = model(next(it))
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
        torch.cuda.empty_cache()
    """
    assert _pairs(src) == [("TK301", 7)]


def test_from_import_collect_is_resolved() -> None:
    src = """
    from gc import collect as sweep
    for x in data:
        model(x).sum().backward()
        sweep()
    """
    assert _pairs(src) == [("TK301", 5)]


def test_trainkit_accumulate_silences_accumulation_rules_even_with_modulo() -> None:
    src = """
    with tk.accumulate(4, optimizer):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            if i % 4 == 3:
                optimizer.step()
    """
    assert _pairs(src) == []


def test_inline_normalised_backward_is_not_tk102() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        (loss / 4).backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_anonymous_loss_is_reported_by_expression() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        criterion(model(x), y).backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    """
    findings = lint_source(textwrap.dedent(src), ignore="TK112")
    assert [(f.code, f.line) for f in findings] == [("TK102", 3)]
    assert "criterion(model(x), y)" in findings[0].message
    assert "tk.accumulate(n, optimizer)" in findings[0].fix


def test_string_formatting_is_not_an_accumulation_condition() -> None:
    src = """
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        if "%s" % name:
            optimizer.step()
        optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_scheduler_and_env_steps_do_not_make_a_training_loop() -> None:
    src = """
    import gc
    for epoch in range(10):
        scheduler.step()
        gc.collect()
    for t in range(100):
        obs, reward, done, info = env.step(action)
        print(reward.item())
    """
    assert _pairs(src) == []


def test_sync_under_no_grad_inside_training_loop_is_exempt() -> None:
    src = """
    import torch
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
        with torch.inference_mode():
            acc = (model(x).argmax(1) == y).float().mean().item()
        if debug:
            print(loss)
        else:
            print(loss)
    """
    # The else branch of a logging test runs on the plain steps: it is reported.
    assert _pairs(src) == [("TK302", 12)]


def test_sync_in_a_closure_is_not_analysed() -> None:
    # Documented limit: nested function bodies are not part of the loop iteration.
    src = """
    for x, y in loader:
        def closure():
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            print(loss.item())
            return loss
        optimizer.step(closure)
    """
    assert _pairs(src) == []


def test_scaler_update_missing_and_plain_step_together() -> None:
    src = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        scaler.scale(criterion(model(x), y)).backward()
        scaler.step(optimizer)
        optimizer.step(); optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK201", 6), ("TK202", 7)]


def test_scaler_attribute_names_are_tracked() -> None:
    src = """
    class Trainer:
        def fit(self, loader):
            for x, y in loader:
                self.scaler.scale(self.loss_fn(self.model(x), y)).backward()
                self.scaler.step(self.optimizer); self.optimizer.zero_grad()
    """
    assert _pairs(src) == [("TK201", 6)]


def test_dataloader_rules_need_a_cuda_script() -> None:
    loader = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=4)\n"
    assert _pairs(loader) == []
    assert _pairs(loader + "model.cuda()\n") == [("TK501", 2), ("TK502", 2)]
    assert _pairs(loader + 'device = "cuda:0"\n') == [("TK501", 2), ("TK502", 2)]


def test_tk104_a_loss_multiplied_by_a_name_bound_to_one_over_the_count_is_found() -> None:
    # `weight = 1 / k` then `out * weight` divides by k as surely as `out / k` does
    src = """
    import trainkit as tk

    def fit(net, batches, opt, crit, accum_k):
        weight = 1 / accum_k
        with tk.accumulate(accum_k, opt):
            for a, b in batches:
                out = crit(net(a), b) * weight
                out.backward()
                opt.step()
    """
    assert _pairs(src) == [("TK104", 8)]
    assert _pairs(src.replace("weight = 1 / accum_k", "weight = 1 / a_norm")) == []
