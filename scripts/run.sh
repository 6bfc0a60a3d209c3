#!/usr/bin/env bash
# Build the command-line tool and run the main job: one Muse Spark layer's
# verify-step kernels on this GPU, checked against the CPU reference and timed
# beside the unfused path (or, without a supported GPU, the CPU reference on a
# small shape and the reason the GPU part did not run). Arguments go to the
# tool:   scripts/run.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The build's progress and any compiler error go to stderr; the tool's table
# is the only thing on stdout.
echo "run.sh: building muse-decode in $BUILD/" >&2
if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2; then
  echo "run.sh: CMake could not configure the build (above)" >&2
  exit 1
fi
if ! cmake --build "$BUILD" --target muse-decode >&2; then
  echo "run.sh: the build failed: the compiler's error is above" >&2
  exit 1
fi
exec "$BUILD/muse-decode" "$@"
