#!/usr/bin/env bash
# compute-sanitizer's four tools (memcheck, racecheck, synccheck, initcheck)
# over each op's small GPU tests (the *Sanitizer* gtests: the paths each
# deployment takes, one or two launches each), then one table, tool x op, of
# the reports that no named suppression (scripts/sanitize.supp) covers.
# Exits non-zero unless every cell is "0 errors": a report, a run that timed
# out, a run without the tool's summary or a test that failed under the tool
# each fail it.
#
#   scripts/sanitize.sh [BUILD]      # BUILD (default build-gpu) holds
#                                    # muse_decode_gpu_tests and sanitizer_patterns
#   TOOLS="racecheck synccheck" OPS="attn2 route" scripts/sanitize.sh   # a subset
#   JOBS=8            sanitizer runs at once (they share the GPU; default 8)
#   BUDGET=480        seconds for all runs: a run not started by then is not run
#                     (and fails its cell); each run also stops at the budget's end
#   TIMEOUT_RACECHECK=240 TIMEOUT_MEMCHECK=240 ...   per-run limits, in seconds
#
# Besides the ops, tests/sanitizer/sanitizer_patterns runs under racecheck (the
# patterns that prove suppressions: an entry is honoured only when a pattern
# reproduces its report, the same pair of access sites, in this run) and
# under synccheck (the cluster merge's barrier protocol, and a CTA that exits
# with a barrier phase open or closed). racecheck's reports name the two
# access sites (function, file:line), not the kernel, so that pair is what
# entries match. docs/sanitizers.md says what each tool reports and why.
# The table comes last; before it, the first reports of each failing run.
# Every run's tool log and test output are kept in BUILD/sanitize/ (and, with
# OUT set, archived to $OUT/sanitize_logs.tar.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${1:-${BUILD:-build-gpu}}
TOOLS=${TOOLS:-"memcheck racecheck synccheck initcheck"}
OPS=${OPS:-"attn2 qkv_front route o_proj"}
JOBS=${JOBS:-8}
BUDGET=${BUDGET:-480}
PY=${PYTHON:-python3}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
TESTS="$BUILD/muse_decode_gpu_tests"
PATTERNS="$BUILD/sanitizer_patterns"
LOGS="$BUILD/sanitize"

die() { echo "sanitize: $*" >&2; exit 1; }
[ -x "$CS" ] || die "no compute-sanitizer (not on PATH, nor $CS)"
[ -x "$TESTS" ] || die "$TESTS is not built"
[ -x "$PATTERNS" ] || die "$PATTERNS is not built"
rm -rf "$LOGS" && mkdir -p "$LOGS"
"$CS" --version | tail -1
help=$("$CS" --help 2>&1)
has() { grep -q -- "$1" <<<"$help"; }

# (op, case, gtest filter): the smallest tests that cover each op's paths.
CASES=(
  "qkv_front streamk QkvFrontGpu.SanitizerStreamK"
  "qkv_front cluster QkvFrontGpu.SanitizerCluster"
  "o_proj short_k OProjGpu.SanitizerShortK"
  "o_proj long_k OProjGpu.SanitizerLongK"
  "attn2 one_slice Attn2Gpu.SanitizerOneSlice"
  "attn2 split16_small Attn2Gpu.SanitizerSplit16Small"
  "attn2 split16 Attn2Gpu.SanitizerSplit16"
  "attn2 split16_all Attn2Gpu.SanitizerSplit16AllActive"
  "attn2 split8 Attn2Gpu.SanitizerSplit8"
  "route shapes RouteGpu.SanitizerShapes"
)

tool_args() {
  case $1 in
    racecheck) has --racecheck-report && echo "--racecheck-report analysis" ;;
    synccheck) has --missing-barrier-init-is-fatal && echo "--missing-barrier-init-is-fatal no" ;;
    *) ;;
  esac
}
limit_of() {
  case $1 in
    racecheck) echo "${TIMEOUT_RACECHECK:-240}" ;;
    memcheck) echo "${TIMEOUT_MEMCHECK:-240}" ;;
    synccheck) echo "${TIMEOUT_SYNCCHECK:-240}" ;;
    initcheck) echo "${TIMEOUT_INITCHECK:-240}" ;;
  esac
}
# synccheck faults kernels launched with more than 4 clusters of 16 CTAs,
# whatever they do (the patterns waves16_4 and waves16_14 below: the same
# correct kernel, clean on 4 clusters, "Missing wait" reports and an illegal
# address on 14). Under synccheck attn2's cases with larger grids of such
# clusters therefore run with MUSE_DECODE_ATTN2_MAX_CLUSTER=8 (the library's
# clusters-of-8 path); split16_small and one_slice keep clusters of 16.
env_of() {  # tool op name
  case "$1 $2 $3" in
    "synccheck attn2 split16" | "synccheck attn2 split16_all") echo "MUSE_DECODE_ATTN2_MAX_CLUSTER=8" ;;
    *) ;;
  esac
}
# The runs: racecheck's (the longest) first, then the other tools'.
runs=()
for tool in racecheck synccheck memcheck initcheck; do
  [[ " $TOOLS " == *" $tool "* ]] || continue
  [ "$tool" = racecheck ] && runs+=("racecheck patterns race")
  [ "$tool" = synccheck ] && runs+=("synccheck patterns race" "synccheck patterns open" "synccheck patterns closed"
                                    "synccheck patterns waves16_4" "synccheck patterns waves16_14")
  for c in "${CASES[@]}"; do
    read -r op name filter <<<"$c"
    [[ " $OPS " == *" $op "* ]] && runs+=("$tool $op $name $filter")
  done
done

start=$(date +%s)
slot=0
launch() {  # tool op name [filter]
  local tool=$1 op=$2 name=$3 filter=${4:-} base="$LOGS/$1.$2.$3"
  local left=$((BUDGET - ($(date +%s) - start)))
  local limit; limit=$(limit_of "$tool")
  if [ "$left" -le 5 ]; then echo "not started: the budget was spent" >"$base.skipped"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  local port=()
  has --port && port=(--port $((49152 + 16 * (slot % 32))))
  slot=$((slot + 1))
  local app
  case "$op $name" in
    "patterns waves16_4") app=("$PATTERNS" waves 16 64 ring) ;;
    "patterns waves16_14") app=("$PATTERNS" waves 16 224 ring) ;;
    patterns\ *) app=("$PATTERNS" "$name") ;;
    *) app=("$TESTS" --gtest_filter="$filter") ;;
  esac
  local env_set; env_set=$(env_of "$tool" "$op" "$name")
  local envs=(env); [ -n "$env_set" ] && envs+=("$env_set")
  # shellcheck disable=SC2046
  (
    t0=$(date +%s)
    timeout -k 15 "$limit" "${envs[@]}" "$CS" --tool "$tool" $(tool_args "$tool") "${port[@]}" --print-limit 1000 \
      --error-exitcode 86 --log-file "$base.log" "${app[@]}" >"$base.out" 2>&1
    echo "$? $(($(date +%s) - t0)) $limit" >"$base.rc"
  ) &
}

echo "sanitize: ${#runs[@]} runs, $JOBS at a time, budget ${BUDGET} s ($CS)"
[[ " $TOOLS " == *" synccheck "* && " $OPS " == *" attn2 "* ]] &&
  echo "sanitize: synccheck runs attn2's split16 and split16_all with MUSE_DECODE_ATTN2_MAX_CLUSTER=8 (clusters of 8; see env_of)"
for r in "${runs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  # shellcheck disable=SC2086
  launch $r
done
wait
echo "sanitize: all runs done in $(($(date +%s) - start)) s"

# Reports, suppressions and the table.
"$PY" - "$LOGS" "$ROOT" "$TOOLS" "$OPS" <<'PYEOF'
import glob, os, re, sys

logs, root, tools, ops = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()


def line_of(path, texts):
    """The numbers of the lines of `path` holding any of `texts`, as a regex group."""
    try:
        lines = open(os.path.join(root, path), encoding="utf-8").read().splitlines()
    except OSError:
        return "(?!)"
    nums = sorted({str(i + 1) for i, l in enumerate(lines) for t in texts if t in l}, key=int)
    return "(" + "|".join(nums) + ")" if nums else "(?!)"


def expand(rx):
    return re.sub(r"\{([^:{}]+):([^{}]+)\}", lambda m: line_of(m.group(1), m.group(2).split("||")), rx)


# The suppression entries (an INI-like file whose keys may repeat).
entries, cur = [], None
for raw in open(os.path.join(root, "scripts/sanitize.supp"), encoding="utf-8").read().splitlines():
    l = raw.strip()
    if not l or l.startswith("#"):
        continue
    if l.startswith("[") and l.endswith("]"):
        cur = {"name": l[1:-1], "match": [], "repro_match": []}
        entries.append(cur)
    elif cur is not None and "=" in l:
        k, _, v = (x.strip() for x in l.partition("="))
        if k in ("match", "repro_match"):
            cur[k].append(re.compile(expand(v)))
        else:
            cur[k] = v

SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: (\d+) hazards? displayed")


def parse(path):
    """The report records of a tool log (blocks between blank '=========' lines) and its summary count."""
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return [], None
    records, block, summary = [], [], None
    for l in lines + [""]:
        body = re.sub(r"^=+ ?", "", l)
        m = SUMMARY.search(body)
        if m:
            summary = int(m.group(1) or m.group(2))
            continue
        if body.strip():
            if not body.startswith(("COMPUTE-SANITIZER", "Target application returned")):
                block.append(body)
        elif block:
            records.append("\n".join(block))
            block = []
    return records, summary


def state(base):
    """None, rc, seconds for a run that finished; else a string saying why not."""
    if os.path.exists(base + ".skipped"):
        return "not run: the budget was spent"
    try:
        rc, secs, limit = open(base + ".rc").read().split()
    except (OSError, ValueError):
        return "no result"
    if int(rc) in (124, 137):
        return f"TIMEOUT after {limit} s"
    return None, int(rc), int(secs)


def covering(tool, op, record):
    for e in entries:
        if e.get("tool") == tool and e.get("op") in (op, "*") and e["name"] in proofs and e["match"] \
                and all(rx.search(record) for rx in e["match"]):
            return e["name"]
    return None


SITE = re.compile(r"\bin (\S+:\d+)")


def sites(record):
    """A record's sites (file:line): racecheck's two accesses; else its innermost and outermost device frames."""
    found = SITE.findall(record)
    if "Race reported between" in record:
        return ", ".join(found[:2]) or "?"
    return ", ".join(dict.fromkeys(found[:1] + found[-1:])) or "?"


# The proofs: which entries a pattern reproduced, per tool, in this run (a
# pattern record matching every repro_match regex of an entry of that tool).
proofs, pattern_lines = {}, []
for tool in tools:
    for base in sorted(p[:-3] for p in glob.glob(os.path.join(logs, f"{tool}.patterns.*.rc"))):
        case = base.rsplit(".", 1)[1]
        recs, summary = parse(base + ".log")
        for e in entries:
            for r in recs:
                if e.get("tool") == tool and e["repro_match"] and all(rx.search(r) for rx in e["repro_match"]):
                    proofs.setdefault(e["name"], r.splitlines()[0][:200])
        pairs = {}
        for r in recs:
            k = sites(r)
            pairs[k] = pairs.get(k, 0) + 1
        st = state(base)
        said = st if isinstance(st, str) else f"{summary} reports" if summary is not None else "no summary"
        out = base + ".out"
        lines = open(out, encoding="utf-8", errors="replace").read().splitlines() if os.path.exists(out) else []
        bad = [l.strip() for l in lines if l.strip() and not l.rstrip().endswith(("no error", ": ran"))]
        pattern_lines.append(f"{tool} {case}: {said}; by access sites: " +
                             ("; ".join(f"{k} x{v}" for k, v in sorted(pairs.items())) or "none") +
                             ("; program: " + " | ".join(bad[:4]) if bad else ""))
        for r in recs[:6]:
            pattern_lines.append("    " + "\n    ".join(r.splitlines()[:3]))

cells, notes, failed = {}, [], False
for tool in tools:
    for op in ops:
        bases = sorted({p.rsplit(".", 1)[0] for p in glob.glob(os.path.join(logs, f"{tool}.{op}.*.*"))})
        if not bases:
            continue
        errors, suppressed, bad, secs = 0, {}, [], 0
        for base in bases:
            case = base.rsplit(".", 1)[1]
            st = state(base)
            if isinstance(st, str):
                out = base + ".out"
                tail = [l.strip() for l in open(out, encoding="utf-8", errors="replace").read().splitlines()
                        if l.strip()][-1:] if os.path.exists(out) else []
                bad.append(f"{case}: {st}" + (f" (the test's output ends: {tail[0][:120]})" if tail else ""))
                continue
            _, rc, s = st
            secs += s
            recs, summary = parse(base + ".log")
            out = open(base + ".out", encoding="utf-8", errors="replace").read() if os.path.exists(base + ".out") else ""
            if summary is None:
                bad.append(f"{case}: no summary from the tool (rc {rc})")
            if "[  SKIPPED ]" in out:
                bad.append(f"{case}: the test skipped itself")
            elif "[  FAILED  ]" in out or "[  PASSED  ]" not in out:
                bad.append(f"{case}: the test failed under the tool (rc {rc})")
            unsup, here = [], 0
            for r in recs:
                name = covering(tool, op, r)
                if name:
                    suppressed[name] = suppressed.get(name, 0) + 1
                    here += 1
                else:
                    unsup.append(r)
            # What the tool counted but did not print counts as an error too.
            errors += max(len(unsup), (summary or 0) - here)
            for r in unsup[:2]:
                notes.append(f"--- {tool} / {op} / {case}:\n  " + "\n  ".join(l[:220] for l in r.splitlines()[:8]))
        cell = f"{errors} error" + ("" if errors == 1 else "s")
        if suppressed:
            cell += " (suppressed: " + ", ".join(f"{k} x{v}" for k, v in suppressed.items()) + ")"
        if bad:
            cell += " [" + "; ".join(bad) + "]"
        cells[(tool, op)] = cell + f", {secs} s"
        failed |= errors > 0 or bool(bad)

if notes:
    print("\n=== reports not suppressed (the first 2 of each run; every log is in " + logs + ")")
    print("\n".join(notes[:24]))
print("\n=== patterns (tests/sanitizer/sanitizer_patterns.cu)")
print("\n".join(pattern_lines) or "(not run)")
print("\n=== suppressions (scripts/sanitize.supp)")
for e in entries:
    if e["name"] in proofs:
        print(f"{e['name']} ({e.get('tool')}, {e.get('op')}): active, reproduced: {proofs[e['name']]}")
    else:
        print(f"{e['name']} ({e.get('tool')}, {e.get('op')}): inactive, its pattern drew no such report in this run")
print("\n=== compute-sanitizer: reports not covered by a suppression, per tool and op")
print("| tool | " + " | ".join(ops) + " |")
print("| --- | " + " | ".join("---" for _ in ops) + " |")
for tool in tools:
    print(f"| {tool} | " + " | ".join(cells.get((tool, op), "-") for op in ops) + " |")
print("sanitize: " + ("FAIL" if failed else "PASS"))
sys.exit(1 if failed else 0)
PYEOF
status=$?
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then tar -czf "$OUT/sanitize_logs.tar.gz" -C "$BUILD" sanitize 2>/dev/null || true; fi
exit $status
