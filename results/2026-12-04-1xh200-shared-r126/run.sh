#!/usr/bin/env bash
# e4m3 hardware decode (dec) against main (hardware pack): atom_gpu and device_collectives on dec, then fp8 benches interleaved.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${1:-$OUT}
W=$(mktemp -d); L=$W/fp8ab2; mkdir -p "$L"
export NCCL_NVLS_ENABLE=0 PURLIN_SHARED_GPU=1 RUST_BACKTRACE=1
date -u +%FT%TZ >"$L/date.txt"
export PURLIN_KERNEL_CACHE=$HERE/dec/kernel-cache
timeout 240 "$HERE/dec/bin/atom_gpu-test" --ignored --test-threads=1 --nocapture >"$L/atom_gpu.log" 2>&1
echo "dec atom_gpu rc=$? $(grep -E '^test result' "$L/atom_gpu.log")" >>"$L/summary.txt"
timeout 240 "$HERE/dec/bin/device_collectives-test" --ignored --test-threads=1 --nocapture every_collective_matches >"$L/device_collectives.log" 2>&1
echo "dec device_collectives rc=$? $(grep -E '^test result' "$L/device_collectives.log") $(grep 'EXEC total' "$L/device_collectives.log")" >>"$L/summary.txt"
for rep in 1 2; do
  for v in main dec; do
    export PURLIN_KERNEL_CACHE=$HERE/$v/kernel-cache
    for d in e4m3 e5m2; do
      timeout 150 "$HERE/$v/purlin-bench" --backends purlin --world 2 --no-probe --dtype $d --collective all-reduce,reduce-scatter --min 8 --max 16M --factor 8 --budget 0.1 --out "$L/bench-$d-$v-$rep" >"$L/bench-$d-$v-$rep.log" 2>&1
      echo "bench $d $v rep $rep rc=$? $(grep -E '^BENCH' "$L/bench-$d-$v-$rep.log")" >>"$L/summary.txt"
    done
  done
done
find "$L" -name '*.png' -delete
tar czf "$OUTDIR/fp8ab2.tar.gz" -C "$W" fp8ab2
grep -E 'ATOM-SUMMARY|^test ' "$L/atom_gpu.log" | head -12
cat "$L/summary.txt"
