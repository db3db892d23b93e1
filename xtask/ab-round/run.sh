#!/usr/bin/env bash
# An A/B round (made by `cargo xtask ab-round`): every sweep of sweeps.txt for every variant
# of variants.txt (the first is the baseline), interleaved, PURLIN_AB_REPS times (else the
# round's `reps` file, else 2); then each
# candidate's GPU tests. Packs logs and results into ab-round.tar.gz in the output directory
# ($1, else $OUT, else ./ab-round-out) and prints the comparison's summary last.
# PURLIN_DEADLINE_S (default 540): start nothing new after that many seconds.
set -u
DEADLINE=${PURLIN_DEADLINE_S:-540}
HERE=$(cd "$(dirname "$0")" && pwd)
REPS=${PURLIN_AB_REPS:-$(cat "$HERE/reps" 2>/dev/null || echo 2)}
OUTDIR=${1:-${OUT:-$PWD/ab-round-out}}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
LOGS=$WORK/ab
mkdir -p "$LOGS"
# Never NVLink multicast on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$HERE/kernel-cache"
tar xzf "$HERE/kernels.tgz" -C "$HERE/kernel-cache"
export PURLIN_KERNEL_CACHE=$HERE/kernel-cache RUST_BACKTRACE=1
date -u +%FT%TZ >"$LOGS/date.txt"
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
WORLD=()
if [ "$GPUS" -lt 2 ]; then
  # One GPU: both ranks drive it (README, "Tests that need a GPU"); no NVLink figure.
  export PURLIN_SHARED_GPU=1
  WORLD=(--world 2)
fi
cp "$HERE/variants.txt" "$HERE/sweeps.txt" "$LOGS/"
mapfile -t VARIANTS < <(awk '!/^#/ && NF { print $1 }' "$HERE/variants.txt")
: >"$LOGS/runs.txt"
: >"$LOGS/tests.txt"
while IFS='|' read -r sweep environment args; do
  case "$sweep" in ''|'#'*) continue ;; esac
  for rep in $(seq 1 "$REPS"); do
    for v in "${VARIANTS[@]}"; do
      out="$LOGS/$sweep-$v-$rep"
      if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "$sweep $v $rep skipped (deadline)" >>"$LOGS/runs.txt"; continue; fi
      start=$SECONDS
      # shellcheck disable=SC2086 # the sweep's environment and arguments are word lists
      (cd "$HERE" && timeout 300 env $environment "./purlin-bench-$v" $args --backends purlin ${WORLD[@]+"${WORLD[@]}"} \
        --no-probe --out "$out") >"$out.log" 2>&1
      echo "$sweep $v $rep rc=$? $((SECONDS - start)) s" >>"$LOGS/runs.txt"
    done
  done
done <"$HERE/sweeps.txt"
for v in "${VARIANTS[@]}"; do
  [ -d "$HERE/bin/$v" ] || continue
  for t in "$HERE/bin/$v"/*; do
    name="$v-$(basename "$t")"
    if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "$name skipped (deadline)" >>"$LOGS/tests.txt"; continue; fi
    start=$SECONDS
    timeout 420 "$t" --ignored --test-threads=1 >"$LOGS/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $((SECONDS - start)) s $(grep -E '^test result:' "$LOGS/$name.log" | tail -1)" >>"$LOGS/tests.txt"
  done
done
python3 "$HERE/compare.py" "$LOGS" >"$LOGS/summary.txt" 2>&1
tar czf "$OUTDIR/ab-round.tar.gz" -C "$WORK" ab
echo "==== A/B round $(cat "$LOGS/date.txt"), $GPUS GPU(s), ${SECONDS} s, variants: ${VARIANTS[*]}"
grep -v ' rc=0 ' "$LOGS/runs.txt" | head -20
cat "$LOGS/tests.txt"
cat "$LOGS/summary.txt"
