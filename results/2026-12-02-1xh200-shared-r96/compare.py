import csv,sys
def load(p):
    d={}
    for r in csv.DictReader(open(p)):
        d[(r['collective'],r['mode'],int(r['bytes']))]=float(r['time_us'])
    return d
for name in ('floor-oc32','default'):
    A=[load(f'{name}-a-{i}/results.csv') for i in (1,2)]; M=[load(f'{name}-main-{i}/results.csv') for i in (1,2)]
    print(name, ": new rep1/rep2 | main rep1/rep2 | delta mean")
    for k in sorted(A[0]):
        a=[x[k] for x in A]; m=[x[k] for x in M]
        print(f"{k[0]:15s} {k[1]:5s} {k[2]:8d}  {a[0]:6.2f}/{a[1]:6.2f} | {m[0]:6.2f}/{m[1]:6.2f} | {sum(a)/2-sum(m)/2:+.2f}")
a=load('staged-a/results.csv'); m=load('staged-main/results.csv')
print('staged')
for k in sorted(a):
    print(f"{k[0]:15s} {k[1]:5s} {k[2]:8d}  {a[k]:6.2f} | {m[k]:6.2f} | {a[k]-m[k]:+.2f}")
