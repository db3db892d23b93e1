"""What the CPU and GPU communicators share: reduce operations, split sizes, argument checks."""

from __future__ import annotations

import enum
from typing import Sequence

from ._purlin import InvalidArgumentError


class ReduceOp(str, enum.Enum):
    """Reduce operations (torch.distributed's names; torch's own ``ReduceOp`` works too)."""

    SUM = "sum"
    PRODUCT = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


_TORCH_OP_NAMES = {"SUM": "sum", "PRODUCT": "prod", "MAX": "max", "MIN": "min", "AVG": "avg"}


def op_name(op) -> str:
    """The operation's name for the extension: a :class:`ReduceOp`, a string, or torch's
    ``ReduceOp`` (``torch.distributed.ReduceOp.SUM`` and friends)."""
    if isinstance(op, ReduceOp):
        return op.value
    if isinstance(op, str):
        name = op.lower()
        if name in ("sum", "prod", "product", "max", "min", "avg", "mean"):
            return {"product": "prod", "mean": "avg"}.get(name, name)
        raise InvalidArgumentError(f"unknown reduce operation {op!r}")
    text = str(op).rsplit(".", 1)[-1].upper()
    if text in _TORCH_OP_NAMES:
        return _TORCH_OP_NAMES[text]
    raise InvalidArgumentError(f"unsupported reduce operation {op!r}")


def splits(sizes: Sequence[int] | None, total: int, world: int, what: str) -> list[int]:
    """torch's split sizes: ``None`` means equal parts of ``total``; else ``world``
    non-negative sizes summing to ``total``."""
    if sizes is None or len(sizes) == 0:
        if total % world:
            raise InvalidArgumentError(f"{what}: {total} elements do not split into {world} equal parts")
        return [total // world] * world
    sizes = [int(s) for s in sizes]
    if len(sizes) != world:
        raise InvalidArgumentError(f"{what}: {len(sizes)} split sizes for a world of {world}")
    if any(s < 0 for s in sizes):
        raise InvalidArgumentError(f"{what}: negative split size in {sizes}")
    if sum(sizes) != total:
        raise InvalidArgumentError(f"{what}: split sizes {sizes} sum to {sum(sizes)}, not {total}")
    return sizes


def rank_arg(value: int, world: int, what: str) -> int:
    """A rank argument (root, peer) checked against the world."""
    value = int(value)
    if not 0 <= value < world:
        raise InvalidArgumentError(f"{what}: rank {value} is outside a world of {world}")
    return value


class Buf:
    """One buffer as the extension takes it: address, elements, element type and size."""

    __slots__ = ("address", "numel", "dtype", "itemsize")

    def __init__(self, address: int, numel: int, dtype: str, itemsize: int):
        self.address, self.numel, self.dtype, self.itemsize = int(address), int(numel), dtype, int(itemsize)

    def pair(self) -> tuple[int, int]:
        return (self.address, self.numel)

    def overlaps(self, other: "Buf") -> bool:
        if self.numel == 0 or other.numel == 0:
            return False
        a0, a1 = self.address, self.address + self.numel * self.itemsize
        b0, b1 = other.address, other.address + other.numel * other.itemsize
        return a0 < b1 and b0 < a1


NONE = Buf(0, 0, "", 1)


def _pack(values: Sequence[int]) -> bytes:
    return b"".join(int(v).to_bytes(8, "little", signed=True) for v in values)


def _unpack(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 8], "little", signed=True) for i in range(0, len(data), 8)]


class Collectives:
    """The collectives, named and shaped as torch.distributed's tensor API, over a backend
    that says how to see a buffer (``_buffer``), run a call (``_launch``) and exchange a few
    bytes among the ranks (``_exchange``). Every rank makes the same calls in the same order."""

    rank: int
    world_size: int

    # -- what a backend provides -------------------------------------------------------------
    def _buffer(self, x, what: str, writable: bool, dtype=None) -> Buf:  # pragma: no cover
        raise NotImplementedError

    def _launch(self, kind: str, send: Buf, recv: Buf, **kw) -> None:  # pragma: no cover
        raise NotImplementedError

    def _exchange(self, data: bytes) -> list[bytes]:  # pragma: no cover
        raise NotImplementedError

    # -- helpers ------------------------------------------------------------------------------
    def _pair(self, output, input, what: str, dtype=None, in_place=None) -> tuple[Buf, Buf]:
        """Output and input; they may overlap only as the call's in-place form lays them out
        (``in_place(output, input)`` says whether they are)."""
        o = self._buffer(output, f"{what}: output", True, dtype)
        i = self._buffer(input, f"{what}: input", False, dtype)
        if o.dtype != i.dtype:
            raise InvalidArgumentError(f"{what}: input is {i.dtype}, output is {o.dtype}")
        if o.overlaps(i) and not (in_place is not None and in_place(o, i)):
            raise InvalidArgumentError(f"{what}: the output overlaps the input (use the call's in-place form)")
        return o, i

    # -- the collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor, op=ReduceOp.SUM, *, output=None, dtype=None):
        """AllReduce (torch's ``all_reduce``): in place on ``tensor``, or into ``output`` (same
        size) when given. Returns the result buffer."""
        op = op_name(op)
        if output is None or output is tensor:
            b = self._buffer(tensor, "all_reduce", True, dtype)
            self._launch("all_reduce_in_place", NONE, b, op=op)
            return tensor
        o, i = self._pair(output, tensor, "all_reduce", dtype, lambda o, i: (o.address, o.numel) == (i.address, i.numel))
        self._launch("all_reduce_in_place" if o.address == i.address else "all_reduce", i, o, op=op)
        return output

    def all_gather_into_tensor(self, output, input, *, dtype=None):
        """AllGather: ``output`` holds ``world_size`` × ``input``, rank r's at part r. In place
        when ``input`` is part ``rank`` of ``output`` (torch's convention)."""
        def in_place(o: Buf, i: Buf) -> bool:
            return i.address == o.address + self.rank * i.numel * i.itemsize and o.numel == i.numel * self.world_size

        o, i = self._pair(output, input, "all_gather_into_tensor", dtype, in_place)
        if in_place(o, i):
            self._launch("all_gather_in_place", NONE, o)
        else:
            self._launch("all_gather", i, o)
        return output

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, *, dtype=None):
        """ReduceScatter: ``input`` holds ``world_size`` × ``output``; rank r receives the
        reduction of part r. In place when ``output`` is part ``rank`` of ``input``."""
        op = op_name(op)
        def in_place(o: Buf, i: Buf) -> bool:
            return o.address == i.address + self.rank * o.numel * o.itemsize and i.numel == o.numel * self.world_size

        o, i = self._pair(output, input, "reduce_scatter_tensor", dtype, in_place)
        if in_place(o, i):
            self._launch("reduce_scatter_in_place", NONE, i, op=op)
        else:
            self._launch("reduce_scatter", i, o, op=op)
        return output

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, *, dtype=None):
        """AllToAll (torch's ``all_to_all_single``): with no split sizes, equal parts; with them,
        part d of ``input`` (``input_split_sizes[d]`` elements) goes to rank d, and part s of
        ``output`` (``output_split_sizes[s]``) comes from rank s. Split sizes are exchanged
        among the ranks (a host exchange) to form the whole traffic matrix Purlin plans from."""
        o, i = self._pair(output, input, "all_to_all_single", dtype)
        w = self.world_size
        if not output_split_sizes and not input_split_sizes:
            if i.numel != o.numel or i.numel % w:
                raise InvalidArgumentError(
                    f"all_to_all_single: input of {i.numel} and output of {o.numel} elements do not split "
                    f"into {w} equal parts"
                )
            self._launch("all_to_all", i, o)
            return output
        send = splits(input_split_sizes, i.numel, w, "all_to_all_single: input_split_sizes")
        recv = splits(output_split_sizes, o.numel, w, "all_to_all_single: output_split_sizes")
        rows = [_unpack(row) for row in self._exchange(_pack(send + recv))]
        matrix = [row[:w] for row in rows]
        # Every rank checks every pair, so all of them refuse a disagreement, none waits.
        for d in range(w):
            for s in range(w):
                if rows[d][w + s] != matrix[s][d]:
                    raise InvalidArgumentError(
                        f"all_to_all_single: rank {d} expects {rows[d][w + s]} elements from rank {s}, "
                        f"which sends {matrix[s][d]}"
                    )
        self._launch("all_to_all_v", i, o, matrix=matrix)
        return output

    def all_gather_v(self, output, input, counts: Sequence[int], *, dtype=None):
        """AllGatherV: rank r contributes ``counts[r]`` elements; ``output`` holds them all in
        rank order (every rank passes the same counts)."""
        o, i = self._pair(output, input, "all_gather_v", dtype)
        self._launch("all_gather_v", i, o, counts=[int(c) for c in counts])
        return output

    def reduce_scatter_v(self, output, input, counts: Sequence[int], op=ReduceOp.SUM, *, dtype=None):
        """ReduceScatterV: ``input`` is cut into parts of ``counts[p]`` elements; rank r receives
        the reduction of part r."""
        o, i = self._pair(output, input, "reduce_scatter_v", dtype)
        self._launch("reduce_scatter_v", i, o, op=op_name(op), counts=[int(c) for c in counts])
        return output

    def all_to_all_v(self, output, input, counts: Sequence[Sequence[int]], *, dtype=None):
        """AllToAllV with the whole matrix: ``counts[s][d]`` elements go from rank s to rank d
        (every rank passes the same matrix)."""
        o, i = self._pair(output, input, "all_to_all_v", dtype)
        self._launch("all_to_all_v", i, o, matrix=[[int(c) for c in row] for row in counts])
        return output

    def broadcast(self, tensor, src: int, *, dtype=None):
        """Broadcast from rank ``src``, in place (torch's ``broadcast``)."""
        src = rank_arg(src, self.world_size, "broadcast: src")
        b = self._buffer(tensor, "broadcast", True, dtype)
        self._launch("broadcast_in_place", NONE, b, root=src)
        return tensor

    def reduce(self, tensor, dst: int, op=ReduceOp.SUM, *, dtype=None):
        """Reduce to rank ``dst``, in place (torch's ``reduce``): ``dst``'s ``tensor`` receives
        the reduction; the others' are left as they were."""
        dst = rank_arg(dst, self.world_size, "reduce: dst")
        b = self._buffer(tensor, "reduce", True, dtype)
        self._launch("reduce_in_place", NONE, b, op=op_name(op), root=dst)
        return tensor

    def send(self, tensor, dst: int, *, dtype=None) -> None:
        """Sends ``tensor`` to rank ``dst`` (world 2: the pair is the whole world)."""
        dst = rank_arg(dst, self.world_size, "send: dst")
        b = self._buffer(tensor, "send", False, dtype)
        self._launch("send", b, Buf(0, 0, b.dtype, b.itemsize), root=dst)

    def recv(self, tensor, src: int, *, dtype=None):
        """Receives ``tensor`` from rank ``src`` (its matching ``send``)."""
        src = rank_arg(src, self.world_size, "recv: src")
        b = self._buffer(tensor, "recv", True, dtype)
        self._launch("recv", Buf(0, 0, b.dtype, b.itemsize), b, root=src)
        return tensor

    def barrier(self) -> None:
        """Every rank arrives before any leaves (a host exchange)."""
        self._exchange(b"")
