#!/usr/bin/env bash
# The attention block phase by phase (docs/block.md, "The timeline of one
# iteration"): builds the main job with the kernels' phase stamps compiled in
# (-DMUSE_DECODE_TRACE=ON, src/common/trace.cuh) in its own build folder,
# runs it on the block's three shapes (TP8, one request: sliding 32k, full
# 32k, full 128k) with MUSE_DECODE_TRACE_DIR set, and prints each shape's
# per-phase timeline (bench/trace.py block). The stamps cost the block under
# 0.5 us; the untraced numbers are scripts/gpu_check.sh's.
#
#   scripts/trace_block.sh [BUILD_DIR]      # or TRACE=1 scripts/gpu_check.sh
#
# ARCHS (default 90a); OUT (where given): the rings are archived there.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}-trace
ARCHS=${ARCHS:-90a}
PY=${PYTHON:-python3}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS="$ARCHS" -DMUSE_DECODE_TRACE=ON \
  -DMUSE_DECODE_TESTS=OFF -DMUSE_DECODE_PYTHON=OFF >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target muse-decode >"$BUILD.build.log" 2>&1 || { tail -40 "$BUILD.build.log"; exit 1; }
rings=$(mktemp -d)
status=0
for shape in "sliding 32768" "full 32768" "full 131072"; do
  set -- $shape
  printf '\n=== block, TP8, one request, %s layer, context %s ===\n' "$1" "$2"
  MUSE_DECODE_TRACE_DIR=$rings "$BUILD/muse-decode" --quiet --tp 8 --requests 1 --layer "$1" --context "$2" \
    | grep -E '^ *block ' || status=1
  sfx="tp8_$2_$1"
  $PY bench/trace.py block "$rings/trace_block_qkv_front_$sfx.bin" "$rings/trace_block_attn2_$sfx.bin" \
    "$rings/trace_block_o_proj_$sfx.bin" || status=1
done
[ -n "${OUT:-}" ] && tar -czf "$OUT/trace_rings.tar.gz" -C "$rings" . 2>/dev/null
exit $status
