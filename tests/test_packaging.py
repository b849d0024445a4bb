"""What ``pip install`` and a source distribution are made of: the sdist is the whole checkout."""
from __future__ import annotations

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


def test_the_sdist_holds_every_file_of_the_checkout(tmp_path):
    """setuptools took the test modules alone (tests/test*.py): no conftest.py, helpers or
    fixtures, no tests of the subfolders, no docs/lint.md the README links to, no examples; the
    tests of an unpacked sdist failed to import. Built from a copy of the tracked files, so the
    build leaves nothing in the checkout."""
    files = _tracked()
    src = tmp_path / "src"
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), src / name)
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
    assert not [n for n in names if n.endswith((".so", ".pyc"))]  # built files stay out
    assert not [n for n in names if n.startswith("benchmarks/wheels")]
