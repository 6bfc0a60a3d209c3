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
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target muse-decode >/dev/null
exec "$BUILD/muse-decode" "$@"
