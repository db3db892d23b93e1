"""Purlin from Python: single-kernel intra-node GPU collectives for PyTorch.

Distribution ``purlin-rs``, import ``purlin_rs`` (PyPI's ``purlin`` is the reference package
that Purlin re-implements). Importing needs neither torch nor numpy:

- :class:`Comm` — a GPU communicator over torch tensors, calls named as torch.distributed's
  (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
  ``all_to_all_single``, ...), each enqueued on torch's current stream;
- :class:`CpuComm` — the same calls on numpy arrays, ranks as threads of one process (the
  host executor; what CI tests the binding with);
- :mod:`purlin_rs.backend` — the ``purlin`` torch.distributed backend;
- :mod:`purlin_rs.compat` — the reference package's function signatures;
- :mod:`purlin_rs.ops` — ``torch.library`` custom ops (``torch.compile``, CUDA graphs).

Errors are :class:`PurlinError` subclasses carrying ``rank`` and ``peer``.
"""

from __future__ import annotations

from . import _nvrtc

_nvrtc.configure()

from . import _purlin  # noqa: E402
from ._purlin import (  # noqa: E402
    DriverError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
    PeerFailedError,
    PeerLostError,
    PlanError,
    PoisonedError,
    ProtocolError,
    PurlinError,
    SetupError,
    SpecError,
    TimeoutError,
    UnsupportedError,
    driver_present,
    new_id,
)
from ._common import ReduceOp  # noqa: E402
from .cpu import CpuComm  # noqa: E402

MAX_WORLD: int = _purlin.MAX_WORLD

# Every Purlin exception has `rank` and `peer` (None where unknown or not about a peer);
# Purlin's own errors set them, argument checks in Python leave these defaults.
PurlinError.rank = None
PurlinError.peer = None

__all__ = [
    "Comm",
    "CpuComm",
    "ReduceOp",
    "MAX_WORLD",
    "PurlinError",
    "InvalidArgumentError",
    "UnsupportedError",
    "SpecError",
    "PlanError",
    "PeerError",
    "TimeoutError",
    "PeerLostError",
    "PeerFailedError",
    "MismatchError",
    "PoisonedError",
    "DriverError",
    "SetupError",
    "ProtocolError",
    "driver_present",
    "new_id",
]


def __getattr__(name: str):
    # torch is imported on first use of the GPU communicator, never by `import purlin_rs`.
    if name == "Comm":
        from .gpu import Comm

        return Comm
    raise AttributeError(f"module 'purlin_rs' has no attribute {name!r}")
