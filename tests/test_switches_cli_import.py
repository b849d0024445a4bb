"""tk.technique, the CLI entry points, and the promise that importing trainkit is cheap."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import pytest

import trainkit as tk
from tests.conftest import REPO, scalars
from trainkit import switches


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_technique_default_override_and_session_record(tmp_path):
    assert tk.technique("amp", True) is True
    with switches.overrides({"amp": False, "my_hook": 3}):
        assert tk.technique("amp", True) is False
        assert tk.technique("my_hook", 1) == 3
        with tk.session(logdir=tmp_path) as s:
            tk.technique("num_workers", 4)
            tk.technique("amp", True)
        assert s.techniques == {"num_workers": 4, "amp": False}
    assert tk.technique("amp", True) is True


def test_technique_from_environment(monkeypatch):
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fused": false, "num_workers": 2}')
    assert tk.technique("fused", True) is False and tk.technique("num_workers", 0) == 2
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", "not json")
    with pytest.raises(ValueError, match="TRAINKIT_TECHNIQUES='not json' is not valid JSON"):
        tk.technique("fused", True)
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", "[1]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        tk.technique("fused", True)


@pytest.mark.parametrize("raw, text", [
    ('{"amp": "false"}', "'amp' is 'false'; it must be true or false"),
    ('{"compile": 0}', "'compile' is 0; it must be true or false"),
    ('{"num_workers": "4"}', "'num_workers' is '4'; it must be an int >= 0"),
    ('{"num_workers": -1}', "'num_workers' is -1"),
    ('{"num_workers": true}', "'num_workers' is True")])
def test_a_builtin_techniques_override_of_the_wrong_type_is_refused(monkeypatch, tmp_path, raw, text):
    # A JSON "false" is a non-empty string: taken as it is, it would switch the technique on.
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", raw)
    with pytest.raises(ValueError, match=re.escape(text)):
        tk.technique("amp", True)
    with pytest.raises(ValueError, match=re.escape(text)):  # at session start, before anything
        tk.session(logdir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    monkeypatch.delenv("TRAINKIT_TECHNIQUES")
    with pytest.raises(ValueError, match=re.escape(text)):
        with switches.overrides(json.loads(raw)):
            pass
    assert tk.technique("amp", True) is True
    with switches.overrides({"my_hook": "any value", "amp": False, "num_workers": 0}):
        assert tk.technique("my_hook", 1) == "any value"  # a user's own switch: any value


@pytest.mark.parametrize("raw, text", [
    ('{"bogus name": 1}', "'bogus name' is no technique name"),
    ('{"AMP": false}', "'AMP' is no technique; the built-in one is 'amp'"),
    ('{"Fused": true}', "the built-in one is 'fused'")])
def test_an_override_of_no_technique_name_is_refused_at_session_start(monkeypatch, tmp_path,
                                                                      raw, text):
    # Names were never checked: a misspelt built-in ({"AMP": false}) or a name tk.technique
    # itself refuses switched nothing, unsaid
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", raw)
    with pytest.raises(ValueError, match=re.escape(text)):
        tk.session(logdir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_override_nothing_asked_for_is_said_at_the_close(monkeypatch, tmp_path):
    # {"fuse": true} (for "fused"): no built-in, and no tk.technique("fuse", ...) in the run
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fuse": true, "my_hook": 2, "amp": false}')
    with pytest.warns(RuntimeWarning, match=r"sets 'fuse', which nothing asked for in this "
                                            r"session .*did you mean 'fused'") as said:
        with tk.session(logdir=tmp_path / "run", system_metrics=False):
            assert tk.technique("my_hook", 0) == 2  # read: not said
    assert [w.filename for w in said if "nothing asked" in str(w.message)] == [__file__]
    assert all("my_hook" not in str(w.message) for w in said)


@pytest.mark.parametrize("bad", [3, "", "has space", None])
def test_technique_bad_name(bad):
    with pytest.raises(TypeError, match=r"technique\(") as info:
        tk.technique(bad, True)
    assert repr(bad) in str(info.value)


def test_overrides_refuses_non_mapping():
    with pytest.raises(TypeError, match="mapping"):
        with switches.overrides([("amp", False)]):
            pass


@pytest.mark.parametrize("crc32c", ["as installed", "missing"])
def test_import_is_cheap(crc32c):
    # "missing": google-crc32c absent (a `pip install --no-deps`, as on the GPU machine); the
    # writer's CRC then comes from tensorboard, imported at the first CRC, not at import.
    block = "sys.modules['google_crc32c'] = None; " if crc32c == "missing" else ""
    code = ("import sys; " + block + "import trainkit; heavy = [m for m in ('torch', 'tensorboard', "
            "'matplotlib', 'rich', 'numpy', 'psutil') if m in sys.modules]; print(heavy); "
            "from trainkit.sinks.tensorboard import masked_crc32c; print(masked_crc32c(b'trainkit'))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    heavy, crc = out.stdout.split()
    assert heavy == "[]"
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    assert int(crc) == masked_crc32c(b"trainkit")


def _cli(*args, cwd=REPO, timeout=120):
    return subprocess.run([sys.executable, "-m", "trainkit", *args], env=_env(), capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def test_cli_help_and_usage_errors():
    out = _cli("--help")
    assert out.returncode == 0 and "demo" in out.stdout and "lint" in out.stdout
    assert _cli().returncode == 2
    bad = _cli("frobnicate")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    bad = _cli("demo", "--epochs", "0", "--no-progress")
    assert bad.returncode == 2 and "--epochs 0:" in bad.stderr


def test_cli_demo_logdir_that_is_a_file_exits_2_before_training(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    bad = _cli("demo", "--logdir", str(afile), "--no-progress", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.startswith("trainkit demo: ") and "is a file, not a folder" in bad.stderr
    assert afile.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_cli_demo_writes_a_tensorboard_run(tmp_path):
    logdir = tmp_path / "demo"
    out = _cli("demo", "--logdir", str(logdir), "--epochs", "1", "--train-size", "320",
               "--no-progress", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"TensorBoard run: {logdir}" in out.stdout
    assert f"tensorboard --logdir {tmp_path}" in out.stdout
    got = scalars(logdir)
    assert len(got["trainkit/step_time_ms"]) == 5 and len(got["loss"]) == 5
    for tag in ("trainkit/region/forward_ms", "trainkit/region/backward_ms", "trainkit/samples_per_s",
                "val/accuracy"):
        assert tag in got, tag


def test_an_override_asked_for_before_the_session_is_not_said_to_change_nothing(monkeypatch,
                                                                                tmp_path):
    # examples/mnist_cnn.py sizes its sampler by tk.technique("batch_size", 64) before its
    # session starts; run as its docstring says, TRAINKIT_TECHNIQUES='{"batch_size": 128}'
    # trained at 128 and the close warned that it "changed nothing"
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"batch_size": 128}')
    assert tk.technique("batch_size", 64) == 128
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with tk.session(logdir=tmp_path / "run", system_metrics=False):
            pass
