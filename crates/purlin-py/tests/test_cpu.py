"""The binding on the host executor (ranks as threads, numpy arrays): every collective and
element type against the reference in reference.py, the error mapping, and the compatibility
module's argument checks. Needs numpy and pytest; no GPU, no torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import purlin_rs
from purlin_rs import CpuComm, compat
from reference import DTYPES, REDUCIBLE, decode, encode, inputs, reduce

WORLDS = [2, 3]
N = 6  # elements per rank part: small, and not a multiple of any vector width


def run(world, fn):
    # A short timeout: a rank that fails in Python leaves the others waiting in Purlin.
    return CpuComm.run(world, fn, timeout=10.0)


def poison(n, dtype):
    container = DTYPES[dtype][0]
    return np.full(n, np.iinfo(np.uint8).max if container == np.uint8 else 99, dtype=container)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", REDUCIBLE)
@pytest.mark.parametrize("in_place", [False, True])
def test_all_reduce_sum(world, dtype, in_place):
    def rank(c):
        x = encode(inputs(c.rank, N, dtype), dtype)
        if in_place:
            c.all_reduce(x, "sum", dtype=dtype)
            return decode(x, dtype)
        out = poison(N, dtype)
        c.all_reduce(x, "sum", output=out, dtype=dtype)
        return decode(out, dtype)

    expected = reduce([inputs(r, N, dtype) for r in range(world)], "sum")
    assert run(world, rank) == [expected] * world


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg", purlin_rs.ReduceOp.MAX])
def test_all_reduce_ops_f32(op):
    world = 3

    def rank(c):
        x = encode(inputs(c.rank, N, "float32"), "float32")
        c.all_reduce(x, op)
        return x.tolist()

    name = op.value if isinstance(op, purlin_rs.ReduceOp) else op
    expected = reduce([inputs(r, N, "float32") for r in range(world)], name)
    got = run(world, rank)
    for g in got:
        assert g == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_gather(world, dtype):
    def rank(c):
        x = encode(inputs(c.rank, N, dtype), dtype)
        out = poison(world * N, dtype)
        c.all_gather_into_tensor(out, x, dtype=dtype)
        return decode(out, dtype)

    expected = [float(v) for r in range(world) for v in inputs(r, N, dtype)]
    assert run(world, rank) == [expected] * world


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_in_place(world):
    def rank(c):
        buf = poison(world * N, "int32")
        buf[c.rank * N : (c.rank + 1) * N] = inputs(c.rank, N, "int32")
        c.all_gather_into_tensor(buf, buf[c.rank * N : (c.rank + 1) * N])
        return buf.tolist()

    expected = [v for r in range(world) for v in inputs(r, N, "int32")]
    assert run(world, rank) == [expected] * world


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", REDUCIBLE)
def test_reduce_scatter(world, dtype):
    def rank(c):
        x = encode(inputs(c.rank, world * N, dtype), dtype)
        out = poison(N, dtype)
        c.reduce_scatter_tensor(out, x, "sum", dtype=dtype)
        return decode(out, dtype)

    total = reduce([inputs(r, world * N, dtype) for r in range(world)], "sum")
    assert run(world, rank) == [total[r * N : (r + 1) * N] for r in range(world)]


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_in_place(world):
    def rank(c):
        buf = encode(inputs(c.rank, world * N, "float32"), "float32")
        c.reduce_scatter_tensor(buf[c.rank * N : (c.rank + 1) * N], buf)
        return buf[c.rank * N : (c.rank + 1) * N].tolist()

    total = reduce([inputs(r, world * N, "float32") for r in range(world)], "sum")
    assert run(world, rank) == [total[r * N : (r + 1) * N] for r in range(world)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_to_all_equal(world, dtype):
    def rank(c):
        x = encode(inputs(c.rank, world * N, dtype), dtype)
        out = poison(world * N, dtype)
        c.all_to_all_single(out, x, dtype=dtype)
        return decode(out, dtype)

    sent = [inputs(r, world * N, dtype) for r in range(world)]
    expected = [[float(v) for s in range(world) for v in sent[s][d * N : (d + 1) * N]] for d in range(world)]
    assert run(world, rank) == expected


def matrix(world):
    """A skewed traffic matrix with zeros: counts[s][d]."""
    return [[(s * 2 + d * 3) % 5 for d in range(world)] for s in range(world)]


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_splits(world):
    m = matrix(world)

    def rank(c):
        send_sizes = m[c.rank]
        recv_sizes = [m[s][c.rank] for s in range(world)]
        x = encode(inputs(c.rank, sum(send_sizes), "float32"), "float32")
        out = poison(sum(recv_sizes), "float32")
        c.all_to_all_single(out, x, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
        return out.tolist()

    got = run(world, rank)
    for d in range(world):
        expected = []
        for s in range(world):
            data = inputs(s, sum(m[s]), "float32")
            start = sum(m[s][:d])
            expected += [float(v) for v in data[start : start + m[s][d]]]
        assert got[d] == expected


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_v_matrix(world):
    m = matrix(world)

    def rank(c):
        x = encode(inputs(c.rank, sum(m[c.rank]), "int64"), "int64")
        out = poison(sum(m[s][c.rank] for s in range(world)), "int64")
        c.all_to_all_v(out, x, m)
        return out.tolist()

    got = run(world, rank)
    for d in range(world):
        expected = []
        for s in range(world):
            data = inputs(s, sum(m[s]), "int64")
            start = sum(m[s][:d])
            expected += data[start : start + m[s][d]]
        assert got[d] == expected


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_v(world):
    counts = [(r * 3 + 1) % 4 for r in range(world)]  # with a zero at world 3

    def rank(c):
        x = encode(inputs(c.rank, counts[c.rank], "float16"), "float16")
        out = poison(sum(counts), "float16")
        c.all_gather_v(out, x, counts)
        return decode(out, "float16")

    expected = [float(v) for r in range(world) for v in inputs(r, counts[r], "float16")]
    assert run(world, rank) == [expected] * world


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_v(world):
    counts = [(r * 3 + 2) % 5 for r in range(world)]

    def rank(c):
        x = encode(inputs(c.rank, sum(counts), "bfloat16"), "bfloat16")
        out = poison(counts[c.rank], "bfloat16")
        c.reduce_scatter_v(out, x, counts, "sum", dtype="bfloat16")
        return decode(out, "bfloat16")

    total = reduce([inputs(r, sum(counts), "bfloat16") for r in range(world)], "sum")
    starts = [sum(counts[:r]) for r in range(world)]
    assert run(world, rank) == [total[starts[r] : starts[r] + counts[r]] for r in range(world)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast(world, root):
    def rank(c):
        x = encode(inputs(c.rank, N, "uint8"), "uint8")
        c.broadcast(x, root)
        return x.tolist()

    assert run(world, rank) == [inputs(root, N, "uint8")] * world


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("root", [0, 1])
def test_reduce(world, root):
    def rank(c):
        x = encode(inputs(c.rank, N, "int32"), "int32")
        c.reduce(x, root, "max")
        return x.tolist()

    got = run(world, rank)
    assert got[root] == reduce([inputs(r, N, "int32") for r in range(world)], "max")
    for r in range(world):
        if r != root:
            assert got[r] == inputs(r, N, "int32"), "a non-root's tensor is left as it was"


def test_send_recv():
    def rank(c):
        if c.rank == 0:
            c.send(encode(inputs(0, N, "float32"), "float32"), 1)
            return None
        out = poison(N, "float32")
        c.recv(out, 0)
        return out.tolist()

    assert run(2, rank)[1] == [float(v) for v in inputs(0, N, "float32")]


def test_barrier_and_repr():
    got = run(3, lambda c: (c.barrier(), repr(c))[1])
    assert got == [f"purlin_rs.CpuComm(rank={r}, world_size=3)" for r in range(3)]


# -- errors -------------------------------------------------------------------------------------


def raised(world, fn):
    """Every rank's exception (or None), each rank running fn."""
    def rank(c):
        try:
            fn(c)
        except purlin_rs.PurlinError as e:
            return e
        return None

    return run(world, rank)


def test_mismatched_calls_raise_mismatch_naming_the_peer():
    errors = raised(2, lambda c: c.all_reduce(np.ones(4 + c.rank, np.float32)))
    for r, e in enumerate(errors):
        assert isinstance(e, purlin_rs.MismatchError), e
        assert isinstance(e, purlin_rs.PurlinError) and isinstance(e, RuntimeError)
        assert (e.rank, e.peer) == (r, 1 - r)
        assert f"rank {1 - r}" in str(e)


def test_bad_arguments_are_invalid_argument_errors():
    def checks(c):
        with pytest.raises(purlin_rs.InvalidArgumentError, match="not C-contiguous") as e:
            c.all_reduce(np.ones((4, 4), np.float32)[:, ::2])
        assert e.value.peer is None
        ro = np.ones(4, np.float32)
        ro.setflags(write=False)
        with pytest.raises(purlin_rs.InvalidArgumentError, match="read-only"):
            c.all_reduce(ro)
        with pytest.raises(purlin_rs.InvalidArgumentError, match="outside a world"):
            c.broadcast(np.ones(4, np.float32), 7)
        with pytest.raises(purlin_rs.InvalidArgumentError, match="input is float32, output is int32"):
            c.all_reduce(np.ones(4, np.float32), output=np.ones(4, np.int32))
        with pytest.raises(purlin_rs.InvalidArgumentError, match="overlaps"):
            buf = np.ones(8, np.float32)
            c.all_gather_into_tensor(buf[1:], buf[:4])
        with pytest.raises(purlin_rs.InvalidArgumentError, match="numpy array"):
            c.all_reduce([1.0, 2.0])
        with pytest.raises(purlin_rs.InvalidArgumentError, match="cannot hold"):
            c.all_reduce(np.ones(4, np.float32), dtype="bfloat16")
        with pytest.raises(purlin_rs.InvalidArgumentError, match="split sizes"):
            c.all_to_all_single(np.ones(4, np.float32), np.ones(4, np.float32), [1, 3], [2, 1])
        with pytest.raises(purlin_rs.UnsupportedError, match="complex64"):
            c.all_reduce(np.ones(4, np.complex64))
        with pytest.raises(purlin_rs.InvalidArgumentError, match="unknown reduce operation"):
            c.all_reduce(np.ones(4, np.float32), "median")

    run(2, checks)


def test_reducing_a_type_the_atom_does_not_reduce_is_unsupported():
    errors = raised(2, lambda c: c.all_reduce(np.ones(4, np.float64)))
    assert all(isinstance(e, purlin_rs.UnsupportedError) for e in errors), errors


def test_wrong_sizes_are_spec_errors():
    # An AllGather output that is not world × input: refused before anything runs.
    errors = raised(2, lambda c: c.all_gather_into_tensor(np.zeros(5, np.float32), np.ones(2, np.float32)))
    assert all(isinstance(e, purlin_rs.InvalidArgumentError) for e in errors), errors


def test_split_sizes_that_disagree_name_the_sender():
    def rank(c):
        # Rank 1 sends 2 elements to rank 0, which expects 1 from it.
        send = [1, 1] if c.rank == 0 else [2, 0]
        recv = [1, 1] if c.rank == 0 else [1, 0]
        c.all_to_all_single(np.zeros(sum(recv), np.float32), np.ones(sum(send), np.float32), recv, send)

    errors = raised(2, rank)
    for e in errors:
        assert isinstance(e, purlin_rs.InvalidArgumentError)
        assert "rank 0 expects 1 elements from rank 1, which sends 2" in str(e)


def test_send_in_a_world_of_three_is_unsupported():
    errors = raised(3, lambda c: c.send(np.ones(2, np.float32), (c.rank + 1) % 3))
    assert all(isinstance(e, purlin_rs.UnsupportedError) for e in errors), errors


def test_world_out_of_range():
    with pytest.raises(purlin_rs.PurlinError):
        CpuComm.threads(purlin_rs.MAX_WORLD + 1)


def test_exception_classes():
    assert issubclass(purlin_rs.TimeoutError, purlin_rs.PeerError)
    assert issubclass(purlin_rs.PeerLostError, purlin_rs.PeerError)
    assert issubclass(purlin_rs.SpecError, purlin_rs.InvalidArgumentError)
    assert issubclass(purlin_rs.PurlinError, RuntimeError)


def test_import_needs_no_torch():
    code = "import sys, purlin_rs, purlin_rs.cpu; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


# -- the compatibility module -------------------------------------------------------------------


def handles(world):
    return [compat.Handle(c, None, None) for c in CpuComm.threads(world)]


def test_compat_runs_on_the_host_executor():
    hs = handles(2)

    def rank(h):
        x = encode(inputs(h.comm.rank, N, "float32"), "float32")
        out = poison(N, "float32")
        compat.all_reduce(x, out, h, None, reduction_mode="sum")
        g = poison(3, "float32")
        mine = [1, 2][h.comm.rank]
        compat.all_gather_v(x[:mine], g, h, None, recv_bytes=[4, 8])
        return out.tolist(), g.tolist()

    import threading

    results = [None, None]
    ts = [threading.Thread(target=lambda h=h: results.__setitem__(h.comm.rank, rank(h))) for h in hs]
    [t.start() for t in ts]
    [t.join() for t in ts]
    expected = reduce([inputs(r, N, "float32") for r in range(2)], "sum")
    x0, x1 = inputs(0, N, "float32"), inputs(1, N, "float32")
    assert results == [(expected, [x0[0], x1[0], x1[1]])] * 2


def test_compat_argument_checks():
    (h, _) = handles(2)
    x = np.ones(4, np.float32)
    with pytest.raises(purlin_rs.InvalidArgumentError, match="handle"):
        compat.all_reduce(x, x, object(), None)
    with pytest.raises(purlin_rs.InvalidArgumentError, match="stream_ptr"):
        compat.all_reduce(x, x, h, -1)
    with pytest.raises(purlin_rs.InvalidArgumentError, match="stream_ptr"):
        compat.all_reduce(x, x, h, "0x1")
    with pytest.raises(purlin_rs.InvalidArgumentError, match="unknown reduce"):
        compat.all_reduce(x, x, h, None, reduction_mode="median")
    with pytest.raises(purlin_rs.InvalidArgumentError, match="byte counts is required"):
        compat.all_gather_v(x, x, h, None)
    with pytest.raises(purlin_rs.InvalidArgumentError, match="1 byte counts for a world of 2"):
        compat.all_gather_v(x, x, h, None, recv_bytes=[4])
    with pytest.raises(purlin_rs.InvalidArgumentError, match="whole number of 4-byte elements"):
        compat.reduce_scatter_v(x, x, h, None, send_bytes=[6, 10])
    with pytest.raises(purlin_rs.InvalidArgumentError, match="non-negative int"):
        compat.all_to_all_v(x, x, h, None, send_bytes=[4, -4], recv_bytes=[4, 4])
    with pytest.raises(purlin_rs.InvalidArgumentError, match="unknown arch"):
        compat.initialize(None, None, "sm61")
    h.open = False
    with pytest.raises(purlin_rs.InvalidArgumentError, match="finalized"):
        compat.all_reduce(x, x, h, None)


@pytest.mark.skipif(purlin_rs.driver_present(), reason="checks the machine without a CUDA driver (CI)")
def test_gpu_communicators_without_a_driver_raise_setup_errors():
    from purlin_rs import _purlin

    with pytest.raises(purlin_rs.SetupError, match="no CUDA driver") as e:
        _purlin.Comm.from_id(purlin_rs.new_id(), 0, 2, 0)
    assert e.value.rank == 0
    with pytest.raises(purlin_rs.SetupError, match="no CUDA driver"):
        _purlin.Comm.from_env(0)
    with pytest.raises(purlin_rs.InvalidArgumentError):
        _purlin.Comm.from_id(b"short", 0, 2, 0)


def test_nvrtc_dir_comes_from_the_wheel_unless_set(tmp_path, monkeypatch):
    from purlin_rs import _nvrtc

    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv(_nvrtc.ENV, raising=False)
    assert _nvrtc.configure() == str(lib)
    assert os.environ[_nvrtc.ENV] == str(lib)
    monkeypatch.setenv(_nvrtc.ENV, "/elsewhere")
    assert _nvrtc.configure() == "/elsewhere", "a set PURLIN_NVRTC_DIR wins"


def test_purlin_log_prints_one_line_per_call_and_nothing_by_default():
    program = (
        "import numpy as np\n"
        "from purlin_rs import CpuComm\n"
        "def rank(c):\n"
        "    x = np.ones(8, dtype=np.float32)\n"
        "    c.all_reduce(x, 'sum')\n"
        "    return float(x[0])\n"
        "assert CpuComm.run(2, rank, timeout=10.0) == [2.0, 2.0]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PURLIN_LOG")}
    quiet = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
    assert "purlin::call" not in quiet.stderr, quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-c", program], env={**env, "PURLIN_LOG": "purlin=debug"}, capture_output=True, text=True,
        check=True,
    )
    calls = [line for line in loud.stderr.splitlines() if "purlin::call" in line and "all-reduce" in line]
    assert len(calls) == 2, loud.stderr  # one line per rank's call
    bad = subprocess.run(
        [sys.executable, "-c", "import purlin_rs"], env={**env, "PURLIN_LOG": "purlin=loud"}, capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "PURLIN_LOG" in bad.stderr, bad.stderr
