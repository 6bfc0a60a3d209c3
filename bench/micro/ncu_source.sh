#!/usr/bin/env bash
# Nsight Compute's per-instruction view (SASS with its warp-stall samples) of
# one attn2 launch of the C++ bench, and the kernel's SASS, for finding where
# a shape's chain spends its time. Run on the GPU machine after
# bench/attn2_device.sh has built /tmp/attn2_build/bench_attn2_wg, e.g.
#   FILTER=NoSuchTest VARIANTS=wg bash bench/attn2_device.sh $OUT; bash bench/micro/ncu_source.sh $OUT 5
# writes OUT/source_SHAPE.csv (instruction, stall samples by reason) and OUT/attn2.sass.
OUT=${1:?usage: ncu_source.sh OUT_DIR SHAPE}
SHAPE=${2:-5}
B=/tmp/attn2_build
timeout 300 ncu --clock-control none -k regex:attn2_kernel --launch-skip 10 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --warp-sampling-interval ${INTERVAL:-0} -f -o /tmp/attn2_src "$B/bench_attn2_wg" --only "$SHAPE" > /tmp/ncu_src.log 2>&1
echo "ncu exit $?"; tail -3 /tmp/ncu_src.log
ncu -i /tmp/attn2_src.ncu-rep --page source --print-source sass --csv > "$OUT/source_$SHAPE.csv" 2>&1
echo "source page exit $?, $(wc -l < "$OUT/source_$SHAPE.csv") lines"
cuobjdump -sass "$B/bench_attn2_wg" > "$OUT/attn2.sass" 2>&1; echo "sass exit $?"
