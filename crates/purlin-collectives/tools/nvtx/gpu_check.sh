#!/bin/bash
# Issue 52 on the GPU machine: the NVTX feature seen by a real profiler and by the probe
# injection, and the GPU flight recorder's hang report. Build here (no GPU needed), from the
# repository root:
#
#   cargo build -p purlin-collectives --features nvtx --example quickstart
#   cargo test -p purlin-collectives --features nvtx --test gpu_flight_recorder --no-run
#   D=target/nvtx-check; mkdir -p $D
#   cp target/debug/examples/quickstart $D/
#   cp $(ls -t target/debug/deps/gpu_flight_recorder-* | grep -v '\.d$' | head -1) $D/gpu_flight_recorder
#   cp crates/purlin-collectives/tools/nvtx/{probe_injection.c,gpu_check.sh} $D/; strip $D/quickstart $D/gpu_flight_recorder
#   # optional, saves compiling there: a kernel cache for sm_90 in $D/kernel-cache
#
# There (one GPU; both ranks share it): bash $D/gpu_check.sh [OUTDIR]
set -u
D=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-/tmp/nvtx-check}}
mkdir -p "$OUT"
export PURLIN_SHARED_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d "$D/kernel-cache" ] && export PURLIN_KERNEL_CACHE=$D/kernel-cache
nvidia-smi -L
echo "== 1. the GPU flight recorder: rank 1 stops, rank 0's error names it one call behind"
PURLIN_LOG=purlin=info "$D/gpu_flight_recorder" --ignored --nocapture 2>&1 | tee "$OUT/flight.log" | tail -30
echo "== 2. the probe injection: every call pushes Purlin/purlin::<collective> with its bytes"
cc -shared -fPIC -o "$OUT/probe.so" "$D/probe_injection.c"
NVTX_INJECTION64_PATH=$OUT/probe.so "$D/quickstart" 2>&1 | tee "$OUT/probe-host.log" | grep NVTX-PROBE | sort | uniq -c
NVTX_INJECTION64_PATH=$OUT/probe.so "$D/gpu_flight_recorder" --ignored 2>&1 | grep NVTX-PROBE | sort | uniq -c
echo "== 3. Nsight Compute: the NVTX range open at a Purlin kernel's launch"
# ncu serialises kernels, so this rank's kernel waits out the device timeout for its peer's
# (the test then fails; what counts here is the range ncu prints for the kernel).
timeout 300 ncu --nvtx --launch-count 1 -k regex:purlin_snac --section LaunchStats \
    "$D/gpu_flight_recorder" --ignored 2>&1 | tee "$OUT/ncu.log" | grep -i -B2 -A6 "nvtx" | head -40
echo "== 4. Nsight Systems, where installed"
if command -v nsys >/dev/null; then
    PURLIN_LOG=purlin=debug nsys profile --trace=cuda,nvtx -o "$OUT/purlin" --force-overwrite true \
        "$D/gpu_flight_recorder" --ignored >"$OUT/nsys.log" 2>&1
    nsys stats --report nvtx_sum "$OUT/purlin.nsys-rep" 2>&1 | tee "$OUT/nvtx_sum.txt" | head -20
else
    echo "nsys is not on the PATH"
fi
