#!/usr/bin/env bash
# Before and after in one run on a GPU machine: builds the main job
# (muse-decode) from a base tree and from this one, runs it over a set of
# deployments ROUNDS times, alternating base and new, and prints per op and
# deployment the median (range) of each and the change. A refactor shows no
# change beyond the spread of one build's rounds.
#
#   git archive <ref> --prefix=base/ | tar -x -C .ab     # here: the base tree (.ab is git-ignored)
#   bench/ab.sh [OUT_DIR]                                  # there, with .ab carried
#
# ROUNDS (default 3), BASE (default .ab/base), ARCHS (default 90a), SHAPES
# (default all; tp8: the TP8 deployments alone, which take 1 min a round
# against 2.5 with TP1's; tp1: TP1's alone).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/ab_out}}
BASE=${BASE:-.ab/base}
ROUNDS=${ROUNDS:-3}
ARCHS=${ARCHS:-90a}
mkdir -p "$OUT"
[ -d "$BASE" ] || { echo "bench/ab.sh: no base tree at $BASE (see the header)" >&2; exit 2; }

# TP8 one request: full layers from 2k to 128k and the sliding layer at 128k;
# TP1 with 8 requests at 32k.
DEPLOYMENTS=(
  "--tp 8 --layer full --context 2048"
  "--tp 8 --layer full --context 8192"
  "--tp 8 --layer full --context 32768"
  "--tp 8 --layer full --context 131072"
  "--tp 8 --layer sliding --context 131072"
  "--tp 1 --layer full --context 32768 --requests 8"
)
case "${SHAPES:-all}" in
  all) ;;
  tp8) DEPLOYMENTS=("${DEPLOYMENTS[@]:0:5}") ;;
  tp1) DEPLOYMENTS=("${DEPLOYMENTS[@]:5:1}") ;;
  *) echo "bench/ab.sh: SHAPES must be all, tp8 or tp1, got '$SHAPES'" >&2; exit 2 ;;
esac

build() {  # build <source> <dir>
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_CUDA_ARCHS="$ARCHS" \
    -DMUSE_DECODE_TESTS=OFF -DMUSE_DECODE_PYTHON=OFF > "$2.configure.log" 2>&1 || { cat "$2.configure.log"; return 1; }
  cmake --build "$2" -j "$(nproc)" --target muse-decode > "$2.build.log" 2>&1 || { tail -40 "$2.build.log"; return 1; }
}
build "$BASE" /tmp/ab_base & b=$!
build . /tmp/ab_new & n=$!
wait $b || exit 1
wait $n || exit 1
echo "# built base ($BASE) and new ($(git rev-parse --short HEAD 2>/dev/null || echo tree))"

for r in $(seq 1 "$ROUNDS"); do
  for v in base new; do
    for i in "${!DEPLOYMENTS[@]}"; do
      # shellcheck disable=SC2086  # the deployment's flags split on purpose
      /tmp/ab_$v/muse-decode --quiet --json ${DEPLOYMENTS[$i]} > "$OUT/${v}_${r}_$i.json" \
        || echo "muse-decode ${DEPLOYMENTS[$i]} ($v, round $r) failed"
    done
  done
  echo "# round $r done"
done

python3 - "$OUT" "$ROUNDS" "${DEPLOYMENTS[@]}" <<'PY'
import json, statistics, sys
out, rounds, deployments = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def times(v):
    res = {}
    for r in range(1, rounds + 1):
        for i, d in enumerate(deployments):
            try:
                for g in json.load(open(f"{out}/{v}_{r}_{i}.json"))["gpu"]:
                    res.setdefault((g["op"], d), []).append(g["us_per_call"])
            except (OSError, ValueError, KeyError):
                pass
    return res
base, new = times("base"), times("new")
print(f"{'op':10s} {'deployment':48s} {'base us':>18s} {'new us':>18s} {'change':>8s}")
for k, b in base.items():
    n = new.get(k)
    if not n:
        continue
    mb, mn = statistics.median(b), statistics.median(n)
    print(f"{k[0]:10s} {k[1]:48s} {mb:8.2f} ({min(b):.2f}-{max(b):.2f}) {mn:8.2f} ({min(n):.2f}-{max(n):.2f}) "
          f"{100 * (mn / mb - 1):+7.1f}%")
PY
