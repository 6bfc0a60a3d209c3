# Shared set-up of the one-call device scripts (bench/<op>_device.sh), sourced
# as `. bench/device_env.sh <op> [OUT_DIR]` from the repository root: paths,
# the compiler flags both scripts build with, and a timestamp helper.
#   R     the repository root          OUT   where results go (arg, $OUT, /tmp/<op>_out)
#   B     the build folder /tmp/<op>_build
#   G, L  Debian's GoogleTest carried in .deps (headers, static libraries)
#   CXXF  g++ flags; NVF nvcc flags (sm_90a, line info)
set -o pipefail
R=$(pwd)
OUT=${2:-${OUT:-/tmp/$1_out}}
B=/tmp/$1_build
mkdir -p "$B" "$OUT"
G=$R/.deps/gtest/usr
L=$G/lib/x86_64-linux-gnu
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXXF="-std=c++17 -O3 -I$R/include -I$G/include -I$CUDA_HOME/include -DMUSE_DECODE_WITH_CUDA -ffp-contract=off"
NVF="-std=c++17 -O3 -I$R/include -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr -DMUSE_DECODE_WITH_CUDA"
t0=$(date +%s)
stamp() { echo "# [$(( $(date +%s) - t0 )) s] $*"; }
