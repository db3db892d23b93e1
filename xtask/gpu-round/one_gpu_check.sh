#!/usr/bin/env bash
# A check on one GPU (both ranks on it, PURLIN_SHARED_GPU=1): send/recv and Broadcast/Reduce on Comm, the
# symmetric and in-place paths, and purlin-bench's broadcast, reduce and send-recv with its result checks.
# On the device: bash gpu-round/one_gpu_check.sh "$OUT" (packs one_gpu_check.tar.gz, prints a
# summary last).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${1:-$PWD/one-gpu-check-out}
L=$(mktemp -d)/one_gpu_check; mkdir -p "$L"
export NCCL_NVLS_ENABLE=0 PURLIN_KERNEL_CACHE=$HERE/kernel-cache RUST_BACKTRACE=1 PURLIN_SHARED_GPU=1
date -u +%FT%TZ > "$L/date.txt"; nvidia-smi -L > "$L/gpu.txt" 2>&1
T=$HERE/bin/gpu_collectives-test
for t in send_recv_and_groups_exchange_at_world_2 broadcast_and_reduce_from_every_root symmetric_buffers_take_one_copy_and_match_the_reference in_place_gathers_and_scatters_match_the_reference; do
  timeout 200 "$T" --ignored --exact "$t" --test-threads=1 --nocapture > "$L/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^test result:' "$L/$t.log" | tail -1) $(grep -E '^EXEC' "$L/$t.log" | tail -1)" >> "$L/summary.txt"
done
# --world 2: one GPU, both ranks on it (without it the bench sees world 1 and runs nothing).
B="$HERE/purlin-bench --backends purlin --world 2 --collective broadcast,reduce,send-recv --min 8 --max 64M --factor 8 --quick --no-probe"
for extra in "" "--in-place" "--symmetric"; do
  name=bench${extra:-plain}
  (cd "$HERE" && timeout 120 $B $extra --out "$L/$name") > "$L/$name.log" 2>&1
  rc=$?
  # Cells that ran and were checked: a sweep of skipped or unavailable rows also says BENCH ok.
  ok=$(grep -o '"status": *"ok"' "$L/$name/results.json" 2>/dev/null | wc -l)
  echo "$name rc=$rc ok_cells=$ok $(grep -E '^BENCH' "$L/$name.log" | tail -1)" >> "$L/summary.txt"
done
tar czf "$OUTDIR/one_gpu_check.tar.gz" -C "$(dirname "$L")" one_gpu_check
cat "$L/gpu.txt" "$L/summary.txt"
