#!/usr/bin/env bash
# What a session lent a GPU runs there, in one call of the device tool (about 8 minutes):
#
#     run(command="bash benchmarks/gpu.sh", timeout_s=600)
#
# It installs this checkout with `pip install --no-deps -e .` (the GPU machine reaches no registry
# and has its own torch, tensorboard, psutil, matplotlib and rich), then runs there: the cuda tests,
# the default test suite (on that machine's torch), and the benchmarks on the GPU. Each part writes
# $OUT/<part>.txt, ending with its exit status, and a part that fails or runs out of its time does
# not stop the next one. Copy the .txt files to benchmarks/results/ as <benchmark>-<gpu>.txt:
# env.txt says the device, the torch version and the date.
set -uo pipefail
out="${OUT:?set OUT to a folder for the results (the device tool sets it)}"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

{
  echo "date (UTC): $(date -u +%F)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| cuda', torch.version.cuda, '| device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# A pip that builds in an isolated environment fetches setuptools first, which a machine with no
# registry cannot (--retries 0 --timeout 5: fail fast): then build with the setuptools already there.
if ! "$py" -m pip install --no-deps --retries 0 --timeout 5 -e . > "$out/install.txt" 2>&1 &&
   ! "$py" -m pip install --no-deps --no-build-isolation -e . >> "$out/install.txt" 2>&1; then
  tail -20 "$out/install.txt"
  echo "pip install --no-deps -e . failed: see install.txt"
  exit 1
fi

part() {  # part NAME SECONDS COMMAND...: run it with a time limit, its output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit}s)"
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "exit status: $rc" >> "$out/$name.txt"
  tail -4 "$out/$name.txt"
}

part cuda-tests 120 "$py" -m pytest -q -m cuda
part tests 150 "$py" -m pytest -q
part overhead 150 "$py" benchmarks/overhead.py --device cuda --processes 3 --rounds 20 --processes-cnn 2
part compiled_step 90 "$py" benchmarks/compiled_step.py --rounds 15
part accumulate_memory 40 "$py" benchmarks/accumulate_memory.py --cuda
