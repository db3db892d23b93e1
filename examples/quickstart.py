"""Purlin from PyTorch, as the reference package's quickstart runs:

    pip install ./crates/purlin-py            # or the built wheel
    torchrun --nproc-per-node <num-of-gpus> examples/quickstart.py

(One GPU, two ranks: PURLIN_SHARED_GPU=1 torchrun --nproc-per-node 2 examples/quickstart.py.)
Written against the reference's functions (`initialize`, `all_reduce`, ..., `finalize`), with
only the import changed; `purlin_rs.Comm` is the same in torch.distributed's names.
"""

import os

import torch
import torch.distributed as dist

from purlin_rs import compat as purlin


def main() -> None:
    shared = os.environ.get("PURLIN_SHARED_GPU", "") not in ("", "0")
    device = torch.device("cuda", 0 if shared else int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")  # a CPU group: Purlin's ranks meet over it
    rank, world = dist.get_rank(), dist.get_world_size()
    stream = torch.cuda.current_stream()
    handle = purlin.initialize(dist.group.WORLD, device, None, stream.cuda_stream)

    n = 1 << 20
    x = torch.full((n,), rank + 1, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(x)
    purlin.all_reduce(x, out, handle, stream.cuda_stream, reduction_mode="sum")

    gathered = torch.empty(world * n, dtype=torch.bfloat16, device=device)
    purlin.all_gather(x, gathered, handle, stream.cuda_stream)

    part = torch.empty(n // world, dtype=torch.bfloat16, device=device)
    purlin.reduce_scatter(x, part, handle, stream.cuda_stream, reduction_mode="sum")

    a2a_in = torch.arange(world, dtype=torch.float32, device=device).repeat_interleave(64) + 10 * rank
    a2a_out = torch.empty_like(a2a_in)
    purlin.all_to_all(a2a_in, a2a_out, handle, stream.cuda_stream)

    torch.cuda.synchronize()
    total = world * (world + 1) // 2
    ok = (
        bool(torch.all(out == total))
        and all(bool(torch.all(gathered[r * n : (r + 1) * n] == r + 1)) for r in range(world))
        and bool(torch.all(part == total))
        and all(bool(torch.all(a2a_out[s * 64 : (s + 1) * 64] == 10 * s + rank)) for s in range(world))
    )
    print(f"rank {rank}/{world}: all_reduce={out[0].item():g} (expected {total}), all_gather, "
          f"reduce_scatter, all_to_all: {'ok' if ok else 'WRONG'}")
    purlin.finalize(handle)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
