"""The GPU kernels' table: op -> (Triton launcher, plain-torch reference, capability check), logged fallback.

Nothing is swapped at import: `run(op, ...)` asks the op's capability check about the inputs' device on each
call and calls the launcher, or else the reference (logging why, once per op and reason). Launchers and
references of one op take the same arguments (launchers add only launch-shape keywords).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import attention, gated_residual, head_norm_rope, int8_linear, int8_quant, qkv_rope_linear

log = logging.getLogger(__name__)


def needs_triton_gpu(device: torch.device) -> str | None:
    """None when Triton kernels can run on device, else why not."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"inputs on {device.type}, Triton kernels need a CUDA GPU"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    return None


def needs_int8_mma(device: torch.device) -> str | None:
    """As needs_triton_gpu, and INT8 matrix cores Triton can use (compute capability 8.0 or newer)."""
    reason = needs_triton_gpu(device)
    if reason is None and torch.cuda.get_device_capability(device) < (8, 0):
        reason = f"compute capability {torch.cuda.get_device_capability(device)} < 8.0 (INT8 tl.dot)"
    return reason


def needs_cuda(device: torch.device) -> str | None:
    """None on a CUDA device (SDPA's fast back ends), else why not."""
    return None if device.type == "cuda" else f"inputs on {device.type}, SDPA's fused back ends need CUDA"


@dataclass(frozen=True)
class Op:
    launcher: Callable
    reference: Callable
    capable: Callable[[torch.device], str | None]


OPS = {
    "quantize_rows": Op(int8_quant.quantize_rows, int8_quant.reference, needs_triton_gpu),
    "int8_linear": Op(int8_linear.int8_linear, int8_linear.reference, needs_int8_mma),
    "int8_linear_gated": Op(int8_linear.int8_linear_gated, int8_linear.reference, needs_int8_mma),
    "qkv_rope_linear": Op(qkv_rope_linear.qkv_rope_linear, qkv_rope_linear.reference, needs_int8_mma),
    "head_norm_rope": Op(head_norm_rope.head_norm_rope, head_norm_rope.reference, needs_triton_gpu),
    "attention": Op(attention.attention, attention.reference, needs_cuda),
    "gated_residual": Op(gated_residual.gated_residual, gated_residual.reference, needs_triton_gpu),
}


@functools.cache
def _log_fallback(op: str, reason: str) -> None:
    log.warning("swiftdit kernels: %s runs its plain-torch reference (%s)", op, reason)


def run(op: str, *args, **kwargs):
    """op's launcher when its capability check passes for the first tensor argument's device, else its
    reference."""
    entry = OPS[op]
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    reason = entry.capable(device)
    if reason is None:
        return entry.launcher(*args, **kwargs)
    _log_fallback(op, reason)
    return entry.reference(*args, **kwargs)
