"""Compares an A/B round's variants with its baseline (the first line of variants.txt).

usage: python3 compare.py LOGS_DIR  (the folder run.sh packed; holds variants.txt, sweeps.txt
and one purlin-bench output folder per sweep, variant and repeat: SWEEP-VARIANT-REP/).
Writes compare.txt there (every row: each repeat's median time, the mean delta against the
baseline in microseconds) and prints a summary per sweep and candidate: how many rows got
faster or slower by more than 0.1 us, and the range of the deltas. Wrong results are flagged.
"""
import csv
import os
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok":
                continue
            key = (r["collective"], r["dtype"], r["mode"], int(r["bytes"]))
            rows[key] = (float(r["time_us"]), int(r["wrong"] or 0))
    return rows


def main(logs):
    variants = [l.split()[0] for l in open(os.path.join(logs, "variants.txt")) if l.strip() and not l.startswith("#")]
    sweeps = [l.split("|")[0] for l in open(os.path.join(logs, "sweeps.txt")) if l.strip() and not l.startswith("#")]
    base, candidates = variants[0], variants[1:]
    detail, summary = [], []
    for sweep in sweeps:
        runs = {}
        for v in variants:
            reps = []
            rep = 1
            while os.path.exists(os.path.join(logs, f"{sweep}-{v}-{rep}", "results.csv")):
                reps.append(load(os.path.join(logs, f"{sweep}-{v}-{rep}", "results.csv")))
                rep += 1
            runs[v] = reps
        if not runs[base]:
            summary.append(f"{sweep}: no baseline results")
            continue
        for c in candidates:
            if not runs[c]:
                summary.append(f"{sweep} {c}: no results")
                continue
            detail.append(f"{sweep}: {c} reps | {base} reps | delta of means (us)")
            deltas, wrong = [], 0
            for key in sorted(set.intersection(*(set(r) for r in runs[c] + runs[base]))):
                new = [r[key][0] for r in runs[c]]
                old = [r[key][0] for r in runs[base]]
                bad = sum(r[key][1] for r in runs[c] + runs[base])
                wrong += bad
                delta = sum(new) / len(new) - sum(old) / len(old)
                deltas.append(delta)
                fmt = lambda xs: "/".join(f"{x:7.2f}" for x in xs)
                detail.append(
                    f"{key[0]:15s} {key[1]:5s} {key[2]:5s} {key[3]:10d}  {fmt(new)} | {fmt(old)} | {delta:+.2f}"
                    + (" WRONG" if bad else "")
                )
            if deltas:
                faster = sum(d < -0.1 for d in deltas)
                slower = sum(d > 0.1 for d in deltas)
                summary.append(
                    f"{sweep:12s} {c}: {len(deltas)} rows, {faster} faster / {slower} slower by > 0.1 us, "
                    f"delta {min(deltas):+.2f} .. {max(deltas):+.2f} us"
                    + (f", {wrong} WRONG" if wrong else "")
                )
    with open(os.path.join(logs, "compare.txt"), "w") as f:
        f.write("\n".join(detail) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
