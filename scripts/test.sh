#!/usr/bin/env bash
# Build everything and run the tests: the C++ CPU suite, the C++ GPU suite
# (without an SM90/SM100 GPU it skips and prints why) and the Python suite
# (its GPU tests skip likewise). Every CUDA source is compiled for sm_90a and
# sm_100a whenever nvcc is present. A suite that cannot be built, or that
# finds no tests, fails the run.
#
#   scripts/test.sh                     # build in ./build and test
#   BUILD=dir MUSE_DECODE_CUDA=OFF ...  # a CPU-only build (no CUDA toolkit needed)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}
fail() { echo "test.sh: $*" >&2; exit 1; }

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The Python extension's build needs nanobind; the suite needs pytest.
if ! $PY -c "import nanobind, pytest" 2>/dev/null; then
  $PY -m pip install -q "nanobind==3.1.0" pytest || fail "could not install nanobind and pytest with pip"
fi

cuda_args=()
[ -n "${MUSE_DECODE_CUDA:-}" ] && cuda_args=(-DMUSE_DECODE_CUDA="$MUSE_DECODE_CUDA")
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_PYTHON=ON -DMUSE_DECODE_TESTS=ON \
  -DPython_EXECUTABLE="$(command -v "$PY")" "${cuda_args[@]}" || fail "CMake could not configure the build (above)"
# The C++ suites exist only where CMake found GoogleTest (ctest -N lists them).
tests=$(ctest --test-dir "$BUILD" -N)
grep -q 'Test *#[0-9]*: cpu$' <<<"$tests" ||
  fail "GoogleTest was not found, so the C++ suites cannot be built: install it (Debian: apt-get install libgtest-dev) or point CMake at it with -DGTest_ROOT=<prefix>"
cmake --build "$BUILD" || fail "the build failed: the compiler's error is above"

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

PYTHONPATH="$PWD/$BUILD/python" $PY -m pytest -q -rs tests/python || fail "the Python tests failed (above)"
