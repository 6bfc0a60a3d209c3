#!/usr/bin/env bash
# compute-sanitizer racecheck on attn2's GPU tests, one test binary per build
# (extra nvcc flags per build, '|'-separated in BUILDS), to find which part of
# the kernel the tool's hazard reports follow. Run from the repository root on
# a GPU machine with .deps/gtest carried:
#   BUILDS="|-DMUSE_ATTN2_EARLY_TRIGGER=0|-DMUSE_ATTN2_EARLY_TILES=2" bash bench/micro/racecheck_variants.sh [OUT]
# (The twentieth session ran it with -DMUSE_ATTN2_EARLY_PUSH=0 and -DMUSE_ATTN2_REG_PUSH=0,
# switches since removed: commit e5baac1 has them.)
. bench/device_env.sh racecheck "${1:-}"
FILTER=${FILTER:-Attn2Gpu.OneRequestSplitPath}
for f in src/attn2/attn2_host.cc src/reference/attn2_ref.cc src/reference/bf16.cc src/common/tensor.cc src/common/arch.cc tests/gpu/test_attn2_gpu.cc; do
  g++ $CXXF -c "$f" -o "$B/$(basename "$f" .cc).o" &
done
IFS='|' read -ra builds <<< "${BUILDS:-}"
i=0
for fl in "${builds[@]}"; do
  nvcc $NVF -DMUSE_ATTN2_WGMMA=1 $fl -c src/attn2/attn2.cu -o "$B/attn2_$i.o" &
  i=$((i + 1))
done
wait
i=0
for fl in "${builds[@]}"; do
  nvcc -o "$B/tests_$i" "$B/attn2_$i.o" "$B/attn2_host.o" "$B/attn2_ref.o" "$B/bf16.o" "$B/tensor.o" "$B/arch.o" \
    "$B/test_attn2_gpu.o" "$L/libgtest_main.a" "$L/libgtest.a" -lpthread || exit 2
  i=$((i + 1))
done
stamp built
i=0
for fl in "${builds[@]}"; do
  timeout ${RC_TIMEOUT:-120} compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 4 \
    "$B/tests_$i" --gtest_filter="$FILTER" > "$OUT/rc_$i.log" 2>&1
  echo "build $i [${fl:-default}]: exit $?; $(grep -E 'RACECHECK SUMMARY' "$OUT/rc_$i.log"); $(grep -cE 'PASSED' "$OUT/rc_$i.log") passed"
  grep -E "^========= +(Write|Read) Thread" "$OUT/rc_$i.log" | sed -E 's/at void .*\+(0x[0-9a-f]+) in /+\1 /' | sort | uniq -c | head -4
  i=$((i + 1))
done
stamp done
