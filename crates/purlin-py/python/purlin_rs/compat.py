"""The reference package's function signatures (PyPI ``purlin`` 0.6.x), so a program written
for it runs with its import changed to ``from purlin_rs import compat as purlin``::

    handle = purlin.initialize(group, device, arch, stream_ptr)
    purlin.all_reduce(in_tensor, out_tensor, handle, stream_ptr, reduction_mode="sum")
    purlin.all_gather_v(in_tensor, out_tensor, handle, stream_ptr, recv_bytes)
    purlin.finalize(handle)

Sizes of the V forms are byte lists, as the reference's: ``recv_bytes[r]`` the bytes rank r
contributes (AllGatherV), ``send_bytes[r]`` the bytes of the part rank r receives
(ReduceScatterV), and for AllToAllV this rank's ``send_bytes[d]`` to each destination and
``recv_bytes[s]`` from each source. Each must be a whole number of elements.

``arch`` is accepted and checked but not needed: Purlin reads the GPU's generation itself.
``stream_ptr`` is the raw ``cudaStream_t`` (``torch.cuda.current_stream().cuda_stream``); ``None``
or 0 means torch's current stream.
"""

from __future__ import annotations

from typing import Sequence

from ._common import op_name
from ._purlin import InvalidArgumentError

_ARCHS = {None, "auto", "sm80", "sm90", "sm100", "ampere", "hopper", "blackwell", 80, 90, 100}


class Handle:
    """What :func:`initialize` returns: the communicator and its settings."""

    def __init__(self, comm, device, arch):
        self.comm = comm
        self.device = device
        self.arch = arch
        self.open = True

    def __repr__(self) -> str:
        return f"purlin_rs.compat.Handle({self.comm!r}, arch={self.arch!r}, open={self.open})"


def _check_handle(handle) -> None:
    if not isinstance(handle, Handle):
        raise InvalidArgumentError(f"expected the handle initialize() returned, not {type(handle).__name__}")
    if not handle.open:
        raise InvalidArgumentError("the handle was finalized")


def _check_stream(stream_ptr) -> int | None:
    if stream_ptr is None:
        return None
    if isinstance(stream_ptr, bool) or not isinstance(stream_ptr, int) or stream_ptr < 0:
        raise InvalidArgumentError(f"stream_ptr must be a non-negative int (a cudaStream_t), not {stream_ptr!r}")
    return stream_ptr or None


def _check_bytes(sizes, what: str, world: int, itemsize: int) -> list[int]:
    if sizes is None:
        raise InvalidArgumentError(f"{what}: a list of byte counts is required")
    sizes = list(sizes)
    if len(sizes) != world:
        raise InvalidArgumentError(f"{what}: {len(sizes)} byte counts for a world of {world}")
    out = []
    for r, b in enumerate(sizes):
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise InvalidArgumentError(f"{what}[{r}]: a non-negative int, not {b!r}")
        if b % itemsize:
            raise InvalidArgumentError(f"{what}[{r}]: {b} bytes is not a whole number of {itemsize}-byte elements")
        out.append(b // itemsize)
    return out


def _itemsize(t) -> int:
    """Bytes per element of a torch tensor (or a numpy array)."""
    return t.element_size() if hasattr(t, "element_size") else t.itemsize


def _run(handle, stream_ptr, fn):
    _check_handle(handle)
    stream = _check_stream(stream_ptr)
    if stream is None:
        return fn(handle.comm)
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=handle.comm.device)):
        return fn(handle.comm)


def initialize(group=None, device=None, arch=None, stream_ptr=None) -> Handle:
    """Makes the communicator over ``group`` (a torch.distributed group; default the world)
    on ``device`` (default: this rank's GPU)."""
    if arch not in _ARCHS:
        raise InvalidArgumentError(f"unknown arch {arch!r} (one of {sorted(map(str, _ARCHS - {None}))} or None)")
    _check_stream(stream_ptr)
    from .gpu import Comm

    return Handle(Comm.from_group(group, device), device, arch)


def finalize(handle: Handle) -> None:
    """Tears the communicator down (every rank calls it)."""
    _check_handle(handle)
    handle.open = False
    handle.comm.close()


def all_reduce(in_tensor, out_tensor, handle, stream_ptr=None, reduction_mode="sum") -> None:
    """AllReduce of ``in_tensor`` into ``out_tensor`` (the same tensor: in place)."""
    mode = op_name(reduction_mode)
    _run(handle, stream_ptr, lambda c: c.all_reduce(in_tensor, mode, output=out_tensor))


def all_gather(in_tensor, out_tensor, handle, stream_ptr=None) -> None:
    """AllGather: ``out_tensor`` holds every rank's ``in_tensor`` in rank order."""
    _run(handle, stream_ptr, lambda c: c.all_gather_into_tensor(out_tensor, in_tensor))


def reduce_scatter(in_tensor, out_tensor, handle, stream_ptr=None, reduction_mode="sum") -> None:
    """ReduceScatter: rank r's ``out_tensor`` receives the reduction of part r."""
    mode = op_name(reduction_mode)
    _run(handle, stream_ptr, lambda c: c.reduce_scatter_tensor(out_tensor, in_tensor, mode))


def all_to_all(in_tensor, out_tensor, handle, stream_ptr=None) -> None:
    """AllToAll in equal parts."""
    _run(handle, stream_ptr, lambda c: c.all_to_all_single(out_tensor, in_tensor))


def all_gather_v(in_tensor, out_tensor, handle, stream_ptr=None, recv_bytes: Sequence[int] | None = None) -> None:
    """AllGatherV: rank r contributes ``recv_bytes[r]`` bytes."""
    _check_handle(handle)
    counts = _check_bytes(recv_bytes, "all_gather_v: recv_bytes", handle.comm.world_size, _itemsize(in_tensor))
    _run(handle, stream_ptr, lambda c: c.all_gather_v(out_tensor, in_tensor, counts))


def reduce_scatter_v(
    in_tensor, out_tensor, handle, stream_ptr=None, send_bytes: Sequence[int] | None = None, reduction_mode="sum"
) -> None:
    """ReduceScatterV: rank r receives the reduction of a part of ``send_bytes[r]`` bytes."""
    _check_handle(handle)
    mode = op_name(reduction_mode)
    counts = _check_bytes(send_bytes, "reduce_scatter_v: send_bytes", handle.comm.world_size, _itemsize(in_tensor))
    _run(handle, stream_ptr, lambda c: c.reduce_scatter_v(out_tensor, in_tensor, counts, mode))


def all_to_all_v(
    in_tensor,
    out_tensor,
    handle,
    stream_ptr=None,
    send_bytes: Sequence[int] | None = None,
    recv_bytes: Sequence[int] | None = None,
) -> None:
    """AllToAllV: ``send_bytes[d]`` bytes to rank d, ``recv_bytes[s]`` bytes from rank s."""
    _check_handle(handle)
    w, size = handle.comm.world_size, _itemsize(in_tensor)
    send = _check_bytes(send_bytes, "all_to_all_v: send_bytes", w, size)
    recv = _check_bytes(recv_bytes, "all_to_all_v: recv_bytes", w, size)
    _run(handle, stream_ptr, lambda c: c.all_to_all_single(out_tensor, in_tensor, recv, send))


__all__ = [
    "Handle",
    "initialize",
    "finalize",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_gather_v",
    "reduce_scatter_v",
    "all_to_all_v",
]
