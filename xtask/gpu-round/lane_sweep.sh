#!/usr/bin/env bash
# The throughput regime's lane count, measured: 256 MiB AllGather and AllReduce (eager, purlin
# only) for each lane count, twice, interleaved; prints one LANES line per run and writes the
# count with the best summed busbw (sum of both collectives' medians) to $1.
# Usage (from a GPU round's folder): bash lane_sweep.sh OUT_FILE [LANES...]
set -u
out=$1; shift
lanes=${*:-1 2 4 16}
for rep in 1 2; do
  for n in $lanes; do
    dir=$LOGS/lanes-$n-$rep
    PURLIN_LANES=$n ./purlin-bench --collective all-gather,all-reduce --min 256M --max 256M --mode eager \
      --backends purlin --budget 0.2 --no-probe --out "$dir" >"$dir.log" 2>&1
    awk -F, -v n="$n" -v rep="$rep" 'NR > 1 && $8 == "purlin" { printf "LANES %s rep %s %s %s busbw %s wrong %s\n", n, rep, $1, $6, $13, $14 }' "$dir/results.csv"
  done
done | tee "$LOGS/lanes.txt"
awk '$1 == "LANES" { s[$2] += $8; c[$2]++ } END { best = ""; for (n in s) if (best == "" || s[n] / c[n] > s[best] / c[best]) best = n; print best }' "$LOGS/lanes.txt" >"$out"
echo "LANES best $(cat "$out")"
