"""NVML's cumulative energy counter of the GPU a benchmark runs on, in joules, or None where NVML or the counter is
missing (a CPU run, another vendor). The H200 runs our graphed steps and diffusers' at its 700 W limit
(docs/notes/runs.md, 2026-12-03), so a step's joules compare runs on different machines better than its time."""
from __future__ import annotations

from typing import Callable

import torch


def energy_reader(dev: torch.device) -> Callable[[], float] | None:
    """A call giving the joules the device has used since the driver loaded, or None. NVML numbers the GPUs as the
    machine does: with CUDA_VISIBLE_DEVICES set they may differ from torch's (the device has one GPU)."""
    if dev.type != "cuda":
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(dev.index if dev.index is not None else torch.cuda.current_device())
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # noqa: BLE001 (no NVML, or a GPU without the counter: the benchmark runs without joules)
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
