"""Exact roundings inside Triton kernels: f32 to bf16 (nearest, ties to even) and f32 to the nearest integer.

The quantizer must reproduce ComfyUI's roundings bit for bit (reference/int8_convrot_format.md section 5,
quantization numerics). On the GPU f32 -> bf16 is the hardware's cvt.rn.bf16.f32 (one instruction, the
rounding asked for); Triton's CPU interpreter truncates in that cast (triton 3.9 runtime/interpreter.py
cast_impl), so there it is written in integer arithmetic (five instructions: the rotate and codes passes are
issue-bound, so on the GPU that form cost time).
"""
from __future__ import annotations

import os

from .jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: each kernel file's reference() still imports
    triton = tl = None


# As triton.jit reads it when the kernels are defined (at import, as here).
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1") if tl is not None else True


@triton_jit
def round_to_bf16(x):
    """x (f32) rounded to the nearest bf16, ties to even, as f32 (finite inputs; what cvt.rn.bf16 does)."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = bits.to(tl.float32, bitcast=True)
    else:
        rounded = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    return rounded


@triton_jit
def rounded_bf16(x):
    """x (f32) as a bf16 tensor, rounded to nearest, ties to even (what the kernels store)."""
    if INTERPRETED:
        rounded = round_to_bf16(x).to(tl.bfloat16)
    else:
        rounded = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    return rounded


@triton_jit
def round_half_even(x):
    """x (f32, |x| < 2^22) rounded to an integer value, ties to even (torch.round)."""
    # 1.5 * 2^23: the sum has no fraction bits left, so IEEE addition itself rounds (ties to even).
    return (x + 12582912.0) - 12582912.0
