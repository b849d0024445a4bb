"""The README stays in step with .ci/run and with the package: its set-up commands, its tab."""
from __future__ import annotations

import configparser
import os
import re

from tests.conftest import REPO


def _read(*parts: str) -> str:
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def _setup_commands() -> list:
    return [line for line in re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S)
            for line in line.splitlines() if line.startswith("python3 -m venv")]


def test_exactly_two_setup_commands_demo_and_tests():
    demo, tests = _setup_commands()
    assert demo.endswith("&& trainkit demo")
    assert tests.endswith("&& python -m pytest -q")
    for cmd in (demo, tests):
        assert "torch==2.14.1 torchvision==0.29.1" in cmd
        assert not re.search(r"pip install [^&]*\btrainkit\b", cmd)  # never the PyPI namesake


def test_ci_runs_the_readme_test_command():
    _, tests = _setup_commands()
    ci = _read(".ci", "run")
    block = ci.split("# --- the README's test command")[1].split("# --- end ---")[0]
    install = re.search(r"pip install .*?(?= &&)", tests).group(0)
    assert install in block
    assert "pytest_ok -q" in block and "-m slow" in ci and "-ne 5" in ci


def test_the_test_command_installs_the_checkout_in_place():
    """The tests import trainkit from the checkout (pytest puts it first on sys.path), so the C
    extension must be built there (an editable install), not only into site-packages: else CI
    would test the Python fallback alone, and test_ci_builds_the_extension would fail."""
    _, tests = _setup_commands()
    assert '-e ".[dev]"' in tests
    assert 'pip install -e ".[profiler-tab]"' in _read(".ci", "run")


def test_console_script_and_extras_declared():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    assert "trainkit = trainkit.cli:main" in cfg["options.entry_points"]["console_scripts"]
    assert "pytest" in cfg["options.extras_require"]["dev"]
    assert "torch-tb-profiler==0.4.3" in cfg["options.extras_require"]["profiler-tab"]


def test_the_tab_breakdown_takes_the_regions_the_readme_names(tmp_path):
    """The README listed the tab's parts (forward, backward...) without saying where they come
    from: a backward timed as `bwd`, or not timed (the README's own loop), showed as "other"."""
    import torch

    import trainkit as tk
    from trainkit.sinks.tbplugin.data import TabData

    text = " ".join(_read("README.md").split())
    names = re.search(r"the regions named `(\w+)` and `(\w+)`", text)
    assert names, "the README says which regions the breakdown's forward and backward are"
    for run, (fwd, bwd) in (("named", names.groups()), ("other", ("fwd", "bwd"))):
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with tk.session(logdir=str(tmp_path / run), system_metrics=False):
            tk.patch(opt)
            for x in tk.patch([torch.randn(8, 4) for _ in range(6)]):
                with tk.profile_region(fwd):
                    loss = model(x).square().mean()
                with tk.profile_region(bwd):
                    loss.backward()
                opt.step()
                opt.zero_grad()
    named, other = (TabData(str(tmp_path)).report(r)["breakdown"] for r in ("named", "other"))
    assert named["forward"] > 0 and named["backward"] > 0
    assert other["forward"] == other["backward"] == 0 and other["other"] > 0


def test_the_demo_step_counts_the_readme_gives_are_the_default_demos():
    """The README said the demo's summary says 32 steps and its tab heading "mean of 31 of the
    32 timed steps": the default demo makes 200 (2 epochs of 6,400 images in batches of 64), and
    times each of them, the first from the loader's first wait."""
    import math

    from trainkit.demo import DemoConfig

    text = " ".join(_read("README.md").split())
    got = re.search(r'"mean of (\d+) of the (\d+) timed steps: the first \(warm-up\) left out" for '
                    r"the demo, whose summary says (\d+) steps", text)
    assert got, "the README gives the demo's tab heading and step count"
    config = DemoConfig()
    steps = config.epochs * math.ceil(config.train_size / config.batch_size)
    assert tuple(int(n) for n in got.groups()) == (steps - 1, steps, steps)
