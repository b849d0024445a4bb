"""What ``pip install`` and a source distribution are made of: the sdist is the whole checkout."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO


def _tracked() -> list:
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")) and \
            not os.path.isfile(os.path.join(REPO, ".git")):
        pytest.skip("needs a git checkout (an sdist's own copy has no .git to list its files)")
    out = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def _copy(files: list, src) -> "os.PathLike":
    """The tracked ``files`` copied into ``src``: a build there leaves nothing in the checkout."""
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), src / name)
    return src


def test_the_sdist_holds_every_file_of_the_checkout(tmp_path):
    """setuptools took the test modules alone (tests/test*.py): no conftest.py, helpers or
    fixtures, no tests of the subfolders, no docs/lint.md the README links to, no examples; the
    tests of an unpacked sdist failed to import. Built from a copy of the tracked files, so the
    build leaves nothing in the checkout."""
    files = _tracked()
    src = _copy(files, tmp_path / "src")
    # what benchmarks/gpu.sh downloads for the GPU machine (git-ignored) is no source
    (src / "benchmarks" / "wheels").mkdir()
    (src / "benchmarks" / "wheels" / "torch-2.11.0-cp312-linux_x86_64.whl").write_bytes(b"x")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
                   cwd=src, check=True, capture_output=True, timeout=300)
    (sdist,) = (tmp_path / "dist").glob("trainkit-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    left_out = sorted(set(files) - names - {".gitignore"})
    assert not left_out, f"tracked files missing from the sdist: {left_out}"
    assert "LICENSE" in names
    assert not [n for n in names if n.endswith((".so", ".pyc"))]  # built files stay out
    assert not [n for n in names if n.startswith("benchmarks/wheels")]


#: SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the text setup.cfg's license names.
APACHE_2_0 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_is_the_apache_2_0_text_and_the_wheel_holds_it(tmp_path):
    """setup.cfg said `license = Apache-2.0`, but there was no LICENSE file to say its terms: not
    in the checkout, the sdist or the wheel (whose METADATA named no License-File)."""
    import hashlib
    import zipfile

    with open(os.path.join(REPO, "LICENSE"), "rb") as f:
        text = f.read()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None \
            and importlib.util.find_spec("wheel") is None:
        pytest.skip("this environment's setuptools has no bdist_wheel (built in from setuptools "
                    "70.1; before, the `wheel` package adds it): pip builds wheels in a fresh one")
    src = _copy(_tracked(), tmp_path / "src")
    subprocess.run([sys.executable, "setup.py", "-q", "bdist_wheel", "-d", str(tmp_path / "dist")],
                   cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("trainkit-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        info = next(n.split("/")[0] for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        # newer setuptools (PEP 639) put it in licenses/, older ones beside METADATA
        names = set(whl.namelist()) & {f"{info}/licenses/LICENSE", f"{info}/LICENSE"}
        assert [whl.read(n) for n in names] == [text]
        assert "License-File: LICENSE" in whl.read(f"{info}/METADATA").decode().splitlines()
