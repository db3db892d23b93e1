#!/bin/bash
# One device call: the machine's link limits and NCCL's figures, for the same-day comparison.
# Usage on the device: bash calibration/run.sh inside a round made by `cargo xtask gpu-round`.
cd "$(dirname "$0")"
nvidia-smi topo -m
PYTHONUNBUFFERED=1 python3 p2p.py 2>&1 | grep -vE 'Exception ignored|Traceback|AttributeError|File "'
PYTHONUNBUFFERED=1 python3 -m torch.distributed.run --nproc-per-node "$(nvidia-smi -L | wc -l)" nccl_torch.py 2>&1 | grep -viE 'warning|OMP_NUM_THREADS|\*\*\*\*'
