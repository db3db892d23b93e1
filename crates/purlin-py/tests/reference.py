"""The tests' reference, written from the collectives' definitions (never from Purlin): inputs
are small integers, so every summation order is exact in every element type, and expected
outputs are computed here with plain Python integers.

bfloat16 and fp8 travel in same-sized unsigned arrays (numpy has neither type); ``encode`` and
``decode`` convert small integers to and from their bits.
"""

from __future__ import annotations

import math

import numpy as np

# element type → (container dtype, reducible by the Atom, (exponent bits, mantissa bits, bias))
DTYPES = {
    "float32": (np.float32, True, None),
    "float16": (np.float16, True, None),
    "bfloat16": (np.uint16, True, "bf16"),
    "float8_e4m3fn": (np.uint8, True, (4, 3, 7)),
    "float8_e5m2": (np.uint8, True, (5, 2, 15)),
    "int32": (np.int32, True, None),
    "uint32": (np.uint32, True, None),
    "float64": (np.float64, False, None),
    "int8": (np.int8, False, None),
    "uint8": (np.uint8, False, None),
    "int64": (np.int64, False, None),
    "uint64": (np.uint64, False, None),
}
REDUCIBLE = [d for d, (_, r, _) in DTYPES.items() if r]


def _mini(v: int, ebits: int, mbits: int, bias: int) -> int:
    if v == 0:
        return 0
    sign = 0x80 if v < 0 else 0
    v = abs(v)
    e = int(math.floor(math.log2(v)))
    m = (v / 2**e - 1) * 2**mbits
    assert m == int(m), f"{v} is not exact with {mbits} mantissa bits"
    return sign | ((e + bias) << mbits) | int(m)


def _unmini(b: int, ebits: int, mbits: int, bias: int) -> float:
    if b & 0x7F == 0:
        return 0.0
    sign = -1.0 if b & 0x80 else 1.0
    e = (b >> mbits) & ((1 << ebits) - 1)
    m = b & ((1 << mbits) - 1)
    return sign * 2.0 ** (e - bias) * (1 + m / 2**mbits)


def encode(values, dtype: str) -> np.ndarray:
    """Small integers as an array of `dtype`'s container."""
    container, _, fmt = DTYPES[dtype]
    values = [int(v) for v in values]
    if fmt is None:
        return np.array(values, dtype=container)
    if fmt == "bf16":
        return (np.array(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.array([_mini(v, *fmt) for v in values], dtype=np.uint8)


def decode(array: np.ndarray, dtype: str) -> list[float]:
    """An array of `dtype`'s container as Python numbers."""
    _, _, fmt = DTYPES[dtype]
    if fmt is None:
        return [float(x) for x in array.tolist()]
    if fmt == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32).astype(float).tolist()
    return [_unmini(int(b), *fmt) for b in array.tolist()]


def inputs(rank: int, n: int, dtype: str, salt: int = 0) -> list[int]:
    """Rank `rank`'s `n` inputs: nonzero integers in 1..=4 (1..=2 for fp8, whose sums over a
    few ranks must stay exact), positive so unsigned types work, different per rank, position
    and call."""
    top = 2 if dtype.startswith("float8") else 4
    return [1 + (rank * 7 + i * 3 + salt * 5 + (i * i) % 5) % top for i in range(n)]


def reduce(columns: list[list[int]], op: str) -> list[float]:
    """The element-wise reduction over ranks."""
    out = []
    for vals in zip(*columns):
        if op == "sum":
            out.append(float(sum(vals)))
        elif op == "prod":
            out.append(float(math.prod(vals)))
        elif op == "max":
            out.append(float(max(vals)))
        elif op == "min":
            out.append(float(min(vals)))
        elif op == "avg":
            out.append(sum(vals) / len(vals))
        else:
            raise ValueError(op)
    return out
