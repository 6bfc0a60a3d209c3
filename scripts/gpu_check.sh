#!/usr/bin/env bash
# One command that checks everything on a GPU machine: builds the library,
# the tests, the benchmarks and the Python extension; runs every GPU test
# (C++ and Python) and every benchmark; writes bench/results/*.json; prints a
# short table last.
#
#   scripts/gpu_check.sh            # everything
#   ONLY=route scripts/gpu_check.sh # one op's tests and benchmarks
#   ARCHS="90a;100a" ...            # also compile sm_100a (default: 90a only, to save time)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build-gpu}
ONLY=${ONLY:-}
ARCHS=${ARCHS:-90a}
PY=${PYTHON:-python3}
status=0
step() { printf '\n=== %s ===\n' "$*"; }

gtest_args=()
if [ -d .deps/gtest ]; then  # Debian's GoogleTest carried to a machine without it
  gtest_args=(-DGTest_DIR="$ROOT/.deps/gtest/usr/lib/x86_64-linux-gnu/cmake/GTest")
fi

step "build ($ARCHS)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS="$ARCHS" \
  -DMUSE_DECODE_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" "${gtest_args[@]}" >"$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\]' ; test "${PIPESTATUS[0]}" = 0 || exit 1

filter='*'
[ -n "$ONLY" ] && filter="$(echo "$ONLY" | sed -E 's/(^|_)([a-z])/\U\2/g')*"  # route -> Route*, qkv_front -> QkvFront*

step "C++ tests"
"$BUILD/muse_decode_cpu_tests" --gtest_brief=1 || status=1
"$BUILD/muse_decode_gpu_tests" --gtest_brief=1 --gtest_filter="$filter" || status=1

step "Python tests"
export PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
pytest_k=()
[ -n "$ONLY" ] && pytest_k=(-k "$ONLY or cpu")
$PY -m pytest -q -rs tests/python "${pytest_k[@]}" || status=1

step "benchmarks"
mkdir -p bench/results
for py in bench/bench_*.py; do
  op=$(basename "$py" .py); op=${op#bench_}
  [ -n "$ONLY" ] && [ "$op" != "$ONLY" ] && continue
  $PY "$py" || status=1
done
for exe in "$BUILD"/bench_*; do
  [ -x "$exe" ] || continue
  op=$(basename "$exe"); op=${op#bench_}
  [ -n "$ONLY" ] && [ "$op" != "$ONLY" ] && continue
  "$exe" --json "bench/results/${op}_kernel.jsonl" || status=1
done
if [ -z "$ONLY" ]; then
  step "main job (muse-decode, default deployment)"
  "$BUILD/muse-decode" --quiet || status=1
  "$BUILD/muse-decode" --quiet --json > bench/results/muse_decode.json || status=1
fi
if [ -n "${OUT:-}" ]; then cp bench/results/*.json* "$OUT"/ 2>/dev/null || true; fi

step "summary"
$PY bench/table.py || status=1
echo "gpu_check: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
