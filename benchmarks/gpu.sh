#!/usr/bin/env bash
# What a session lent a GPU runs there, in two calls of the device tool (first lent on 2026-11-23,
# an H100 with 16 cores: the tests took ~4 minutes, the benchmarks ~5, each call ~1.5 more to start):
#
#     run(command="bash benchmarks/gpu.sh cuda-tests tests sigint", carry=["benchmarks/wheels"],
#         timeout_s=600)
#     run(command="bash benchmarks/gpu.sh overhead overhead_parts compiled_step accumulate_memory",
#         carry=["benchmarks/wheels"], timeout_s=600)
#
# It installs this checkout with `pip install --no-deps -e .` (the GPU machine reaches no registry
# and has its own torch, tensorboard, psutil, matplotlib and rich), then runs there: the cuda tests,
# the default test suite (on that machine's torch; on 8 workers where pytest-xdist is there, as it
# was: 165 s, where one process took 400 s), and the benchmarks on the GPU. Each part writes
# $OUT/<part>.txt, ending with its exit status, and a part that fails or runs out of its time does
# not stop the next one; a pytest part cut short by its limit still prints its summary (the tests
# run so far, the failed ones named). Copy the .txt files to benchmarks/results/ as
# <benchmark>-<gpu>.txt (results/*-h100.txt): env.txt says the device, the torch version, the
# date, whether google-crc32c is there and whether trainkit's C extension got built.
#
# Parts named on the command line run alone, and PART_SECONDS, if set, replaces each part's own
# limit.
#
# google-crc32c (a dependency of trainkit) is not on that machine. Where trainkit's C extension
# gets built (it did: gcc and Python.h are there) the writer computes its CRCs in C anyway; where
# it does not, the writer's CRC is pure Python (~25 us a step, holding the GIL), which a full
# install's is not. Fetch its wheel here first and carry it (benchmarks/wheels/ is ignored by git):
#
#     pip download --only-binary=:all: --no-deps --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d benchmarks/wheels google-crc32c
set -uo pipefail
out="${OUT:?set OUT to a folder for the results (the device tool sets it)}"
py="${PYTHON:-python3}"
all_parts="cuda-tests tests sigint overhead overhead_parts compiled_step accumulate_memory"
for name in "$@"; do
  case " $all_parts " in
    *" $name "*) ;;
    *) echo "gpu.sh: no part '$name' (the parts: $all_parts)" >&2; exit 2 ;;
  esac
done
wanted=" ${*:-$all_parts} "
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

{
  echo "date (UTC): $(date -u +%F)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| cuda', torch.version.cuda, '| device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
  # the preinstalled packages trainkit uses, whose versions no `pip install --no-deps` checks
  "$py" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE \
    '^(tensorboard|protobuf|numpy|psutil|matplotlib|rich|pytest|setuptools|accelerate|tqdm) ' |
    tr -s ' ' | paste -sd ',' - | sed 's/,/, /g'
  # torch.compile builds C code at run time (inductor; triton's launcher for a GPU): a compiler
  # and Python.h, else the compiled tests and benchmarks fail for want of them
  "$py" -c "import os, shutil, sysconfig
inc = os.path.join(sysconfig.get_paths()['include'], 'Python.h')
print('compiler:', shutil.which('gcc') or shutil.which('cc') or 'none', '| Python.h:', os.path.exists(inc))"
} > "$out/env.txt" 2>&1

# That machine reaches no registry: build with the setuptools already there (--no-build-isolation)
# through PEP 517 (--use-pep517): without it a setuptools of 80 or later turns the editable install
# into a `pip install -e . --use-pep517` of its own, in an isolated build that fetches setuptools
# and fails. The plain install, tried second, is for a machine that does reach one.
if ! "$py" -m pip install --no-deps --no-build-isolation --use-pep517 -e . > "$out/install.txt" 2>&1 &&
   ! "$py" -m pip install --no-deps --retries 0 --timeout 5 -e . >> "$out/install.txt" 2>&1; then
  tail -20 "$out/install.txt"
  echo "pip install --no-deps -e . failed: see install.txt"
  cat "$out/env.txt"
  exit 1
fi
if compgen -G "benchmarks/wheels/*.whl" > /dev/null; then  # carried wheels (google-crc32c)
  "$py" -m pip install --no-index --no-deps benchmarks/wheels/*.whl >> "$out/install.txt" 2>&1 ||
    echo "benchmarks/wheels/*.whl: pip install failed (see install.txt); going on without them"
fi
"$py" -c "import google_crc32c" > /dev/null 2>&1 && crc="yes (C)" ||
  crc="no: the writer's CRC is pure Python, ~25 us a step (see this script's header)"
echo "google-crc32c: $crc" >> "$out/env.txt"
"$py" -c "import trainkit._speedups" > /dev/null 2>&1 && fast="built (the writer's work and regions in C)" ||
  fast="NOT built (no compiler or Python.h at install: the writer and regions run in Python)"
echo "trainkit._speedups: $fast" >> "$out/env.txt"
cat "$out/env.txt"

part() {  # part NAME SECONDS COMMAND...: run it with a time limit, its output to $OUT/NAME.txt
  local name=$1 limit=${PART_SECONDS:-$2}
  shift 2
  [[ $wanted == *" $name "* ]] || return 0
  echo "== $name (at most ${limit}s)"
  # SIGINT at the limit: pytest then prints its summary of the tests run so far (SIGKILL 5 s on)
  timeout -s INT -k 5 "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "exit status: $rc" >> "$out/$name.txt"
  tail -4 "$out/$name.txt"
}

# pytest with Python's own SIGINT handler: a shell that starts a job in the background (as a
# tool may run this script) has it ignore SIGINT, and Python keeps an inherited SIG_IGN.
pytest_int=(-c 'import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))')
part cuda-tests 120 "$py" "${pytest_int[@]}" -q -m cuda
workers=()  # pytest-xdist, where it is there: the suite in ~165 s on that machine's 16 cores
"$py" -c "import xdist" > /dev/null 2>&1 && workers=(-n 8)
part tests 280 "$py" "${pytest_int[@]}" -q "${workers[@]}"
# An uncaught KeyboardInterrupt exited 1 there instead of dying by SIGINT: which step makes it
part sigint 60 "$py" benchmarks/sigint_probe.py
part overhead 150 "$py" benchmarks/overhead.py --device cuda --processes 3 --rounds 20 --processes-cnn 2
# What each part of the trainkit loop costs there: the MLP's loop less one part at a time
part overhead_parts 130 bash -c 'for p in "" regions loader step log; do
  "$0" benchmarks/overhead.py --device cuda --only a --processes 1 --rounds 10 --without "$p" || exit
done' "$py"
part compiled_step 90 "$py" benchmarks/compiled_step.py --rounds 15
part accumulate_memory 120 "$py" benchmarks/accumulate_memory.py --cuda
