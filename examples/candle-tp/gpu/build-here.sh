#!/usr/bin/env bash
# Builds the example's GPU variant on a machine with no GPU and no CUDA (the dev machine),
# for the GPU machine (CUDA 13.0, sm_90, no Rust). candle's CUDA kernels need nvcc: the
# pinned CUDA 13.0.88 wheels from PyPI provide it; the CUDA libraries candle links
# (cudarc's `dynamic-linking`) are link-time stubs made from cudarc's bindings (stubs.py),
# bound to the real libraries on the GPU machine.
#
# Output: target/candle-cuda/carry/purlin-candle-tp (carry it with run.sh, see docs/candle.md).
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
work=$root/target/candle-cuda
cuda=$work/nvcc/nvidia/cu13
if [ ! -x "$cuda/bin/nvcc" ] || [ ! -x "$cuda/nvvm/bin/cicc" ]; then
    rm -rf "$work/nvcc"
    # One pip call: pip --target does not merge a second install into an existing nvidia/.
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$work/nvcc" \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
fi
cudarc_src=$(cargo metadata --format-version 1 --manifest-path "$root/examples/candle-tp/Cargo.toml" \
    | python3 -c 'import json,sys,os; p=[x for x in json.load(sys.stdin)["packages"] if x["name"]=="cudarc"][0]; print(os.path.dirname(p["manifest_path"]))')
python3 "$root/examples/candle-tp/gpu/stubs.py" "$cudarc_src/src" "$work/stubs"
# candle-kernels links the CUDA runtime too: the wheel's real one.
ln -sf "$cuda/lib/libcudart.so.13" "$work/stubs/libcudart.so"
# H100 / H200: sm_90 (no nvidia-smi here to ask).
CUDA_HOME=$cuda CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} PATH="$cuda/bin:$PATH" \
    RUSTFLAGS="-L native=$work/stubs" \
    cargo build --release --locked --features cuda \
    --manifest-path "$root/examples/candle-tp/Cargo.toml" --target-dir "$work/target"
mkdir -p "$work/carry"
cp "$work/target/release/purlin-candle-tp" "$work/carry/"
strip "$work/carry/purlin-candle-tp"
ls -l "$work/carry/purlin-candle-tp"
