"""Purlin's collectives as ``torch.library`` custom ops, so ``torch.compile`` and CUDA graphs
(``torch.cuda.graph``) see each call as one opaque op.

An op names its communicator by a handle (:func:`handle`); the functional forms return a new
tensor, ``all_reduce_inplace`` works in place::

    h = purlin_rs.ops.handle(comm)
    y = torch.ops.purlin.all_reduce(x, h, "sum")        # or purlin_rs.ops.all_reduce(x, comm)

Under capture the kernel is recorded on the capture stream; run each call once before
capturing it (as torch recommends for any warm-up), so its plan is prepared outside the graph.
"""

from __future__ import annotations

import torch

from ._purlin import InvalidArgumentError

_COMMS: dict = {}


def handle(comm) -> int:
    """The op handle of a :class:`purlin_rs.Comm` (registered on first use, kept while the
    process lives or until :func:`release`)."""
    h = id(comm)
    _COMMS[h] = comm
    return h


def release(comm) -> None:
    """Forgets a communicator's handle."""
    _COMMS.pop(id(comm), None)


def _comm(h: int):
    try:
        return _COMMS[h]
    except KeyError:
        raise InvalidArgumentError(f"no communicator has op handle {h}") from None


@torch.library.custom_op("purlin::all_reduce", mutates_args=())
def _all_reduce(input: torch.Tensor, comm: int, op: str) -> torch.Tensor:
    out = torch.empty_like(input)
    _comm(comm).all_reduce(input, op, output=out)
    return out


@_all_reduce.register_fake
def _(input, comm, op):
    return torch.empty_like(input)


@torch.library.custom_op("purlin::all_reduce_inplace", mutates_args=("tensor",))
def _all_reduce_(tensor: torch.Tensor, comm: int, op: str) -> None:
    _comm(comm).all_reduce(tensor, op)


@_all_reduce_.register_fake
def _(tensor, comm, op):
    return None


def _world(comm: int, _fake: bool) -> int:
    return _comm(comm).world_size


@torch.library.custom_op("purlin::all_gather_into_tensor", mutates_args=())
def _all_gather(input: torch.Tensor, comm: int) -> torch.Tensor:
    c = _comm(comm)
    out = input.new_empty((c.world_size * input.shape[0], *input.shape[1:]) if input.dim() else (c.world_size,))
    c.all_gather_into_tensor(out, input)
    return out


@_all_gather.register_fake
def _(input, comm):
    w = _world(comm, True)
    return input.new_empty((w * input.shape[0], *input.shape[1:]) if input.dim() else (w,))


@torch.library.custom_op("purlin::reduce_scatter_tensor", mutates_args=())
def _reduce_scatter(input: torch.Tensor, comm: int, op: str) -> torch.Tensor:
    c = _comm(comm)
    out = input.new_empty((input.shape[0] // c.world_size, *input.shape[1:]))
    c.reduce_scatter_tensor(out, input, op)
    return out


@_reduce_scatter.register_fake
def _(input, comm, op):
    return input.new_empty((input.shape[0] // _world(comm, True), *input.shape[1:]))


@torch.library.custom_op("purlin::all_to_all_single", mutates_args=())
def _all_to_all(input: torch.Tensor, comm: int) -> torch.Tensor:
    out = torch.empty_like(input)
    _comm(comm).all_to_all_single(out, input)
    return out


@_all_to_all.register_fake
def _(input, comm):
    return torch.empty_like(input)


def all_reduce(tensor: torch.Tensor, comm, op: str = "sum") -> torch.Tensor:
    """AllReduce into a new tensor (``torch.ops.purlin.all_reduce``)."""
    return torch.ops.purlin.all_reduce(tensor, handle(comm), str(op))


def all_reduce_(tensor: torch.Tensor, comm, op: str = "sum") -> torch.Tensor:
    """AllReduce in place (``torch.ops.purlin.all_reduce_inplace``)."""
    torch.ops.purlin.all_reduce_inplace(tensor, handle(comm), str(op))
    return tensor


def all_gather_into_tensor(tensor: torch.Tensor, comm) -> torch.Tensor:
    """AllGather along dimension 0 into a new tensor."""
    return torch.ops.purlin.all_gather_into_tensor(tensor, handle(comm))


def reduce_scatter_tensor(tensor: torch.Tensor, comm, op: str = "sum") -> torch.Tensor:
    """ReduceScatter along dimension 0 into a new tensor."""
    return torch.ops.purlin.reduce_scatter_tensor(tensor, handle(comm), str(op))


def all_to_all_single(tensor: torch.Tensor, comm) -> torch.Tensor:
    """AllToAll (equal parts along dimension 0) into a new tensor."""
    return torch.ops.purlin.all_to_all_single(tensor, handle(comm))


__all__ = [
    "handle",
    "release",
    "all_reduce",
    "all_reduce_",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
]
