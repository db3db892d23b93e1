"""The host executor from Python: :class:`CpuComm`, ranks as threads of one process, on numpy
arrays (C-contiguous; the output writable). Every call blocks, GIL released, until every rank
has made it.

numpy has no bfloat16 or fp8 of its own: pass ``ml_dtypes`` arrays, or same-sized integer
arrays with ``dtype="bfloat16"`` (``"float8_e4m3fn"``, ``"float8_e5m2"``).
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from . import _purlin
from ._common import Buf, Collectives
from ._purlin import InvalidArgumentError, TimeoutError

T = TypeVar("T")

_ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
}


class _World:
    """What the threads of one world share: a few bytes per rank, exchanged at a barrier."""

    def __init__(self, world: int, timeout: float):
        self.barrier = threading.Barrier(world, timeout=timeout)
        self.slots: list[bytes] = [b""] * world

    def exchange(self, rank: int, data: bytes) -> list[bytes]:
        try:
            self.slots[rank] = data
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out
        except threading.BrokenBarrierError:
            raise TimeoutError(f"rank {rank}: not every rank arrived at a host exchange") from None


class CpuComm(Collectives):
    """One rank of a host-executor world (see :meth:`threads`)."""

    def __init__(self, inner: "_purlin.CpuComm", world: _World):
        self._inner = inner
        self._world = world
        self.rank: int = inner.rank
        self.world_size: int = inner.world_size

    @classmethod
    def threads(cls, world_size: int, *, timeout: float = 60.0) -> list["CpuComm"]:
        """A world of ``world_size`` ranks; drive rank r from its own thread (see :meth:`run`).
        ``timeout``: seconds a rank waits for the others before raising."""
        shared = _World(int(world_size), timeout)
        return [cls(c, shared) for c in _purlin.CpuComm.threads(int(world_size), float(timeout))]

    @staticmethod
    def run(world_size: int, fn: Callable[["CpuComm"], T], *, timeout: float = 60.0) -> list[T]:
        """Runs ``fn(comm)`` on every rank of a new world, one thread each; returns the results
        in rank order, or raises the first rank's exception."""
        comms = CpuComm.threads(world_size, timeout=timeout)
        results: list = [None] * world_size
        errors: list = [None] * world_size

        def body(c: CpuComm) -> None:
            try:
                results[c.rank] = fn(c)
            except BaseException as e:  # re-raised below, in the caller's thread
                errors[c.rank] = e
                c._world.barrier.abort()

        threads = [threading.Thread(target=body, args=(c,)) for c in comms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A rank's own error first, rather than another rank's view of it.
        own = [e for e in errors if e is not None and not isinstance(e, TimeoutError)]
        first = (own or [e for e in errors if e is not None] or [None])[0]
        if first is not None:
            raise first
        return results

    def check(self) -> None:
        """Raises the failure that poisoned this communicator, if any."""
        self._inner.check()

    def _buffer(self, x, what: str, writable: bool, dtype=None) -> Buf:
        try:
            iface = x.__array_interface__
            flags = x.flags
        except AttributeError:
            raise InvalidArgumentError(f"{what}: a numpy array, not {type(x).__name__}") from None
        if not flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError(f"{what}: the array is not C-contiguous")
        if writable and not flags["WRITEABLE"]:
            raise InvalidArgumentError(f"{what}: the array is read-only")
        own = x.dtype.name
        name = own if dtype is None else str(dtype).removeprefix("torch.")
        size = _ITEMSIZE.get(name)
        if size is None:
            raise _purlin.UnsupportedError(f"{what}: element type {name}")
        if size != x.dtype.itemsize:
            raise InvalidArgumentError(f"{what}: a {own} array cannot hold {name} elements")
        return Buf(iface["data"][0], x.size, name, size)

    def _launch(self, kind: str, send: Buf, recv: Buf, **kw) -> None:
        dtype = recv.dtype or send.dtype
        self._inner.call(kind, dtype, send.pair(), recv.pair(), **kw)

    def _exchange(self, data: bytes) -> list[bytes]:
        return self._world.exchange(self.rank, data)

    def __repr__(self) -> str:
        return f"purlin_rs.CpuComm(rank={self.rank}, world_size={self.world_size})"


__all__ = ["CpuComm"]
