"""The GPU kernels' table: op -> (Triton launcher, plain-torch reference, capability check, Hopper kernels), logged
fallback.

Nothing is swapped at import: `run(op, ..., choices=...)` asks the op's capability check about the inputs' device on
each call and calls the launcher, or else the reference (logging why, once per op and reason). Launchers and
references of one op take the same arguments (launchers add only launch-shape keywords and `choices`). An op's
Hopper kernels (sm_90, Gluon) are named in its row by the Choices that pick them: run() leaves those on only where
needs_hopper passes and the caller's choices (kernels/choices.py) want them, and the launcher takes them where
the operands fit, Triton's kernels otherwise.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from . import (add_rms_rows, attention, channel_rms, gated_residual, group_norm, head_norm_rope, modulated_norm,
               process_builds, rows_norm_rope, swiglu_rows)
from .int8 import linear, linear_hopper, qkv_rope_linear, quant, tiles
from .choices import DEFAULT, Choices

log = logging.getLogger(__name__)


@functools.cache  # the capability checks are asked on every run() (thousands a step): answered once a device
def needs_triton_gpu(device: torch.device) -> str | None:
    """None when Triton kernels can run on device, else why not."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"inputs on {device.type}, Triton kernels need a CUDA GPU"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    return None


@functools.cache
def needs_int8_mma(device: torch.device) -> str | None:
    """As needs_triton_gpu, and INT8 matrix cores Triton can use (compute capability 8.0 or newer)."""
    reason = needs_triton_gpu(device)
    if reason is None and torch.cuda.get_device_capability(device) < (8, 0):
        reason = f"compute capability {torch.cuda.get_device_capability(device)} < 8.0 (INT8 tl.dot)"
    return reason


@functools.cache
def needs_cuda(device: torch.device) -> str | None:
    """None on a CUDA device (SDPA's fast back ends), else why not."""
    return None if device.type == "cuda" else f"inputs on {device.type}, SDPA's fused back ends need CUDA"


@functools.cache
def needs_hopper(device: torch.device) -> str | None:
    """As needs_int8_mma, and the Hopper kernels' Gluon (sm_90's wgmma and TMA; not in the interpreter)."""
    reason = needs_int8_mma(device)
    if reason is None and (linear_hopper.gluon is None or os.environ.get("TRITON_INTERPRET") == "1"):
        reason = "no Gluon in this Triton, or interpreted"
    if reason is None and torch.cuda.get_device_capability(device) != (9, 0):
        reason = f"compute capability {torch.cuda.get_device_capability(device)}, not Hopper's (9, 0)"
    return reason


def build_in_processes(held: list[tuple], workers: int) -> None:
    """Held Triton kernels (JITFunction, specialization) built by worker processes into Triton's on-disk cache."""
    process_builds.build_in_processes(held, workers)


def fixed_tiles_here(device: torch.device) -> bool:
    """Whether the INT8 linears launch fixed tiles on device (Hopper) rather than autotune on first use."""
    return needs_int8_mma(device) is None and tiles.fixed_tiles(0, device, 16) is not None


@dataclass(frozen=True)
class Op:
    """hopper: the Choices fields naming the op's Hopper kernels (needs_hopper); an op with any, or takes_choices,
    takes choices."""
    launcher: Callable
    reference: Callable
    capable: Callable[[torch.device], str | None]
    hopper: tuple[str, ...] = ()
    takes_choices: bool = False


OPS = {
    # plain hidden rows: kernels/int8/quant_hopper.py; turned rows: kernels/int8/quant_turned_hopper.py
    "quantize_rows": Op(quant.quantize_rows, quant.reference, needs_triton_gpu,
                        hopper=("hopper_quant", "hopper_turned_quant")),
    # kernels/int8/linear_hopper.py, each
    "int8_linear": Op(linear.int8_linear, linear.reference, needs_int8_mma, hopper=("hopper_gemm",)),
    "int8_linear_gated": Op(linear.int8_linear_gated, linear.reference, needs_int8_mma,
                            hopper=("hopper_gemm",)),
    "qkv_rope_linear": Op(qkv_rope_linear.qkv_rope_linear, qkv_rope_linear.reference, needs_int8_mma,
                          hopper=("hopper_gemm",)),
    "head_norm_rope": Op(head_norm_rope.head_norm_rope, head_norm_rope.reference, needs_triton_gpu),
    "rows_norm_rope": Op(rows_norm_rope.rows_norm_rope, rows_norm_rope.reference, needs_triton_gpu,
                         takes_choices=True),
    "modulated_norm": Op(modulated_norm.modulated_norm, modulated_norm.reference, needs_triton_gpu),
    "add_rms_rows": Op(add_rms_rows.add_rms_rows, add_rms_rows.reference, needs_triton_gpu),
    "swiglu_rows": Op(swiglu_rows.swiglu_rows, swiglu_rows.reference, needs_triton_gpu),
    "attention": Op(attention.attention, attention.reference, needs_cuda, takes_choices=True),
    "gated_residual": Op(gated_residual.gated_residual, gated_residual.reference, needs_triton_gpu),
    "group_norm": Op(group_norm.group_norm, group_norm.reference, needs_triton_gpu),
    "channel_rms": Op(channel_rms.channel_rms, channel_rms.reference, needs_triton_gpu),
}


@functools.cache
def _log_fallback(op: str, reason: str) -> None:
    log.warning("swiftdit kernels: %s runs its plain-torch reference (%s)", op, reason)


@functools.cache
def _without(choices: Choices, hopper: tuple[str, ...]) -> Choices:
    """choices with the named Hopper kernels off (made once a pair: run() asks on every call)."""
    return replace(choices, **dict.fromkeys(hopper, False))


def run(op: str, *args, choices: Choices | None = None, **kwargs):
    """op's launcher when its capability check passes for the first tensor argument's device, else its
    reference. choices: which kernels of equal math run (kernels/choices.py; None: DEFAULT), given to the
    launchers of ops with Hopper kernels, those kernels off where needs_hopper fails."""
    entry, choices = OPS[op], DEFAULT if choices is None else choices
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    reason = entry.capable(device)
    if reason is None:
        if not (entry.hopper or entry.takes_choices):
            return entry.launcher(*args, **kwargs)
        if entry.hopper and needs_hopper(device) is not None:
            choices = _without(choices, entry.hopper)
        return entry.launcher(*args, choices=choices, **kwargs)
    _log_fallback(op, reason)
    return entry.reference(*args, **kwargs)
