"""The regular Hadamard of ConvRot's groups and its 256-point form on the matrix cores (kernels/int8/quant.py's
rotate pass).

Issue 4; reference/int8_convrot_format.md section 3 (the Hadamard matrix): H_g = H4^(x log4 g) / sqrt(g),
H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]], entries +-1/sqrt(g), exact in bf16. H_256 = H4 (x) H_64: a
256-column group u = [u0 u1 u2 u3] (64 columns each) rotates as z_a = u_a (H_64 / 2) on the matrix cores (bf16
operands: exact products, f32 sums), then y_s = sum_a H4[a, s] z_a (a radix-4 butterfly): a quarter of the
products of a dense H_256, and H_64 (8 KB) instead of 128 KB of shared memory.
"""
from __future__ import annotations

import functools
import math

import torch

from ..rounding import round_to_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: hadamard() still imports
    triton = tl = None


def hadamard(group: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The regular Hadamard H4^(x log4 g) / sqrt(g) (format doc section 3, the Hadamard matrix):
    dit_core.weights.hadamard, rebuilt because kernels/ imports nothing of dit_core, its sibling package
    inside ComfyUI."""
    h = h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    while h.shape[0] < group:
        h = torch.kron(h, h4)
    return (h / math.sqrt(group)).to(dtype)


@functools.cache
def hadamard_bf16(size: int, device: torch.device, halved: bool = False) -> torch.Tensor:
    """H_size in bf16 (exact), contiguous on device: the kernels' operand. halved: H_size / 2 (entries +-1/16 for
    64, exact too), radix4_rounded's operand."""
    return (hadamard(size, torch.float64) / (2 if halved else 1)).to(torch.bfloat16).to(device).contiguous()


@triton_jit
def radix4_rounded(z0, z1, z2, z3):
    """The four 64-column blocks of u H_256 from z_a = u_a (H_64 / 2), each rounded to bf16 (held in f32): output
    block s weighs z0..z3 by column s of H4 (1/sqrt(256) = 1/sqrt(64) * 1/2, the half taken in the operand: halving
    a product or an f32 sum is exact, so this is (sum_a H4[a, s] u_a H_64) / 2 bit for bit, without a multiply a
    value in a pass bound by its instruction issue)."""
    p, m, r, t = z0 + z1, z2 - z3, z0 - z1, z2 + z3
    return round_to_bf16(p + m), round_to_bf16(p - m), round_to_bf16(r + t), round_to_bf16(t - r)
