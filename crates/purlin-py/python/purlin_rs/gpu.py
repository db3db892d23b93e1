"""The GPU communicator over PyTorch tensors: :class:`Comm`.

Each call checks its tensors (CUDA, on this rank's GPU, contiguous, one element type), passes
``tensor.data_ptr()`` and the element count to Purlin, and enqueues one kernel on torch's
**current** stream, ordered after this communicator's earlier calls on any stream; the GIL is
released while Rust works. Like torch.distributed's NCCL calls, the result is ready in stream
order: later work on the same stream sees it; keep tensors alive (or ``record_stream`` them)
until their stream has passed the call.

Symmetric tensors (:meth:`Comm.empty`) are allocated by every rank at once and reachable by
every peer: collectives whose buffers are such tensors, whole, take the one-copy paths.
"""

from __future__ import annotations

import atexit
import os
import weakref


import torch
import torch.distributed as dist

from . import _purlin
from ._common import Buf, Collectives
from ._purlin import InvalidArgumentError, UnsupportedError

_SUPPORTED = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}
for _name in ("uint32", "uint64"):
    if hasattr(torch, _name):
        _SUPPORTED[getattr(torch, _name)] = _name


def _shared_gpu() -> bool:
    return os.environ.get("PURLIN_SHARED_GPU", "") not in ("", "0")


def default_device() -> int:
    """The GPU a rank drives: 0 for every rank under ``PURLIN_SHARED_GPU=1``, else
    ``LOCAL_RANK`` (torchrun), else torch's current device."""
    if _shared_gpu():
        return 0
    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        return int(local) % max(torch.cuda.device_count(), 1)
    return torch.cuda.current_device()


def _device_index(device) -> int:
    """A GPU ordinal from a device (``torch.device``, ``"cuda:1"``, an int) or the default."""
    if device is None:
        return default_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


class _SymmetricView:
    """Presents symmetric memory to ``torch.as_tensor`` (``__cuda_array_interface__``) and keeps
    it held for as long as any tensor over it lives."""

    def __init__(self, mem: "_purlin.Symmetric"):
        self.mem = mem
        self.__cuda_array_interface__ = {
            "shape": (mem.nbytes,),
            "typestr": "|u1",
            "data": (mem.address, False),
            "version": 3,
            "strides": None,
        }


# The communicators alive, in creation order. Teardown meets the peers, so ranks must tear
# down their communicators in the same order: at exit, in creation order (the same on every
# rank: making one is a collective call), not in the interpreter's order of collection.
_LIVE: list = []


@atexit.register
def _close_all() -> None:
    for ref in list(_LIVE):
        comm = ref()
        if comm is not None:
            comm._inner.close()
    _LIVE.clear()


class Comm(Collectives):
    """One rank of a group of GPUs running Purlin's collectives on torch tensors."""

    def __init__(self, inner: "_purlin.Comm"):
        self._inner = inner
        self.rank: int = inner.rank
        self.world_size: int = inner.world_size
        self.device = torch.device("cuda", inner.device)
        _LIVE.append(weakref.ref(self))

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_env(cls, device=None) -> "Comm":
        """Under torchrun: rank ``RANK`` of ``WORLD_SIZE`` on ``device`` (default:
        :func:`default_device`, so GPU ``LOCAL_RANK``, or GPU 0 for every rank with
        ``PURLIN_SHARED_GPU=1``). Returns once every rank is set up."""
        return cls(_purlin.Comm.from_env(_device_index(device)))

    @classmethod
    def from_group(cls, group=None, device=None) -> "Comm":
        """Over an existing torch.distributed group (a CPU/gloo group is enough): one rank makes
        the rendezvous id, the group broadcasts it, every rank meets the others. ``device``:
        this rank's GPU (default: :func:`default_device`)."""
        group = group if group is not None else dist.group.WORLD
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        box = [_purlin.new_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        return cls(_purlin.Comm.from_id(box[0], rank, world, _device_index(device)))

    @classmethod
    def from_store(cls, store, rank: int, world_size: int, device=None, prefix: str = "purlin") -> "Comm":
        """Over a torch.distributed ``Store`` (what a backend is given): rank 0 publishes the
        rendezvous id under ``prefix``, the others read it."""
        key = f"{prefix}/id"
        if rank == 0:
            store.set(key, _purlin.new_id())
        ident = bytes(store.get(key))
        return cls(_purlin.Comm.from_id(ident, rank, world_size, _device_index(device)))

    # -- symmetric memory ---------------------------------------------------------------------
    def empty(self, *size, dtype=torch.float32) -> torch.Tensor:
        """A symmetric tensor (a collective call: every rank, same size and dtype, same order),
        zeroed. Collectives on it, whole, take the one-copy paths."""
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        if dtype not in _SUPPORTED:
            raise UnsupportedError(f"empty: element type {dtype}")
        numel = 1
        for s in size:
            numel *= int(s)
        itemsize = torch.empty((), dtype=dtype).element_size()
        mem = self._inner.alloc_symmetric(numel * itemsize)
        raw = torch.as_tensor(_SymmetricView(mem), device=self.device)
        return raw.view(dtype).view(size)

    # -- the backend of Collectives -----------------------------------------------------------
    def _buffer(self, x, what: str, writable: bool, dtype=None) -> Buf:
        if not isinstance(x, torch.Tensor):
            raise InvalidArgumentError(f"{what}: a torch.Tensor, not {type(x).__name__}")
        if x.device != self.device:
            raise InvalidArgumentError(f"{what}: a tensor on {x.device} passed to rank {self.rank} on {self.device}")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"{what}: the tensor is not contiguous")
        name = _SUPPORTED.get(x.dtype)
        if name is None:
            raise UnsupportedError(f"{what}: element type {x.dtype}")
        return Buf(x.data_ptr(), x.numel(), name, x.element_size())

    def _launch(self, kind: str, send: Buf, recv: Buf, **kw) -> None:
        dtype = recv.dtype or send.dtype
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._inner.call(kind, dtype, send.pair(), recv.pair(), stream, **kw)

    def _exchange(self, data: bytes) -> list[bytes]:
        return list(self._inner.exchange(data))

    # -- the rest -----------------------------------------------------------------------------
    def barrier(self) -> None:
        """Waits for this rank's work on the current stream, then for every rank."""
        torch.cuda.current_stream(self.device).synchronize()
        self._exchange(b"")

    def check(self) -> None:
        """Raises the failure that poisoned this communicator, if any (does not wait)."""
        self._inner.check()

    def close(self) -> None:
        """Tears down now (every rank calls it); later calls raise."""
        torch.cuda.current_stream(self.device).synchronize()
        self._inner.close()

    def __repr__(self) -> str:
        return f"purlin_rs.Comm(rank={self.rank}, world_size={self.world_size}, device={self.device})"


__all__ = ["Comm", "default_device"]
