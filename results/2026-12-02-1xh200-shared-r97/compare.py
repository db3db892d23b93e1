# Round 97's table: per case, the call time with each PURLIN_REPEAT_STEPS mask less the time with
# mask 0 (mean of two repeats; the difference between repeats in parentheses). Run in this folder.
import csv


def load(p):
    d = {}
    for r in csv.DictReader(open(p)):
        d[(r['collective'], r['mode'], int(r['bytes']))] = (float(r['time_us']), r['wrong'])
    return d


for pre, masks in (('oc', [0, 1, 64, 128, 8, 16]), ('st', [0, 4, 64, 128])):
    D = {m: [load(f'{pre}-m{m}-{i}/results.csv') for i in (1, 2)] for m in masks}
    print(pre, "masks", masks, "(time rep1/rep2; delta vs mask 0 mean)")
    for k in sorted(D[0][0]):
        base = sum(D[0][i][k][0] for i in (0, 1)) / 2
        s = f"{k[0]:15s} {k[1]:5s} {k[2]:8d} base {D[0][0][k][0]:6.2f}/{D[0][1][k][0]:6.2f}"
        for m in masks[1:]:
            v = [D[m][i][k][0] for i in (0, 1)]
            w = [D[m][i][k][1] for i in (0, 1)]
            s += f" | m{m}: {sum(v)/2-base:+.2f} ({v[0]-v[1]:+.2f}){'' if w == ['0', '0'] else ' WRONG' + str(w)}"
        print(s)
