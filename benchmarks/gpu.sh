#!/usr/bin/env bash
# What a session lent a GPU runs there, in one call of the device tool (about 8 minutes):
#
#     run(command="bash benchmarks/gpu.sh", timeout_s=600)
#
# It installs this checkout with `pip install --no-deps -e .` (the GPU machine reaches no registry
# and has its own torch, tensorboard, psutil, matplotlib and rich), then runs there: the cuda tests,
# the default test suite (on that machine's torch), and the benchmarks on the GPU. Each part writes
# $OUT/<part>.txt, ending with its exit status, and a part that fails or runs out of its time does
# not stop the next one; a pytest part cut short by its limit still prints its summary (the tests
# run so far, the failed ones named). Copy the .txt files to benchmarks/results/ as
# <benchmark>-<gpu>.txt: env.txt says the device, the torch version, the date and whether
# google-crc32c is there.
#
# Parts named on the command line run alone, and PART_SECONDS, if set, replaces each part's own
# limit: the whole default suite, say, where 150 s cut it short (533 of ~740 tests in a mirror
# of that machine's software on 2 busy CPU cores):
#
#     run(command="PART_SECONDS=560 bash benchmarks/gpu.sh tests", timeout_s=600)
#
# google-crc32c (a dependency of trainkit) is not on that machine: without it the writer thread
# computes each record's CRC in pure Python (~25 us a step, holding the GIL), which a full install
# does not, and the overhead benchmark measures that too. To benchmark as a full install runs,
# fetch its wheel here first and carry it (benchmarks/wheels/ is ignored by git):
#
#     pip download --only-binary=:all: --no-deps --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d benchmarks/wheels google-crc32c
#     run(command="bash benchmarks/gpu.sh", carry=["benchmarks/wheels"], timeout_s=600)
set -uo pipefail
out="${OUT:?set OUT to a folder for the results (the device tool sets it)}"
py="${PYTHON:-python3}"
all_parts="cuda-tests tests overhead compiled_step accumulate_memory"
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

# A pip that builds in an isolated environment fetches setuptools first, which a machine with no
# registry cannot (--retries 0 --timeout 5: fail fast): then build with the setuptools already there.
if ! "$py" -m pip install --no-deps --retries 0 --timeout 5 -e . > "$out/install.txt" 2>&1 &&
   ! "$py" -m pip install --no-deps --no-build-isolation -e . >> "$out/install.txt" 2>&1; then
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
part tests 150 "$py" "${pytest_int[@]}" -q
part overhead 150 "$py" benchmarks/overhead.py --device cuda --processes 3 --rounds 20 --processes-cnn 2
part compiled_step 90 "$py" benchmarks/compiled_step.py --rounds 15
part accumulate_memory 40 "$py" benchmarks/accumulate_memory.py --cuda
