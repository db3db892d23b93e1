#!/usr/bin/env bash
# fp8 on the GPU Comm: device_collectives' sweep (fp8 included) and purlin-only benches, one GPU shared by two ranks.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${1:-$OUT}
W=$(mktemp -d); L=$W/fp8; mkdir -p "$L"
export NCCL_NVLS_ENABLE=0 PURLIN_KERNEL_CACHE=$HERE/kernel-cache PURLIN_SHARED_GPU=1 RUST_BACKTRACE=1
date -u +%FT%TZ >"$L/date.txt"
timeout 300 "$HERE/bin/device_collectives-test" --ignored --test-threads=1 --nocapture every_collective_matches >"$L/device_collectives.log" 2>&1
echo "device_collectives every_collective_matches rc=$? $(grep -E '^test result' "$L/device_collectives.log")" >>"$L/summary.txt"
for d in e4m3 e5m2 bf16; do
  timeout 150 "$HERE/purlin-bench" --backends purlin --world 2 --no-probe --dtype $d --collective all-reduce,reduce-scatter,all-gather --min 8 --max 16M --factor 8 --budget 0.1 --out "$L/bench-$d" >"$L/bench-$d.log" 2>&1
  echo "bench $d rc=$?" >>"$L/summary.txt"
done
find "$L" -name '*.png' -delete
tar czf "$OUTDIR/fp8-round.tar.gz" -C "$W" fp8
grep -E '^EXEC' "$L/device_collectives.log" | tail -8
cat "$L/summary.txt"
