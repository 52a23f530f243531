"""Exact roundings inside Triton kernels: f32 to bf16 (nearest, ties to even) and f32 to the nearest integer.

Both are written in integer/f32 arithmetic so the kernels round identically on the GPU and in Triton's CPU
interpreter, whose f32 -> bf16 cast truncates (triton 3.9 runtime/interpreter.py cast_impl), and because the
quantizer must reproduce ComfyUI's roundings bit for bit (reference/int8_convrot_format.md section 5).
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: each kernel file's reference() still imports
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)


@triton_jit
def round_to_bf16(x):
    """x (f32) rounded to the nearest bf16, ties to even, as f32 (finite inputs; what cvt.rn.bf16 does)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton_jit
def round_half_even(x):
    """x (f32, |x| < 2^22) rounded to an integer value, ties to even (torch.round)."""
    # 1.5 * 2^23: the sum has no fraction bits left, so IEEE addition itself rounds (ties to even).
    return (x + 12582912.0) - 12582912.0
