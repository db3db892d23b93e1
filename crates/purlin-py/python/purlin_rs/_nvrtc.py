"""Where the kernels' compiler comes from: libnvrtc.so.13 from the NVRTC wheel.

Purlin compiles its kernels at run time with NVRTC 13.0 and finds libnvrtc by absolute path
(``PURLIN_NVRTC_DIR``, ``CUDA_HOME``, ``/usr/local/cuda``, then Python's site-packages). The
interpreter that imports this package knows its own site-packages best: when
``PURLIN_NVRTC_DIR`` is unset, this points it at ``nvidia/cu13/lib`` of the installed
``nvidia-cuda-nvrtc`` wheel (torch's cu130 wheels bring one) where that holds the library.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ENV = "PURLIN_NVRTC_DIR"
LIBRARY = "libnvrtc.so.13"


def wheel_dir() -> Path | None:
    """The NVRTC wheel's library folder, if an installed ``nvidia`` package holds it."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None:
        return None
    for root in spec.submodule_search_locations or []:
        for sub in ("cu13/lib", "cuda_nvrtc/lib"):
            lib = Path(root) / sub
            if (lib / LIBRARY).exists():
                return lib
    return None


def configure() -> str | None:
    """Sets ``PURLIN_NVRTC_DIR`` from the wheel unless it is set; returns the folder used."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    found = wheel_dir()
    if found is not None:
        os.environ[ENV] = str(found)
        return str(found)
    return None
