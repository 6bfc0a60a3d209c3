#!/usr/bin/env bash
# attn2 on the GPU machine, in one call: builds its GPU tests and benchmark
# for sm_90a from attn2's own sources (not the whole library, so another op's
# work in progress cannot break the run), runs the tests, then the benchmark.
#   bash bench/attn2_device.sh [OUT_DIR] [gtest filter]
# Needs .deps/gtest (Debian's static GoogleTest) in the tree.
set -o pipefail
R=$(pwd)
OUT=${1:-${OUT:-/tmp/attn2_out}}
FILTER=${2:-Attn2*}
B=/tmp/attn2_build
mkdir -p "$B" "$OUT"
G=$R/.deps/gtest/usr
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXXF="-std=c++17 -O3 -I$R/include -I$G/include -I$CUDA_HOME/include -DMUSE_DECODE_WITH_CUDA -ffp-contract=off"
NVF="-std=c++17 -O3 -I$R/include -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr -DMUSE_DECODE_WITH_CUDA"
t0=$(date +%s)
nvcc $NVF -Xptxas -v,--warn-on-spills,--warn-on-local-memory-usage -c src/attn2/attn2.cu -o "$B/attn2.o" > "$B/ptxas.log" 2>&1 &
nvcc $NVF -c bench/bench_attn2.cu -o "$B/bench.o" > "$B/bench_cc.log" 2>&1 &
for f in src/attn2/attn2_host.cc src/reference/attn2_ref.cc src/reference/bf16.cc src/common/tensor.cc src/common/arch.cc tests/gpu/test_attn2_gpu.cc; do
  g++ $CXXF -c "$f" -o "$B/$(basename "$f" .cc).o" > "$B/$(basename "$f" .cc).log" 2>&1 &
done
wait
cat "$B"/*.log | grep -E "error|warning|Used|spill" | grep -v "^$"
L=$G/lib/x86_64-linux-gnu
nvcc -o "$B/attn2_gpu_tests" "$B/attn2.o" "$B/attn2_host.o" "$B/attn2_ref.o" "$B/bf16.o" "$B/tensor.o" "$B/arch.o" \
  "$B/test_attn2_gpu.o" "$L/libgtest_main.a" "$L/libgtest.a" -lpthread || exit 2
nvcc -o "$B/bench_attn2" "$B/bench.o" "$B/attn2.o" "$B/attn2_host.o" "$B/tensor.o" "$B/arch.o" || exit 2
echo "# built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout ${TEST_TIMEOUT:-200} "$B/attn2_gpu_tests" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[ attn2|OK|FAILED|PASSED|Failure|error|Expected|Which|differs|must" | head -120
echo "# tests exit ${PIPESTATUS[0]}"
# Nsight Compute on chosen shapes (bench --only INDEX), one kernel each: NCU_SHAPES="2 5"
for i in ${NCU_SHAPES:-}; do
  timeout 120 ncu --clock-control none -k regex:attn2_kernel --launch-skip 4 --launch-count 1 \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis "$B/bench_attn2" --only "$i" > "$OUT/ncu_$i.txt" 2>&1
  echo "# ncu shape $i (exit $?)"
  grep -E "attn2_kernel|Duration|Occupancy|Block Limit|Waves Per SM|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Stall|Shared Memory Configuration Size|Registers Per Thread" "$OUT/ncu_$i.txt" | head -30
done
timeout ${BENCH_TIMEOUT:-150} "$B/bench_attn2" --json "$OUT/bench_attn2.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
echo "# bench exit ${PIPESTATUS[0]}"
