#!/usr/bin/env bash
# Nsight Compute's warp stall reasons (per issued instruction) for one attn2
# launch of the C++ bench, shapes 5 (max_model_len 2048) and 0 (TP8 2k), with
# the caches kept and flushed before it. Run on the GPU machine after
# bench/attn2_device.sh has built /tmp/attn2_build/bench_attn2_wg, e.g.
#   FILTER=NoSuchTest VARIANTS=wg bash bench/attn2_device.sh $OUT; bash bench/micro/ncu_stalls.sh
B=/tmp/attn2_build
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,smsp__warps_issue_stalled_no_instruction.sum,smsp__inst_executed.max'
for shape in 5 0; do for cc in none all; do
  echo "=== shape $shape cache-control $cc"
  timeout 120 ncu --clock-control none --cache-control $cc -k regex:attn2_kernel --launch-skip 10 --launch-count 1 --metrics "$M" $B/bench_attn2_wg --only $shape 2>&1 | grep -E "attn2_kernel|ratio|duration|inst_executed|per_second|no_instruction" | awk '{ if ($NF+0 > 0.05 || $0 ~ /duration|inst|second|attn2/) print }'
done; done
