#!/usr/bin/env bash
# Build the command-line tool and run the main job: the Muse Spark verify
# step's kernels on this GPU, checked against the reference and timed (or,
# without a supported GPU, the CPU reference path). Arguments go to the tool:
#   scripts/run.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The build's output only when it fails (the tool's table is the output).
mkdir -p "$BUILD"
log="$BUILD/run-build.log"
echo "run.sh: building muse-decode in $BUILD" >&2
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" --target muse-decode; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  echo "run.sh: the build failed (its log: $log)" >&2
  exit 1
fi
exec "$BUILD/muse-decode" "$@"
