"""``purlin``, a torch.distributed backend in pure Python.

::

    import purlin_rs.backend  # registers "purlin"
    torch.distributed.init_process_group("cpu:gloo,cuda:purlin")

CUDA tensors' ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single``, ``broadcast`` and ``barrier`` run on Purlin (``all_gather`` into a list
too, which DDP's start-up check uses); CPU tensors go to a gloo group the backend keeps beside
it. Any other call raises ``NotImplementedError`` naming it.

The backend is a ``torch.distributed.ProcessGroup`` subclass (PyTorch routes a backend whose
creator returns one to it for every device, so it keeps gloo for CPU itself). Calls are
enqueued on torch's current stream and their ``Work`` completes at once, like NCCL's: the result
is ready in stream order.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from .gpu import Comm

NAME = "purlin"


def _done(result) -> "dist.Work":
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


_OPS = {"SUM": "sum", "PRODUCT": "prod", "MAX": "max", "MIN": "min", "AVG": "avg"}


def _op(opts) -> str:
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return "sum"
    for name, ours in _OPS.items():
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            return ours
    raise NotImplementedError(f"the purlin backend does not implement the reduce operation {op}")


class PurlinProcessGroup(dist.ProcessGroup):
    """The ``purlin`` backend's process group (see the module docs)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("purlin-gloo", store), rank, size, timeout)
        self._store = dist.PrefixStore("purlin", store)
        self._comm: Comm | None = None

    @property
    def comm(self) -> Comm:
        """The Purlin communicator (made at the first CUDA call: every rank makes one)."""
        if self._comm is None:
            self._comm = Comm.from_store(self._store, self._rank, self._size)
        return self._comm

    def close(self) -> None:
        """Tears Purlin's communicator down (every rank calls it; also done at exit)."""
        if self._comm is not None:
            self._comm.close()

    def getBackendName(self) -> str:
        return NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def _cuda(self, tensors) -> bool:
        return all(t.is_cuda for t in tensors)

    # -- routed to Purlin ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if not self._cuda(tensors):
            return self._gloo.allreduce(tensors, opts) if opts is not None else self._gloo.allreduce(tensors)
        for t in tensors:
            self.comm.all_reduce(t, _op(opts))
        return _done(tensors)

    def _allgather_base(self, output, input, opts=None):
        if not input.is_cuda:
            return self._gloo._allgather_base(output, input)
        self.comm.all_gather_into_tensor(output, input)
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if not self._cuda(input_tensors):
            return self._gloo.allgather(output_tensors, input_tensors)
        for outs, inp in zip(output_tensors, input_tensors):
            flat = inp.new_empty((self._size * inp.numel(),))
            self.comm.all_gather_into_tensor(flat, inp.contiguous())
            for r, o in enumerate(outs):
                o.copy_(flat[r * inp.numel() : (r + 1) * inp.numel()].view_as(o))
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        if not input.is_cuda:
            return self._gloo._reduce_scatter_base(output, input)
        self.comm.reduce_scatter_tensor(output, input, _op(opts))
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not input.is_cuda:
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes)
        self.comm.all_to_all_single(output, input, list(output_split_sizes), list(input_split_sizes))
        return _done([output])

    def broadcast(self, tensors, opts=None):
        if not self._cuda(tensors):
            return self._gloo.broadcast(tensors, opts) if opts is not None else self._gloo.broadcast(tensors)
        root = getattr(opts, "rootRank", 0)
        for t in tensors:
            self.comm.broadcast(t, root)
        return _done(tensors)

    def barrier(self, opts=None):
        if self._comm is not None:
            self._comm.barrier()
        return self._gloo.barrier()

    # -- everything else ----------------------------------------------------------------------
    def _unsupported(self, name: str):
        raise NotImplementedError(f"the purlin backend does not implement {name}")

    def allreduce_coalesced(self, *args, **kwargs):
        self._unsupported("allreduce_coalesced")

    def allgather_coalesced(self, *args, **kwargs):
        self._unsupported("allgather_coalesced")

    def reduce(self, *args, **kwargs):
        self._unsupported("reduce")

    def reduce_scatter(self, *args, **kwargs):
        self._unsupported("reduce_scatter (list form; use reduce_scatter_tensor)")

    def alltoall(self, *args, **kwargs):
        self._unsupported("alltoall (list form; use all_to_all_single)")

    def gather(self, *args, **kwargs):
        self._unsupported("gather")

    def scatter(self, *args, **kwargs):
        self._unsupported("scatter")

    def send(self, *args, **kwargs):
        self._unsupported("send")

    def recv(self, *args, **kwargs):
        self._unsupported("recv")

    def recv_anysource(self, *args, **kwargs):
        self._unsupported("recv_anysource")


def _create(store, rank: int, size: int, timeout: timedelta) -> PurlinProcessGroup:
    return PurlinProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Registers the ``purlin`` backend (done on import; registering twice is a no-op)."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, devices=["cuda"])


register()

__all__ = ["NAME", "PurlinProcessGroup", "register"]
