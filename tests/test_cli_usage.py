"""``trainkit COMMAND`` with an argument the command does not take: said with that command's usage."""
from __future__ import annotations

import pytest

from trainkit import cli


@pytest.mark.parametrize("argv, command, extra", [
    (["analyze", "runs/a", "runs/b"], "analyze", "runs/b"),  # two logdirs: analyze takes one
    (["demo", "--no-progress", "extra"], "demo", "extra"),
    (["lint", "train.py", "--bogus"], "lint", "--bogus"),
])
def test_an_unknown_argument_is_said_by_the_commands_parser(capsys, argv, command, extra):
    """It was said by the top-level parser, `usage: trainkit [-h] [--version] COMMAND ...` and
    `trainkit: error: ...`, which shows none of the command's own arguments."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: trainkit {command} "), err
    assert err.endswith(f"trainkit {command}: error: unrecognized arguments: {extra}\n"), err


def test_an_unknown_option_before_the_command_is_the_top_level_parsers(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--bogus", "analyze", "runs"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: trainkit [-h]") and err.endswith(
        "trainkit: error: unrecognized arguments: --bogus\n"), err
