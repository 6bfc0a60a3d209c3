#!/usr/bin/env bash
# Before and after in one run on the GPU machine: builds the C++ benchmarks
# (bench_attn2, bench_qkv_front) and the tool's main job from a base tree and
# from this one, runs them ROUNDS times alternating base and new, and prints
# per op and shape the median of each and the change. A refactor shows no
# change beyond the spread of one build's rounds.
#
#   git archive <ref> --prefix=base/ | tar -x -C .ab     # here: the base tree (.ab is git-ignored)
#   bench/ab.sh [OUT_DIR]                                  # there, with .ab (and .deps) carried
#
# ROUNDS (default 3), BASE (default .ab/base), ARCHS (default 90a).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/ab_out}}
BASE=${BASE:-.ab/base}
ROUNDS=${ROUNDS:-3}
ARCHS=${ARCHS:-90a}
mkdir -p "$OUT"
[ -d "$BASE" ] || { echo "bench/ab.sh: no base tree at $BASE (see the header)" >&2; exit 2; }

build() {  # build <source> <dir>
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS="$ARCHS" \
    -DMUSE_DECODE_TESTS=OFF -DMUSE_DECODE_PYTHON=OFF > "$2.configure.log" 2>&1 || { cat "$2.configure.log"; return 1; }
  cmake --build "$2" -j "$(nproc)" --target bench_attn2 bench_qkv_front muse-decode > "$2.build.log" 2>&1 \
    || { tail -40 "$2.build.log"; return 1; }
}
build "$BASE" /tmp/ab_base & b=$!
build . /tmp/ab_new & n=$!
wait $b || exit 1
wait $n || exit 1
echo "# built base ($BASE) and new ($(git rev-parse --short HEAD 2>/dev/null || echo tree))"

for r in $(seq 1 "$ROUNDS"); do
  for v in base new; do
    d=/tmp/ab_$v
    "$d/bench_attn2" --json "$OUT/attn2_${v}_$r.jsonl" > /dev/null || echo "attn2 $v round $r failed"
    "$d/bench_qkv_front" --json "$OUT/qkv_front_${v}_$r.jsonl" > /dev/null || echo "qkv_front $v round $r failed"
    "$d/muse-decode" --quiet --json > "$OUT/tool_${v}_$r.json" || echo "muse-decode $v round $r failed"
  done
  echo "# round $r done"
done

python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(v):
    res = {}
    for r in range(1, rounds + 1):
        for op, key, val in (("attn2", lambda j: f"{j['shape']} L={j['seq_len']} mml={j['max_model_len']} W={j['window']}", "us_per_call_pdl"),
                             ("qkv_front", lambda j: f"{j['shape']} T={j['T']} pdl={j['pdl']} rope={j['rope']}", "us_per_call")):
            try:
                for line in open(f"{out}/{op}_{v}_{r}.jsonl"):
                    j = json.loads(line)
                    if j.get("op") == op:  # (not the anchors' rows)
                        res.setdefault((op, key(j)), []).append(j[val])
            except OSError:
                pass
        try:
            for g in json.load(open(f"{out}/tool_{v}_{r}.json"))["gpu"]:
                res.setdefault(("tool", g["op"]), []).append(g["us_per_call"])
        except (OSError, ValueError, KeyError):
            pass
    return res
base, new = rows("base"), rows("new")
print(f"{'op':10s} {'shape':42s} {'base us':>16s} {'new us':>16s} {'change':>8s}")
for k in base:
    if k not in new:
        continue
    b, n = base[k], new[k]
    mb, mn = statistics.median(b), statistics.median(n)
    print(f"{k[0]:10s} {k[1]:42s} {mb:7.2f} ({min(b):.2f}-{max(b):.2f}) {mn:7.2f} ({min(n):.2f}-{max(n):.2f}) {100 * (mn / mb - 1):+7.1f}%")
EOF
