#!/usr/bin/env bash
# The binding's GPU checks, on the GPU machine (no network, no Rust): installs the carried
# wheel, then under torchrun with two processes (one GPU shared unless PURLIN_SHARED_GPU=0 and
# two GPUs): the GPU pytest, the quickstart and the Python benchmark.
#   crates/purlin-py/tests/gpu/run.sh <wheel> <out-dir>
set -uo pipefail
wheel=${1:?usage: run.sh <purlin_rs wheel> <out-dir>}
out=${2:?usage: run.sh <purlin_rs wheel> <out-dir>}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "${PURLIN_SHARED_GPU:-}" = "" ] && [ "$gpus" -lt 2 ]; then export PURLIN_SHARED_GPU=1; fi
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
echo "gpus=$gpus PURLIN_SHARED_GPU=${PURLIN_SHARED_GPU:-0} wheel=$(basename "$wheel")" | tee "$out/summary.txt"
launch() { python3 -m torch.distributed.run --nproc-per-node 2 "$@"; }
status=0
launch -m pytest -q -p no:cacheprovider "$here/test_gpu.py" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}; echo "pytest rc=$rc" | tee -a "$out/summary.txt"; [ "$rc" = 0 ] || status=1
launch "$repo/examples/quickstart.py" 2>&1 | tee "$out/quickstart.log"
rc=${PIPESTATUS[0]}; echo "quickstart rc=$rc" | tee -a "$out/summary.txt"; [ "$rc" = 0 ] || status=1
launch "$here/../../bench/bench.py" --out "$out/bench.txt" 2>&1 | tee "$out/bench.log"
rc=${PIPESTATUS[0]}; echo "bench rc=$rc" | tee -a "$out/summary.txt"; [ "$rc" = 0 ] || status=1
exit $status
