#!/usr/bin/env bash
# One command that checks everything on a GPU machine: builds the library,
# the tests, the benchmarks and the Python extension; runs every GPU test
# (C++ and Python) and every benchmark; writes bench/results/*.json; prints a
# short table last, and regenerates the README's results table and
# docs/results.md from this run's results (bench/report.py --write).
#
#   scripts/gpu_check.sh            # everything
#   ONLY=route scripts/gpu_check.sh # one op's tests and benchmarks (ONLY=attention_block: its
#                                   # tests and bench_block.py, the chain's rows and its)
#   ARCHS="90a;100a" ...            # also compile sm_100a (default: 90a only, to save time)
#   BENCH=0 scripts/gpu_check.sh    # the tests only
#   TESTS=0 scripts/gpu_check.sh    # the benchmarks only
#   SANITIZE=1 scripts/gpu_check.sh # only compute-sanitizer's four tools over
#                                   # each op's small tests (scripts/sanitize.sh)
#   TRACE=1 scripts/gpu_check.sh    # only the block's phase-by-phase timeline
#                                   # (scripts/trace_block.sh)
#
# The whole log also goes to $BUILD/gpu_check.log. With two or
# more GPUs it also runs the layer over NCCL at every TP size the GPUs allow
# against TP1 (tests/python/tp_layer_check.py; on one GPU the same check runs
# its ranks over gloo: --backend gloo --path fused --tp 8). FlashInfer,
# the attention anchor, is used when it imports; its wheels in .whl/
# (flashinfer-python 0.5.3 and apache-tvm-ffi) are installed to a temporary
# folder first.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build-gpu}
mkdir -p "$BUILD" bench/results
exec > >(tee "$BUILD/gpu_check.log") 2>&1
ONLY=${ONLY:-}
ARCHS=${ARCHS:-90a}
PY=${PYTHON:-python3}
status=0
step() { printf '\n=== %s ===\n' "$*"; }

gtest_args=()
if [ -d .deps/gtest ]; then  # Debian's GoogleTest carried to a machine without it
  gtest_args=(-DGTest_DIR="$ROOT/.deps/gtest/usr/lib/x86_64-linux-gnu/cmake/GTest")
fi

if [ "${TRACE:-0}" = 1 ]; then
  step "the block, phase by phase (a traced build)"
  ARCHS="$ARCHS" scripts/trace_block.sh "$BUILD"
  exit $?
fi

step "build ($ARCHS)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
mkdir -p "$BUILD"
# SANITIZE=1 builds only what scripts/sanitize.sh runs: the GPU tests and the
# sanitizer patterns of tests/sanitizer (no Python extension).
python_ext=ON targets=()
[ "${SANITIZE:-0}" = 1 ] && python_ext=OFF targets=(--target muse_decode_gpu_tests sanitizer_patterns)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS="$ARCHS" \
  -DMUSE_DECODE_BENCHES=ON -DMUSE_DECODE_WARN_SPILLS=ON -DMUSE_DECODE_PYTHON=$python_ext -DPython_EXECUTABLE="$(command -v "$PY")" "${gtest_args[@]}" >"$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" 2>&1 | tee "$BUILD/build.log" | grep -Ev '^\[[0-9]+/[0-9]+\]'
test "${PIPESTATUS[0]}" = 0 || exit 1
scripts/check_spills.sh "$BUILD/build.log" || status=1

if [ "${SANITIZE:-0}" = 1 ]; then
  step "compute-sanitizer: memcheck, racecheck, synccheck, initcheck"
  scripts/sanitize.sh "$BUILD"
  exit $?
fi

filter='*'
[ -n "$ONLY" ] && filter="$(echo "$ONLY" | sed -E 's/(^|_)([a-z])/\U\2/g')*"  # route -> Route*, qkv_front -> QkvFront*

# The Python package from this build, and FlashInfer's wheels where given.
if ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import flashinfer" 2>/dev/null; then
  site=$(mktemp -d)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
    && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"

if [ "${TESTS:-1}" != 0 ]; then
step "C++ tests"
"$BUILD/muse_decode_cpu_tests" --gtest_brief=1 || status=1
"$BUILD/muse_decode_gpu_tests" --gtest_brief=1 --gtest_filter="$filter" || status=1

if [ -z "$ONLY" ] || [ "$ONLY" = attn2 ]; then
  # attn2's mma.sync key loop (the sm_100a one) built for sm_90a and tested here.
  step "attn2's mma.sync key loop on sm_90a (MUSE_ATTN2_SM90_MMA_SYNC)"
  if cmake -S . -B "$BUILD-mma" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS=90a \
       -DMUSE_ATTN2_SM90_MMA_SYNC=ON -DMUSE_DECODE_TOOLS=OFF "${gtest_args[@]}" >"$BUILD-mma.log" 2>&1 &&
     cmake --build "$BUILD-mma" -j "$(nproc)" --target muse_decode_gpu_tests >>"$BUILD-mma.log" 2>&1; then
    "$BUILD-mma/muse_decode_gpu_tests" --gtest_brief=1 --gtest_filter='Attn2*' || status=1
  else
    tail -30 "$BUILD-mma.log"; status=1
  fi
fi

step "Python tests"
if [ -n "$ONLY" ]; then
  $PY -m pytest -q -rs tests/python -k "$ONLY or cpu" || status=1
else
  $PY -m pytest -q -rs tests/python || status=1
fi

fi  # TESTS

if [ "${BENCH:-1}" = 0 ]; then
  echo "gpu_check (tests only): $([ $status = 0 ] && echo PASS || echo FAIL)"
  exit $status
fi

step "benchmarks"
mkdir -p bench/results
bench_only=$ONLY
[ "$ONLY" = attention_block ] && bench_only=block  # bench_block.py times the chain and attention_block
for py in bench/bench_*.py; do
  op=$(basename "$py" .py); op=${op#bench_}
  [ -n "$ONLY" ] && [ "$op" != "$bench_only" ] && continue
  MUSE_DECODE_TOOL="$BUILD/muse-decode" $PY "$py" || status=1
done
for exe in "$BUILD"/bench_*; do
  [ -x "$exe" ] || continue
  op=$(basename "$exe"); op=${op#bench_}
  [ -n "$ONLY" ] && [ "$op" != "$ONLY" ] && continue
  case "$op" in
    launch) json=bench/results/launch_kernel.jsonl ;;  # JSON lines, one per launch form
    *) json=bench/results/$op.json ;;
  esac
  "$exe" --json "$json" || status=1
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -z "$ONLY" ] && [ "${gpus:-0}" -ge 2 ]; then
  step "the layer at every TP size the $gpus GPUs allow (2, 4, 8) over NCCL against TP1, each rank's step timed"
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    $PY tests/python/tp_layer_check.py --backend nccl --path fused --time || status=1
fi
if [ -z "$ONLY" ]; then
  step "main job (muse-decode, default deployment)"
  "$BUILD/muse-decode" --quiet || status=1
  "$BUILD/muse-decode" --quiet --json > bench/results/muse_decode.json || status=1
fi

step "summary"
$PY bench/table.py || status=1
[ -z "$ONLY" ] && { $PY bench/report.py --write || status=1; }
echo "gpu_check: $([ $status = 0 ] && echo PASS || echo FAIL)"
# $OUT (a folder to hand the results back in, where the caller gives one): one archive.
if [ -n "${OUT:-}" ]; then sleep 1; tar -czf "$OUT/results.tar.gz" bench/results README.md docs/results.md "$BUILD/gpu_check.log" 2>/dev/null || true; fi
exit $status
