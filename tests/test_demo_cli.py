"""``trainkit demo`` in-process: what it prints is this run's, and a run it cannot do is said."""
from __future__ import annotations

import math

from trainkit import cli, demo


def tiny(logdir, **kw):
    return demo.DemoConfig(logdir=str(logdir), epochs=1, train_size=128, val_size=64,
                           batch_size=64, progress=False, **kw)


def test_a_second_demo_into_the_same_folder_counts_its_own_steps(tmp_path):
    """It read back every event file of the folder: the second run said 4 steps, not 2."""
    assert demo.run(tiny(tmp_path / "x")).steps == 2
    again = demo.run(tiny(tmp_path / "x"))
    assert again.steps == 2 and str(again).startswith("2 optimizer steps, ")
    assert len(list((tmp_path / "x").glob("*tfevents*"))) == 2


def test_no_step_in_time_is_said_not_a_traceback(tmp_path, capsys):
    """max_seconds over before the first step: UnboundLocalError on `loss`."""
    result = demo.run(tiny(tmp_path / "x", max_seconds=1e-9))
    assert result.steps == 0 and math.isnan(result.final_loss)
    assert demo.main(tiny(tmp_path / "y", max_seconds=1e-9)) == 1
    err = capsys.readouterr().err
    assert "no optimizer step finished within --max-seconds 1e-09" in err and "--max-seconds 50" in err


def test_an_unwritable_default_folder_exits_2_naming_it(tmp_path, monkeypatch, capsys):
    """Without --logdir the folder was not checked: a traceback and exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the default folder goes")
    assert cli.main(["demo", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit demo: ") and "runs/demo-" in err and "--logdir DIR" in err
    assert "Traceback" not in err


def test_the_printed_tensorboard_command_is_quoted(tmp_path):
    result = demo.DemoResult(logdir=str(tmp_path / "my runs" / "demo-1"), steps=1,
                             median_step_ms=1.0, samples_per_s=1.0, data_wait_share=0.0,
                             final_loss=1.0, accuracy=1.0)
    line = demo.summary_lines(result)["open"]
    assert f"tensorboard --logdir '{tmp_path / 'my runs'}' " in line
    assert str(result).startswith("1 optimizer step, ")
