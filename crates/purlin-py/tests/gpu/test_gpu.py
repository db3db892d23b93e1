"""The binding on GPUs, under torchrun with two processes (``run.sh``; one GPU shared with
``PURLIN_SHARED_GPU=1``): every collective against a reference computed here from every rank's
inputs, torch's current stream, symmetric tensors, a captured CUDA graph, torch.compile, the
``purlin`` backend with a DDP step, and the compatibility module.

Inputs are small integers (exact in every element type and summation order); outputs start
poisoned, so a collective that writes nothing fails."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import purlin_rs
import purlin_rs.backend  # noqa: F401  (registers "purlin")
from purlin_rs import compat, ops

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
SHARED = os.environ.get("PURLIN_SHARED_GPU", "") not in ("", "0")
DEVICE = torch.device("cuda", 0 if SHARED else int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(DEVICE)
POISON = 99

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float8_e4m3fn]
GATHER_ONLY = [torch.int64, torch.uint8, torch.float64]


def inputs(rank: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s inputs (1..=4, 1..=2 for fp8), on the CPU as float32."""
    top = 2 if dtype.is_floating_point and dtype.itemsize == 1 else 4
    i = torch.arange(n, dtype=torch.int64)
    return (1 + (rank * 7 + i * 3 + salt * 5 + (i * i) % 5) % top).to(torch.float32)


def on_gpu(x: torch.Tensor, dtype) -> torch.Tensor:
    return x.to(DEVICE).to(dtype)


def poison(n: int, dtype) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=torch.float32, device=DEVICE).to(dtype)


def same(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(got.float().cpu(), expected.float()), (got, expected)


@pytest.fixture(scope="module")
def comm():
    c = purlin_rs.Comm.from_env()
    yield c
    c.close()


@pytest.fixture(scope="module")
def world_group():
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:purlin")
    yield dist.group.WORLD


@pytest.fixture(scope="module")
def gloo_group(world_group):
    return dist.new_group(backend="gloo")


N = 1000


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_all_reduce(comm, dtype, in_place):
    x = on_gpu(inputs(RANK, N, dtype), dtype)
    expected = sum(inputs(r, N, dtype) for r in range(WORLD))
    if in_place:
        comm.all_reduce(x)
        same(x, expected)
    else:
        out = poison(N, dtype)
        comm.all_reduce(x, output=out)
        same(out, expected)


@pytest.mark.parametrize("dtype", DTYPES + GATHER_ONLY)
def test_all_gather_into_tensor(comm, dtype):
    x = on_gpu(inputs(RANK, N, dtype), dtype)
    out = poison(WORLD * N, dtype)
    comm.all_gather_into_tensor(out, x)
    same(out, torch.cat([inputs(r, N, dtype) for r in range(WORLD)]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_tensor(comm, dtype):
    x = on_gpu(inputs(RANK, WORLD * N, dtype), dtype)
    out = poison(N, dtype)
    comm.reduce_scatter_tensor(out, x)
    total = sum(inputs(r, WORLD * N, dtype) for r in range(WORLD))
    same(out, total[RANK * N : (RANK + 1) * N])


def test_all_to_all_single(comm):
    x = on_gpu(inputs(RANK, WORLD * N), torch.float32)
    out = poison(WORLD * N, torch.float32)
    comm.all_to_all_single(out, x)
    same(out, torch.cat([inputs(s, WORLD * N)[RANK * N : (RANK + 1) * N] for s in range(WORLD)]))


def test_all_to_all_single_with_splits(comm):
    m = [[(s * 2 + d * 3) % 5 * 100 for d in range(WORLD)] for s in range(WORLD)]
    x = on_gpu(inputs(RANK, sum(m[RANK])), torch.bfloat16)
    recv = [m[s][RANK] for s in range(WORLD)]
    out = poison(sum(recv), torch.bfloat16)
    comm.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=m[RANK])
    parts = []
    for s in range(WORLD):
        start = sum(m[s][:RANK])
        parts.append(inputs(s, sum(m[s]))[start : start + m[s][RANK]])
    same(out, torch.cat(parts))


def test_v_forms(comm):
    counts = [(r * 3 + 1) % 4 * 64 + 32 for r in range(WORLD)]
    x = on_gpu(inputs(RANK, counts[RANK]), torch.float16)
    out = poison(sum(counts), torch.float16)
    comm.all_gather_v(out, x, counts)
    same(out, torch.cat([inputs(r, counts[r]) for r in range(WORLD)]))

    y = on_gpu(inputs(RANK, sum(counts), salt=1), torch.float32)
    part = poison(counts[RANK], torch.float32)
    comm.reduce_scatter_v(part, y, counts)
    total = sum(inputs(r, sum(counts), salt=1) for r in range(WORLD))
    start = sum(counts[:RANK])
    same(part, total[start : start + counts[RANK]])


@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_and_reduce(comm, root):
    x = on_gpu(inputs(RANK, N), torch.float32)
    comm.broadcast(x, root)
    same(x, inputs(root, N))
    y = on_gpu(inputs(RANK, N, salt=2), torch.float32)
    comm.reduce(y, root, "max")
    if RANK == root:
        same(y, torch.stack([inputs(r, N, salt=2) for r in range(WORLD)]).amax(0))
    else:
        same(y, inputs(RANK, N, salt=2))


@pytest.mark.skipif(WORLD != 2, reason="send/recv runs at world 2")
def test_send_recv(comm):
    if RANK == 0:
        comm.send(on_gpu(inputs(0, N), torch.float32), 1)
    else:
        out = poison(N, torch.float32)
        comm.recv(out, 0)
        same(out, inputs(0, N))


def test_current_stream_orders_the_call(comm):
    side = torch.cuda.Stream(DEVICE)
    with torch.cuda.stream(side):
        # Produced, reduced and consumed on the side stream: ordered by it alone.
        x = torch.arange(N, device=DEVICE, dtype=torch.float32) + RANK
        torch.cuda._sleep(10_000_000)  # the kernel after it must wait for it
        comm.all_reduce(x)
        y = x * 2
    side.synchronize()
    base = torch.arange(N, dtype=torch.float32)
    same(y, 2 * sum(base + r for r in range(WORLD)))
    # Back on the default stream: ordered after the side stream's call.
    z = on_gpu(inputs(RANK, N), torch.float32)
    comm.all_reduce(z)
    same(z, sum(inputs(r, N) for r in range(WORLD)))


def test_symmetric_tensors(comm):
    a = comm.empty(WORLD * N, dtype=torch.bfloat16)
    assert a.shape == (WORLD * N,) and a.device == DEVICE and torch.all(a == 0)
    a.copy_(on_gpu(inputs(RANK, WORLD * N), torch.bfloat16))
    comm.all_reduce(a)
    same(a, sum(inputs(r, WORLD * N) for r in range(WORLD)))
    out = comm.empty(WORLD * N, dtype=torch.float32)
    comm.all_gather_into_tensor(out, on_gpu(inputs(RANK, N), torch.float32))
    same(out, torch.cat([inputs(r, N) for r in range(WORLD)]))


def test_cuda_graph(comm):
    x = on_gpu(inputs(RANK, N), torch.float32)
    # Warm up (the plan is made outside the capture), on a side stream as torch recommends.
    s = torch.cuda.Stream(DEVICE)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.all_reduce(x, comm)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.all_reduce(x, comm)
    for k in range(3):
        x.copy_(on_gpu(inputs(RANK, N, salt=k), torch.float32))
        g.replay()
        same(y, sum(inputs(r, N, salt=k) for r in range(WORLD)))


def test_torch_compile(comm):
    h = ops.handle(comm)

    def step(a):
        return torch.ops.purlin.all_reduce(a * 2, h, "sum") + 1

    compiled = torch.compile(step, fullgraph=True)
    x = on_gpu(inputs(RANK, N), torch.float32)
    same(compiled(x), 2 * sum(inputs(r, N) for r in range(WORLD)) + 1)


def test_wrong_device_is_refused(comm):
    with pytest.raises(purlin_rs.InvalidArgumentError, match="cpu"):
        comm.all_reduce(torch.ones(4))


def test_compat(gloo_group):
    h = compat.initialize(gloo_group, DEVICE, None, torch.cuda.current_stream().cuda_stream)
    x = on_gpu(inputs(RANK, N), torch.float32)
    out = poison(N, torch.float32)
    compat.all_reduce(x, out, h, torch.cuda.current_stream().cuda_stream, reduction_mode="sum")
    same(out, sum(inputs(r, N) for r in range(WORLD)))
    counts = [4 * (r + 1) for r in range(WORLD)]
    g = poison(sum(counts), torch.float32)
    compat.all_gather_v(x[: counts[RANK]], g, h, None, recv_bytes=[4 * c for c in counts])
    same(g, torch.cat([inputs(r, N)[: counts[r]] for r in range(WORLD)]))
    compat.finalize(h)


def test_backend_collectives(world_group):
    x = on_gpu(inputs(RANK, N), torch.float32)
    dist.all_reduce(x)
    same(x, sum(inputs(r, N) for r in range(WORLD)))
    out = poison(WORLD * N, torch.float32)
    dist.all_gather_into_tensor(out, on_gpu(inputs(RANK, N), torch.float32))
    same(out, torch.cat([inputs(r, N) for r in range(WORLD)]))
    rs = poison(N, torch.float32)
    dist.reduce_scatter_tensor(rs, on_gpu(inputs(RANK, WORLD * N), torch.float32))
    same(rs, sum(inputs(r, WORLD * N) for r in range(WORLD))[RANK * N : (RANK + 1) * N])
    a2a = poison(WORLD * N, torch.float32)
    dist.all_to_all_single(a2a, on_gpu(inputs(RANK, WORLD * N), torch.float32))
    same(a2a, torch.cat([inputs(s, WORLD * N)[RANK * N : (RANK + 1) * N] for s in range(WORLD)]))
    b = on_gpu(inputs(RANK, N), torch.float32)
    dist.broadcast(b, 1)
    same(b, inputs(1, N))
    dist.barrier()
    cpu = inputs(RANK, 8)
    dist.all_reduce(cpu)  # gloo, beside Purlin
    same(cpu, sum(inputs(r, 8) for r in range(WORLD)))
    with pytest.raises(NotImplementedError, match="gather"):
        dist.gather(on_gpu(inputs(RANK, 4), torch.float32), None if RANK else [poison(4, torch.float32)] * WORLD, dst=0)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(DEVICE)


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 32, generator=g).to(DEVICE), torch.randn(16, 8, generator=g).to(DEVICE)


def test_ddp_step_matches_the_reference(world_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), process_group=world_group)
    x, y = _batch(RANK)
    torch.nn.functional.mse_loss(model(x), y).backward()
    got = [p.grad.detach().clone() for p in model.parameters()]

    # Reference: every rank's gradient computed here, averaged (DDP's meaning).
    ref = _model()
    grads = None
    for r in range(WORLD):
        ref.zero_grad()
        xr, yr = _batch(r)
        torch.nn.functional.mse_loss(ref(xr), yr).backward()
        g = [p.grad.detach().clone() for p in ref.parameters()]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    for a, b in zip(got, grads):
        torch.testing.assert_close(a, b / WORLD, rtol=1e-5, atol=1e-6)

    if not SHARED:
        # Beside NCCL (distinct GPUs only: NCCL refuses two ranks on one GPU).
        nccl = dist.new_group(backend="nccl")
        model2 = DDP(_model(), process_group=nccl)
        torch.nn.functional.mse_loss(model2(x), y).backward()
        for a, p in zip(got, model2.parameters()):
            torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-6)
