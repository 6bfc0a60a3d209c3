#!/usr/bin/env bash
# qkv_front on the GPU machine, in one call: builds its GPU tests and the C++
# benchmark for sm_90a from qkv_front's own sources, runs the tests
# (FILTER, default QkvFront*), then bench_qkv_front with BENCH_ARGS (e.g.
# "--variants" for the tuning table, "--quick"). Output files land in OUT_DIR.
#   bash bench/qkv_front_device.sh [OUT_DIR]
# Needs .deps/gtest (Debian's static GoogleTest) in the tree.
. bench/device_env.sh qkv_front "${1:-}"
nvcc $NVF ${NVFLAGS:-} -Xptxas -v,--warn-on-spills -c src/qkv_front/qkv_front.cu -o "$B/qkv_front.o" > "$B/ptxas.log" 2>&1 &
nvcc $NVF ${NVFLAGS:-} -c bench/bench_qkv_front.cu -o "$B/bench.o" > "$B/bench_cc.log" 2>&1 &
for f in src/qkv_front/qkv_front_host.cc src/reference/qkv_front_ref.cc src/reference/bf16.cc src/common/tensor.cc src/common/arch.cc tests/gpu/test_qkv_front_gpu.cc; do
  g++ $CXXF -c "$f" -o "$B/$(basename "$f" .cc).o" > "$B/$(basename "$f" .cc).log" 2>&1 &
done
wait
for f in "$B"/*.log; do grep -E "error|warning|spill" "$f" | grep -v "0 bytes spill" | sed "s|^|$(basename "$f"): |"; done
nvcc -o "$B/qkv_front_gpu_tests" "$B/qkv_front.o" "$B/qkv_front_host.o" "$B/qkv_front_ref.o" "$B/bf16.o" "$B/tensor.o" \
  "$B/arch.o" "$B/test_qkv_front_gpu.o" "$L/libgtest_main.a" "$L/libgtest.a" -lpthread || exit 2
nvcc -o "$B/bench_qkv_front" "$B/bench.o" "$B/qkv_front.o" "$B/qkv_front_host.o" "$B/tensor.o" "$B/arch.o" || exit 2
stamp built
timeout ${TEST_TIMEOUT:-200} "$B/qkv_front_gpu_tests" --gtest_filter="${FILTER:-QkvFront*}" > "$B/tests.log" 2>&1
echo "# tests exit $?"
grep -E "OK|FAILED|PASSED|Failure|error|Expected|Which" "$B/tests.log" | head -40
stamp tests
timeout ${BENCH_TIMEOUT:-300} "$B/bench_qkv_front" --json "$OUT/bench_qkv_front.jsonl" ${BENCH_ARGS:-} 2>&1 | grep -v "^{" | tail -${BENCH_TAIL:-40}
stamp done
