#!/usr/bin/env python3
"""Attributes ncu's per-instruction samples of one profiled kernel to source lines.

usage: attribute.py LISTING FUNCTION SASS_CSV KERNEL_INDEX [TOP]

LISTING: `nvdisasm -c --print-line-info` of the same kernel compiled with -lineinfo
(same instruction count; the script prints how many instructions match by text).
SASS_CSV: `ncu --import R --page source --print-source sass --csv`; KERNEL_INDEX picks one
of the profiled kernels in it (0-based). Prints samples (and stall reasons, where the
report has them) per innermost source line, and per stall reason over the kernel.
"""
import collections
import csv
import re
import sys


def listing(path, fn):
    ins, inside, loc = [], False, "?"
    for line in open(path):
        if line.startswith(".text."):
            inside = line.strip() == f".text.{fn}:"
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            loc = f'{m.group(1).split("/")[-1]}:{m.group(2)}'
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((m.group(2), loc))
    return ins


def kernels(path):
    out, cur, hdr = [], None, None
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            cur = {"rows": []}
            out.append(cur)
        elif r and r[0] == "Address":
            cur["hdr"] = r
        elif cur is not None and r:
            cur["rows"].append(r)
    return out


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    lst, fn, path, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 30
    ins = listing(lst, fn)
    kern = kernels(path)[k]
    hdr, rows = kern["hdr"], kern["rows"]
    ix = {h: i for i, h in enumerate(hdr)}
    col = ix.get("Warp Stall Sampling (All Samples)", 2)
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    norm = lambda s: re.sub(r"0x[0-9a-f]{8,}|`\([^)]*\)", "X", s).replace(" ", "")
    same = sum(1 for a, r in zip(ins, rows) if norm(a[0]) == norm(r[1]))
    print(f"instructions: listing {len(ins)}, profiled {len(rows)}, same text {same}")
    total = sum(num(r[col]) for r in rows)
    print(f"samples {total:.0f}")
    if stalls:
        by_reason = collections.Counter()
        for r in rows:
            for h in stalls:
                by_reason[h[6:]] += num(r[ix[h]])
        print("  " + " ".join(f"{h} {100 * v / total:.1f}%" for h, v in by_reason.most_common(10) if v))
    by_line, reasons = collections.Counter(), collections.defaultdict(collections.Counter)
    for (text, loc), r in zip(ins, rows):
        by_line[loc] += num(r[col])
        for h in stalls:
            reasons[loc][h[6:]] += num(r[ix[h]])
    for loc, v in by_line.most_common(top):
        why = " ".join(f"{h}={n:.0f}" for h, n in reasons[loc].most_common(3) if n)
        print(f"  {v:7.0f} {100 * v / total:5.1f}%  {loc:40s} {why}")


main()
