"""SwiGLU of [gate | up] rows in one pass: silu(gate) times up, as bf16 rows.

Issue 37; OmniVoice's BF16 MLP (dit_core/gpu/omnivoice.py) takes UP's product [R, 2 F] bf16 as [gate | up] halves;
in torch silu on the gate half and the product with the up half are two passes (and a [R, F] bf16 temporary). For
u [R, 2 F] bf16 (rows contiguous), as torch rounds it in bf16:
  s = bf16(g * sigmoid(g))           (silu in f32 of the bf16 gate, rounded)
  out = bf16(s * up)                 (the product in f32, rounded)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .jit import triton_jit
from .rounding import round_to_bf16, rounded_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(u, ffn):
    """The math above in plain torch, as the layer ran it: [R, F] in u's dtype."""
    return F.silu(u[:, :ffn]) * u[:, ffn:]


@triton_jit
def _swiglu_rows_kernel(u_ptr, out_ptr, M, F_, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    # Grid (row blocks, column blocks): each program one [BLOCK_M, BLOCK_F] tile of the output.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < M)[:, None] & (cols < F_)[None, :]
    src = u_ptr + rows[:, None].to(tl.int64) * (2 * F_) + cols[None, :]
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + F_, mask=mask, other=0.0).to(tl.float32)
    s = round_to_bf16(g * tl.math.div_rn(1.0, 1.0 + tl.exp(-g)))
    tl.store(out_ptr + rows[:, None].to(tl.int64) * F_ + cols[None, :], rounded_bf16(s * up), mask=mask)


def swiglu_rows(u, ffn, *, block_m=8, block_n=256, num_warps=4):
    """[R, ffn] bf16 from u [R, 2 ffn] bf16 by this file's docstring."""
    if u.dim() != 2 or u.shape[1] != 2 * ffn or u.dtype != torch.bfloat16 or not u.is_contiguous():
        raise ValueError(f"swiglu_rows: u must be contiguous bf16 rows [R, {2 * ffn}], got {u.dtype} "
                         f"{tuple(u.shape)}")
    m = u.shape[0]
    out = torch.empty(m, ffn, dtype=torch.bfloat16, device=u.device)
    if m:
        _swiglu_rows_kernel[(triton.cdiv(m, block_m), triton.cdiv(ffn, block_n))](
            u, out, m, ffn, BLOCK_M=block_m, BLOCK_F=block_n, num_warps=num_warps, enable_fp_fusion=False)
    return out
