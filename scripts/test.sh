#!/usr/bin/env bash
# Build everything and run the tests: the C++ CPU suite, the C++ GPU suite
# (without an SM90/SM100 GPU it skips and prints why) and the Python suite
# (its GPU tests skip likewise). Every CUDA source is compiled for sm_90a and
# sm_100a whenever nvcc is present, the benchmarks included, and ptxas's
# spill warnings are checked against scripts/known_spills.txt. A suite that
# cannot be built, or that finds no tests, fails the run.
#
#   scripts/test.sh                     # build in ./build and test
#   PYTHON=/path/to/python ...          # the Python to build and test with (default: python3)
#   BUILD=dir MUSE_DECODE_CUDA=OFF ...  # a CPU-only build (no CUDA toolkit needed)
#
# The Python extension's build needs nanobind and the suite needs pytest.
# When the chosen Python lacks them, they are installed (from PyPI, or where
# pip's own settings such as PIP_INDEX_URL or PIP_FIND_LINKS point) into a
# virtual environment of this script's own, $BUILD/venv, made from that
# Python, whose packages (PyTorch, say) stay importable there; the chosen
# Python itself is never installed into.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}
fail() { echo "test.sh: $*" >&2; exit 1; }

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

mkdir -p "$BUILD"
build_dir=$(cd "$BUILD" && pwd)
PY=$(command -v "$PY") || fail "no Python '${PYTHON:-python3}' on PATH (set PYTHON to one)"
has_deps() { "$1" -c "import nanobind, pytest" 2>/dev/null; }
if ! has_deps "$PY"; then
  venv=$build_dir/venv
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/made-from" 2>/dev/null)" = "$PY" ] && has_deps "$venv/bin/python"; then
    echo "test.sh: $PY lacks nanobind or pytest; using those in $venv (made by an earlier run)" >&2
  else
    echo "test.sh: $PY lacks nanobind or pytest; installing nanobind 3.1.0 and pytest into a virtual environment of" \
         "this build, $venv (not into $PY)" >&2
    rm -rf "$venv"
    "$PY" -m venv "$venv" ||
      fail "$PY could not make a virtual environment (Debian: apt-get install python3-venv), or set PYTHON to a Python that has nanobind and pytest"
    # The chosen Python's own packages, after the environment's (a .pth file
    # adds its site directories to the environment's path).
    "$PY" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
      > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/made-from.pth"
    "$venv/bin/python" -m pip install --progress-bar off "nanobind==3.1.0" pytest >&2 ||
      fail "pip could not install nanobind and pytest into $venv (above)"
    echo "$PY" > "$venv/made-from"
  fi
  PY=$venv/bin/python
fi

cuda_args=()
[ -n "${MUSE_DECODE_CUDA:-}" ] && cuda_args=(-DMUSE_DECODE_CUDA="$MUSE_DECODE_CUDA")
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_PYTHON=ON -DMUSE_DECODE_TESTS=ON \
  -DMUSE_DECODE_BENCHES=ON -DMUSE_DECODE_WARN_SPILLS=ON -DPython_EXECUTABLE="$PY" "${cuda_args[@]}" ||
  fail "CMake could not configure the build (above)"
# The C++ suites exist only where CMake found GoogleTest (ctest -N lists them).
tests=$(ctest --test-dir "$BUILD" -N)
grep -q 'Test *#[0-9]*: cpu$' <<<"$tests" ||
  fail "GoogleTest was not found, so the C++ suites cannot be built: install it (Debian: apt-get install libgtest-dev) or point CMake at it with -DGTest_ROOT=<prefix>"
# The build's output is kept for the spill check: ninja prints a compiler's
# warnings only for what it compiles, so a new spill shows where it appears.
cmake --build "$BUILD" 2>&1 | tee "$BUILD/build.log" || fail "the build failed: the compiler's error is above"
scripts/check_spills.sh "$BUILD/build.log" || fail "a kernel spills where it did not (above)"

# The C++ suites. --no-tests=error: an empty suite is a failure, not a pass.
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error || fail "the C++ tests failed (above)"
if [ -x "$BUILD/muse_decode_gpu_tests" ]; then
  # ctest marks a skipped suite "Skipped" without its reason; the suite's own
  # output (kept in ctest's log) says it.
  reason=$(grep -m1 -o 'needs an SM90 or SM100 GPU.*' "$BUILD/Testing/Temporary/LastTest.log" || true)
  [ -n "$reason" ] && echo "test.sh: the C++ GPU suite skipped itself: $reason"
else
  echo "test.sh: the C++ GPU suite is not built (no CUDA toolkit, or MUSE_DECODE_CUDA=OFF)"
fi

PYTHONPATH="$build_dir/python" "$PY" -m pytest -q -rs tests/python || fail "the Python tests failed (above)"
