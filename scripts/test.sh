#!/usr/bin/env bash
# Build and run the tests: the C++ CPU suite, the C++ GPU suite (it skips
# itself, and says why, on a machine without an SM90/SM100 GPU) and the Python
# suite (its GPU tests skip likewise). Every CUDA source is compiled for
# sm_90a and sm_100a whenever nvcc is present.
#
#   scripts/test.sh                     # build in ./build and test
#   BUILD=dir MUSE_DECODE_CUDA=OFF ...  # a CPU-only build (no CUDA toolkit needed)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The Python extension's build needs nanobind; the suite needs pytest.
if ! $PY -c "import nanobind, pytest" 2>/dev/null; then
  $PY -m pip install -q "nanobind==3.1.0" pytest
fi

cuda_args=()
[ -n "${MUSE_DECODE_CUDA:-}" ] && cuda_args=(-DMUSE_DECODE_CUDA="$MUSE_DECODE_CUDA")
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUSE_DECODE_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v "$PY")" "${cuda_args[@]}"
cmake --build "$BUILD"
ctest --test-dir "$BUILD" --output-on-failure
PYTHONPATH="$PWD/$BUILD/python" $PY -m pytest -q -rs tests/python
