#!/usr/bin/env bash
# attn2 on the GPU machine, in one call: builds its GPU tests and the C++
# benchmark for sm_90a from attn2's own sources (one benchmark binary per
# kernel variant in VARIANTS, e.g. "wg e1,sp32 trace": see vflags; the tests use the first), runs the
# tests, Nsight Compute on NCU_SHAPES, the C++ benchmarks, then (PY=1) the
# Python package's tests and bench/bench_attn2.py with its anchors (stock
# PyTorch and FlashInfer, JIT-built here from the wheels in .whl, or taken
# from .fi_cache/*.so built by an earlier call). Everything it writes lands
# in OUT_DIR (at most 8 files, for the device tool).
#   bash bench/attn2_device.sh [OUT_DIR]
# Needs .deps/gtest (Debian's static GoogleTest) in the tree.
. bench/device_env.sh attn2 "${1:-}"
VARIANTS=${VARIANTS:-wg}
vflags() {  # comma-separated tokens: wg, mma, probe, trace, e<N> (tiles before the wait),
            # sp<N> (slice pages), ks<N> (key split),
            # et<N> (the PDL trigger: 0 always after the key loop, 1 the default, 2 at once in every CTA),
            # st<N> (N stages per warpgroup; st6: 192 KB, one CTA per SM),
            # lt<N> (the grid's last cluster takes N tiles per warpgroup fewer than the others; lt99: none),
            # lm<N> (from N round-robin rounds on; below, its full share),
            # ne (timing only, wrong results: the scores' exp2 replaced by an FMA),
            # ns (timing only, wrong results: no softmax, P = S / 1000), nm (no row max: 0),
            # nl (no row sums), xm (no S, softmax or P V: the tiles only waited for; the merges
            # then fold to constants), xs (no S: every score 0), xv (no P V),
            # xk (no key copied: every stage ready at once, the math on what shared memory holds),
            # dq / dn (timing only, right in the bench, which never writes them: q and the gate /
            # this step's tile read before griddepcontrol.wait),
            # mr<N> (timing only, rows unwritten: the merging slice's ranks from N on leave
            # instead of merging; mr0: no split merge at all).
            # The A/B switches of settled choices (fm0, wr0, ep0, tw0, gh0, si0, sn0, tl0, th0, pm0,
            # rp0, ar0, il0, ix0, lo1, os0, wk0, bl0, fr0) were removed with their code in the
            # twentieth session (their last version: commit e5baac1; bench/NOTES-attn2.md);
            # earlier removals: ra0, tk0, mt0, mf0, pm0 and ncm<N> (twelfth session), wt0, cl0, pu0
            # and fm1 (thirteenth), tp0 (fourteenth).
  local f="-DMUSE_ATTN2_WGMMA=1" t
  for t in ${1//,/ }; do
    case $t in
      wg) ;;
      mma) f="${f/-DMUSE_ATTN2_WGMMA=1/-DMUSE_ATTN2_WGMMA=0}";;
      probe) f="$f -DMUSE_ATTN2_PROBE";;
      trace) f="$f -DMUSE_ATTN2_PROBE -DMUSE_ATTN2_TRACE";;
      e[0-9]*) f="$f -DMUSE_ATTN2_EARLY_TILES=${t#e}";;
      sp[0-9]*) f="$f -DMUSE_ATTN2_SLICE_PAGES=${t#sp}";;
      ks[0-9]*) f="$f -DMUSE_ATTN2_KEY_SPLIT=${t#ks}";;
      et[0-9]) f="$f -DMUSE_ATTN2_EARLY_TRIGGER=${t#et}";;
      st[0-9]*) f="$f -DMUSE_ATTN2_WG_STAGES=${t#st}";;
      lt[0-9]*) f="$f -DMUSE_ATTN2_LATE_TILES=${t#lt}";;
      lm[0-9]*) f="$f -DMUSE_ATTN2_LATE_MIN_ROUNDS=${t#lm}";;
      ne) f="$f -DMUSE_ATTN2_DIAG_NO_EXP";;
      dq) f="$f -DMUSE_ATTN2_DIAG_Q_EARLY";;
      ns) f="$f -DMUSE_ATTN2_DIAG_NO_SOFTMAX";;
      nm) f="$f -DMUSE_ATTN2_DIAG_NO_MAX";;
      nl) f="$f -DMUSE_ATTN2_DIAG_NO_SUM";;
      xm) f="$f -DMUSE_ATTN2_DIAG_NO_MATH";;
      xk) f="$f -DMUSE_ATTN2_DIAG_NO_COPY";;
      xs) f="$f -DMUSE_ATTN2_DIAG_NO_S";;
      xv) f="$f -DMUSE_ATTN2_DIAG_NO_PV";;
      dn) f="$f -DMUSE_ATTN2_DIAG_NEWEST_EARLY";;
      mr[0-9]*) f="$f -DMUSE_ATTN2_DIAG_MERGER_RANKS=${t#mr}";;
      *) echo "unknown variant token $t" >&2; exit 2;;
    esac
  done
  echo "$f"
}
for v in $VARIANTS; do  # an unknown token stops here (inside $(vflags) below it would not)
  vflags "$v" > /dev/null || exit 2
done
FIRST=${VARIANTS%% *}
FIRST=${FIRST//,/_}

if [ "${PY:-0}" = 1 ]; then
  # FlashInfer: install the wheels, reuse carried modules, JIT-build the rest in the background.
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0a
  # (bench_attn2.py puts carried .fi_cache/*.so where FlashInfer looks for prebuilt modules.)
  (timeout ${FI_WARM_TIMEOUT:-240} python3 bench/bench_attn2.py --warm-flashinfer > "$B/fi_warm.log" 2>&1; echo "exit $?" >> "$B/fi_warm.log") &
  fi_pid=$!
  # The Python package (the whole library: the bench and the Python tests call attn2 through it).
  (cmake -S . -B /tmp/pybuild -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS=90a -DMUSE_DECODE_PYTHON=ON \
     -DMUSE_DECODE_TESTS=OFF -DMUSE_DECODE_TOOLS=OFF -DPython_EXECUTABLE="$(command -v python3)" > "$B/py_build.log" 2>&1 \
   && cmake --build /tmp/pybuild --target _C >> "$B/py_build.log" 2>&1; echo "exit $?" >> "$B/py_build.log") &
  py_pid=$!
fi

for v in $VARIANTS; do
  nvcc $NVF $(vflags $v) -Xptxas -v,--warn-on-spills,--warn-on-local-memory-usage -c src/attn2/attn2.cu \
    -o "$B/attn2_${v//,/_}.o" > "$B/ptxas_${v//,/_}.log" 2>&1 &
done
nvcc $NVF -c bench/bench_attn2.cu -o "$B/bench.o" > "$B/bench_cc.log" 2>&1 &
for f in src/attn2/attn2_host.cc src/reference/attn2_ref.cc src/reference/bf16.cc src/common/tensor.cc src/common/arch.cc tests/gpu/test_attn2_gpu.cc; do
  g++ $CXXF -c "$f" -o "$B/$(basename "$f" .cc).o" > "$B/$(basename "$f" .cc).log" 2>&1 &
done
wait $(jobs -p | grep -v -e "^${fi_pid:-x}$" -e "^${py_pid:-x}$") 2>/dev/null
for f in "$B"/*.log; do case $f in *fi_warm*|*py_build*) ;; *) grep -E "error|warning|Used|spill" "$f" | sed "s|^|$(basename "$f"): |";; esac; done
nvcc -o "$B/attn2_gpu_tests" "$B/attn2_$FIRST.o" "$B/attn2_host.o" "$B/attn2_ref.o" "$B/bf16.o" "$B/tensor.o" "$B/arch.o" \
  "$B/test_attn2_gpu.o" "$L/libgtest_main.a" "$L/libgtest.a" -lpthread || exit 2
for v in $VARIANTS; do
  nvcc -o "$B/bench_attn2_${v//,/_}" "$B/bench.o" "$B/attn2_${v//,/_}.o" "$B/attn2_host.o" "$B/tensor.o" "$B/arch.o" || exit 2
done
stamp built
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# SANITIZER=memcheck (or racecheck, synccheck, initcheck): the tests under compute-sanitizer.
timeout ${TEST_TIMEOUT:-200} ${SANITIZER:+compute-sanitizer --tool "$SANITIZER" --error-exitcode 9} \
  "$B/attn2_gpu_tests" --gtest_filter="${FILTER:-Attn2*}" > "$B/tests.log" 2>&1
echo "# tests exit $?"
grep -E "^\[ attn2|OK|FAILED|PASSED|Failure|error|Expected|Which|differs|must|ERROR SUMMARY|Invalid|Race|Hazard" "$B/tests.log" | head -80
stamp tests
# Nsight Compute on chosen shapes (bench --only INDEX), one kernel each: NCU_SHAPES="5 7"
for i in ${NCU_SHAPES:-}; do
  timeout 120 ncu --clock-control none -k regex:attn2_kernel --launch-skip 4 --launch-count 1 \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis "$B/bench_attn2_$FIRST" --only "$i" > "$B/ncu_$i.txt" 2>&1
  echo "# ncu shape $i (exit $?)"
  grep -E "attn2_kernel|Duration|Achieved Occupancy|Block Limit Reg|DRAM Throughput|Memory Throughput|Compute \(SM\)|Warp Cycles Per Issued|No Eligible|Issued Warp|Eligible Warps|Executed Ipc|Pipe|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall" "$B/ncu_$i.txt" | head -30
done
cat "$B"/ncu_*.txt > "$OUT/ncu.txt" 2>/dev/null
# BENCH_ARGS may hold several argument sets, ';'-separated: every variant runs with each.
IFS=';' read -ra arg_sets <<< "${BENCH_ARGS:- }"
for rep in $(seq ${REPEAT:-1}); do  # REPEAT=2: every variant again, interleaved (noise)
for args in "${arg_sets[@]}"; do
for v in $VARIANTS; do
  stamp "bench variant $v${args:+ ($args)}"
  if [ -n "${TRACE_ROOT:-}" ]; then export MUSE_ATTN2_TRACE_DIR=$TRACE_ROOT/${v//,/_}; mkdir -p "$MUSE_ATTN2_TRACE_DIR"; fi
  timeout ${BENCH_TIMEOUT:-150} "$B/bench_attn2_${v//,/_}" --json "$OUT/bench_attn2_v${v//,/_}.jsonl" $args 2>&1 | grep -v "^{" | tail -${BENCH_TAIL:-12}
done
done
done
# Extra runs of the first variant with other arguments (experiments), ';'-separated:
# BENCH_EXTRA="--only 7,8 --splits 1; --only 3 --cluster 8 --splits 14"
if [ -n "${BENCH_EXTRA:-}" ]; then
  IFS=';' read -ra extras <<< "$BENCH_EXTRA"
  for x in "${extras[@]}"; do
    stamp "bench extra: $x"
    timeout 120 "$B/bench_attn2_$FIRST" $x 2>&1 | grep -v "^{" | tail -${EXTRA_TAIL:-6}
  done
fi
if [ "${PY:-0}" = 1 ]; then
  wait $py_pid; tail -3 "$B/py_build.log"
  stamp "python package built"
  export PYTHONPATH=/tmp/pybuild/python:$PYTHONPATH
  timeout 120 python3 -m pytest -q -x tests/python/test_attn2_gpu.py 2>&1 | tail -4
  wait $fi_pid; cat "$B/fi_warm.log" | grep -v "^\s*$" | tail -40
  stamp "flashinfer warm"
  (cd /tmp/fi_ws/.cache/flashinfer 2>/dev/null && find . -name "*.so" | tar czf "$OUT/fi_so.tgz" -T - && ls -la "$OUT/fi_so.tgz")
  PYTHONUNBUFFERED=1 timeout ${PYBENCH_TIMEOUT:-300} python3 bench/bench_attn2.py 2>&1 | grep -v "^{" | tail -${PY_TAIL:-20}
  cp bench/results/attn2.json "$OUT/${PY_RESULT_NAME:-attn2.json}" 2>/dev/null
fi
cat "$B/tests.log" "$B/fi_warm.log" "$B/py_build.log" > "$OUT/logs.txt" 2>/dev/null
stamp done
