#!/usr/bin/env bash
# Runs the example's GPU variant on the GPU machine: two ranks, each a thread with its own
# candle CUDA device and stream, Purlin's communicators made on those streams; with one GPU
# both ranks share it (PURLIN_SHARED_GPU=1, the default here). Built on the dev machine by
# build-here.sh; needs no Rust. Prints CANDLE_TP lines and exits 0 only if every rank's
# block is bit-exact against the rank-order reference and within the bound of the unsharded
# block.
#
# usage: examples/candle-tp/gpu/run.sh [BINARY] [WORLD]
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=${1:-target/candle-cuda/carry/purlin-candle-tp}
world=${2:-2}
# The libraries the binary names (libcuda.so.1, libnvrtc.so.13, libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10, libcudart.so.13): the CUDA 13.0 toolkit's, then the
# CUDA wheels beside torch.
libs=/usr/local/cuda/lib64
for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for d in "$site"/nvidia/*/lib; do
        [ -d "$d" ] && libs="$libs:$d"
    done
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PURLIN_SHARED_GPU=${PURLIN_SHARED_GPU:-1}
if ldd "$bin" | grep "not found"; then
    echo "run.sh: a library the binary needs is missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
"$bin" gpu "$world"
