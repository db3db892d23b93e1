"""Purlin from Python beside torch.distributed (NCCL) and torch symmetric memory, on the same
tensors, in purlin-bench's table format (benches/README.md: time(us) p99(us) algbw busbw
#wrong per backend; size as nccl-tests; busbw factors 2(n-1)/n for all-reduce, (n-1)/n for the
others). Eager calls on torch's current stream, timed with CUDA events over --iters calls per
run; a run's time is the max over ranks, `time` the median of --runs runs, `p99` their 99th
percentile.

    torchrun --nproc-per-node 2 crates/purlin-py/bench/bench.py [--out table.txt]

With one GPU shared by the ranks (PURLIN_SHARED_GPU=1) NCCL and symmetric memory cannot run
(they need a GPU per rank): Purlin runs alone, and the header says so; its timings there are
not NVLink figures.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist

import purlin_rs

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def busbw_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


def buffers(coll: str, size: int, world: int, rank: int, device, dtype):
    """(input, output, expected output) for a call of `size` bytes (nccl-tests' meaning)."""
    elems = size // torch.empty((), dtype=dtype).element_size()
    elems -= elems % world
    base = lambda r, n: (torch.arange(n, device=device) % 4 + 1 + r).to(dtype)  # noqa: E731
    if coll == "all_reduce":
        return base(rank, elems), torch.empty(elems, device=device, dtype=dtype), sum(
            base(r, elems).float() for r in range(world)
        )
    if coll == "all_gather":
        part = elems // world
        return base(rank, part), torch.empty(elems, device=device, dtype=dtype), torch.cat(
            [base(r, part).float() for r in range(world)]
        )
    if coll == "reduce_scatter":
        part = elems // world
        total = sum(base(r, elems).float() for r in range(world))
        return base(rank, elems), torch.empty(part, device=device, dtype=dtype), total[rank * part : (rank + 1) * part]
    part = elems // world
    return base(rank, elems), torch.empty(elems, device=device, dtype=dtype), torch.cat(
        [base(s, elems).float()[rank * part : (rank + 1) * part] for s in range(world)]
    )


def purlin_call(comm, coll):
    return {
        "all_reduce": lambda i, o: comm.all_reduce(i, output=o),
        "all_gather": lambda i, o: comm.all_gather_into_tensor(o, i),
        "reduce_scatter": lambda i, o: comm.reduce_scatter_tensor(o, i),
        "all_to_all": lambda i, o: comm.all_to_all_single(o, i),
    }[coll]


def nccl_call(group, coll):
    return {
        "all_reduce": lambda i, o: (o.copy_(i), dist.all_reduce(o, group=group)),
        "all_gather": lambda i, o: dist.all_gather_into_tensor(o, i, group=group),
        "reduce_scatter": lambda i, o: dist.reduce_scatter_tensor(o, i, group=group),
        "all_to_all": lambda i, o: dist.all_to_all_single(o, i, group=group),
    }[coll]


def symm_call(group, coll, size, device, dtype):
    """torch symmetric memory's all-reduce (two-shot) on a symmetric copy of the input."""
    if coll != "all_reduce":
        return None
    import torch.distributed._symmetric_memory as symm

    def call(i, o):
        buf = call.buf
        buf.copy_(i)
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group.group_name)
        o.copy_(buf)

    call.buf = symm.empty(size // torch.empty((), dtype=dtype).element_size(), device=device, dtype=dtype)
    symm.rendezvous(call.buf, group.group_name)
    return call


def measure(fn, i, o, iters: int, runs: int, gloo) -> list[float]:
    times = []
    for _ in range(runs):
        dist.barrier(group=gloo)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(i, o)
        end.record()
        end.synchronize()
        t = torch.tensor([start.elapsed_time(end) * 1000 / iters])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        times.append(t.item())
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    shared = os.environ.get("PURLIN_SHARED_GPU", "") not in ("", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", 0 if shared else int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    dist.init_process_group("cpu:gloo" if shared else "cpu:gloo,cuda:nccl")
    gloo = dist.new_group(backend="gloo")
    comm = purlin_rs.Comm.from_group(gloo)
    backends = ["purlin"] if shared else ["purlin", "nccl", "symm"]
    rows = wrong_total = 0
    lines = [
        f"# purlin_rs bench: world {world}, {torch.cuda.get_device_name(device)}, dtype {args.dtype}, "
        f"eager, {args.iters} calls x {args.runs} runs",
    ]
    if shared:
        lines.append("# one GPU shared by the ranks: Purlin alone (NCCL and symmetric memory need a GPU per rank); "
                     "timings are not NVLink figures")
    if not shared:
        lines.append("# nccl all_reduce: a copy into the output, then in place (torch has no out-of-place all_reduce); "
                     "symm: torch symmetric memory's two-shot all_reduce (other collectives: -)")
    for coll in COLLECTIVES:
        notes: set = set()
        lines.append("")
        lines.append(f"## {coll} {args.dtype} sum" if coll in ("all_reduce", "reduce_scatter") else f"## {coll} {args.dtype}")
        head = f"{'size':>10}"
        for b in backends:
            head += f" | {b + ' time(us)':>16} {'p99(us)':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        if "nccl" in backends:
            head += f" | {'speedup':>7}"
        lines.append(head)
        for size in SIZES:
            row = f"{size:>10}"
            med = {}
            for b in backends:
                i, o, expected = buffers(coll, size, world, rank, device, dtype)
                try:
                    fn = (
                        purlin_call(comm, coll)
                        if b == "purlin"
                        else nccl_call(dist.group.WORLD, coll)
                        if b == "nccl"
                        else symm_call(dist.group.WORLD, coll, i.numel() * i.element_size(), device, dtype)
                    )
                except Exception as e:  # a baseline this torch cannot run: an empty cell, and why
                    notes.add(f"# {b}: {type(e).__name__}: {e}")
                    fn = None
                if fn is None:
                    row += f" | {'-':>16} {'-':>9} {'-':>7} {'-':>7} {'-':>6}"
                    continue
                fn(i, o)  # warm up (plans, rendezvous)
                torch.cuda.synchronize()
                wrong = torch.tensor([int((o.float() != expected).sum().item())])
                dist.all_reduce(wrong, group=gloo)
                wrong_total += int(wrong.item())
                t = measure(fn, i, o, args.iters, args.runs, gloo)
                median = statistics.median(t)
                p99 = sorted(t)[min(len(t) - 1, int(0.99 * len(t)))]
                algbw = size / median / 1e3  # GB/s
                med[b] = median
                row += (
                    f" | {median:>16.2f} {p99:>9.2f} {algbw:>7.2f} {algbw * busbw_factor(coll, world):>7.2f}"
                    f" {int(wrong.item()):>6}"
                )
            if "nccl" in backends:
                row += f" | {med['nccl'] / med['purlin']:>7.2f}" if "nccl" in med and "purlin" in med else " |       -"
            lines.append(row)
            rows += 1
        lines.extend(sorted(notes))
    lines.append(f"BENCH {'ok' if wrong_total == 0 else 'FAILED'} rows={rows} wrong={wrong_total}")
    if rank == 0:
        text = "\n".join(lines)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    comm.close()
    dist.destroy_process_group()
    if wrong_total:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
