#!/usr/bin/env bash
# One GPU round (made by `cargo xtask gpu-round`): the ignored GPU tests, then the
# calibration. Packs every log into round.tar.gz in the output directory ($1, else $OUT,
# else ./gpu-round-out) and prints a short summary last. PURLIN_DEADLINE_S: start nothing new
# after that many seconds, so the archive is written inside the device tool's call limit.
set -u
DEADLINE=${PURLIN_DEADLINE_S:-100000}
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${1:-${OUT:-$PWD/gpu-round-out}}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
LOGS=$WORK/round
export LOGS  # commands may write result files under $LOGS: they travel in round.tar.gz
mkdir -p "$LOGS"
# Never NVLink multicast on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PURLIN_KERNEL_CACHE=$HERE/kernel-cache RUST_BACKTRACE=1
date -u +%FT%TZ >"$LOGS/date.txt"
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >"$LOGS/topo.txt" 2>&1
: >"$LOGS/tests.txt"
# PURLIN_SANITIZE=memcheck (or racecheck, synccheck, initcheck): every test executable runs
# under compute-sanitizer with that tool, and its summary line goes into tests.txt. A memcheck
# run starts with its negative control: a kernel loaded like the runtime's writes where no
# allocation is, and memcheck must report it (else its "0 errors" would prove nothing).
SANITIZE=${PURLIN_SANITIZE:-}
SANITIZER=()
if [ -n "$SANITIZE" ]; then
  SANITIZER=(compute-sanitizer --tool "$SANITIZE" --print-limit 20)
  if [ "$SANITIZE" = memcheck ]; then
    (cd "$HERE" && timeout 120 "${SANITIZER[@]}" ./smoke --sanitizer-control) >"$LOGS/sanitizer-control.log" 2>&1
    seen=$(grep -c 'Invalid __global__ write' "$LOGS/sanitizer-control.log")
    echo "SANITIZE control: memcheck reported $seen invalid global writes of the planted out-of-bounds fill (must be > 0)" >>"$LOGS/tests.txt"
  else
    echo "SANITIZE $SANITIZE: no negative control for this tool" >>"$LOGS/tests.txt"
  fi
fi
for t in "$HERE"/bin/*; do
  name=$(basename "$t")
  # PURLIN_TESTS: a regex of test executables to run (default: all).
  [[ "$name" =~ ${PURLIN_TESTS:-.} ]] || continue
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "$name skipped (deadline)" >>"$LOGS/tests.txt"; continue; fi
  timeout 420 ${SANITIZER[@]+"${SANITIZER[@]}"} "$t" --ignored --test-threads=1 --nocapture >"$LOGS/$name.log" 2>&1
  rc=$?
  result=$(grep -E '^test result:' "$LOGS/$name.log" | tail -1)
  if [ -n "$SANITIZE" ]; then
    result="$result; $SANITIZE: $(grep -E '^========= [A-Z]+ SUMMARY' "$LOGS/$name.log" | tail -1 | sed 's/^========= //')"
  fi
  echo "$name rc=$rc ${result:-no test result}" >>"$LOGS/tests.txt"
done
# commands.txt: one program run per line, from the round's folder (benchmarks, torchrun).
n=0
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  n=$((n + 1))
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "cmd-$n skipped (deadline) $line" >>"$LOGS/tests.txt"; continue; fi
  (cd "$HERE" && timeout 300 bash -c "$line") >"$LOGS/cmd-$n.log" 2>&1
  echo "cmd-$n rc=$? $line" >>"$LOGS/tests.txt"
done <"$HERE/commands.txt"
if [ -d "$HERE/calibration" ] && [ "${PURLIN_SKIP_CALIBRATION:-0}" != 1 ] && [ "$SECONDS" -lt "$DEADLINE" ]; then
  timeout 420 bash "$HERE/calibration/run.sh" >"$LOGS/calibration.log" 2>&1
  echo "calibration rc=$?" >>"$LOGS/tests.txt"
fi
tar czf "$OUTDIR/round.tar.gz" -C "$WORK" round
echo "==== summary ($(cat "$LOGS/date.txt"), $(nvidia-smi -L | wc -l) GPUs)"
grep -hE '^(LANES|GATE|FLOOR-SUMMARY)' "$LOGS"/*.log | cut -c1-260 | head -24
grep -hE '^(SMOKE|PACKETS|ROUND|ATOM-SUMMARY|COMM|COMM_CHECK|DROPIN|EXEC|BENCH|SANITIZER-CONTROL)[ :]' "$LOGS"/*.log | grep -v '^EXEC conformance: ok' | cut -c1-200 | head -60
grep -hE 'round trip|copy engine|bidirectional|^nccl_[a-z_]+ (1024|1073741824) ' "$LOGS/calibration.log" 2>/dev/null | head -24
cat "$LOGS/tests.txt"
