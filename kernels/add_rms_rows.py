"""The residual's update and the next RMS norm in one pass: x += y, then h = RMS(x) times the gain, as bf16 rows.

Issue 37; OmniVoice's BF16 layers (dit_core/gpu/omnivoice.py) add each branch's product to the f32 residual and norm
it for the next linear: in torch an add of mixed types (f32 + bf16, the slow elementwise path), the norm and a
cast, three passes over [R, D] twice a layer. For rows x [R, D] f32 (contiguous, updated in place), y [R, D] bf16 or
f32 (or absent: no add) and a gain w [D]:
  x = x + y
  h = (x * 1/sqrt(mean(x^2) + eps)) * w        (F.rms_norm's math; the sum of squares in another order)
  one rounding to bf16 at the end.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .jit import triton_jit
from .rounding import rounded_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(x, y, weight, eps=1e-6):
    """The math above in plain torch, as the layer ran it: x updated in place, h [R, D] bf16 returned."""
    if y is not None:
        x.add_(y)
    return F.rms_norm(x, (x.shape[-1],), weight, eps).to(torch.bfloat16)


@triton_jit
def _add_rms_rows_kernel(x_ptr, y_ptr, w_ptr, h_ptr, M, D, eps, HAS_Y: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    # Grid (row blocks,): a program takes BLOCK_M rows, walking their D columns twice: the sum (written back into x)
    # and its squares, then the normed rows. The second walk finds the rows in L2.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < M
    at = rows[:, None].to(tl.int64) * D
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in tl.range(0, D, BLOCK_D):
        c = d0 + cols[None, :]
        mask = rmask[:, None] & (c < D)
        x = tl.load(x_ptr + at + c, mask=mask, other=0.0)
        if HAS_Y:
            x = x + tl.load(y_ptr + at + c, mask=mask, other=0.0).to(tl.float32)
            tl.store(x_ptr + at + c, x, mask=mask)
        squares += tl.sum(x * x, axis=1)
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(squares, D * 1.0) + eps))
    for d0 in tl.range(0, D, BLOCK_D):
        c = d0 + cols[None, :]
        mask = rmask[:, None] & (c < D)
        x = tl.load(x_ptr + at + c, mask=mask, other=0.0)
        w = tl.load(w_ptr + d0 + cols, mask=d0 + cols < D, other=0.0)
        tl.store(h_ptr + at + c, rounded_bf16((x * inv[:, None]) * w[None, :]), mask=mask)


def add_rms_rows(x, y, weight, eps=1e-6, *, block_m=4, num_warps=4):
    """x += y in place (y None: no add), then [R, D] bf16: RMS(x) times weight, by this file's docstring."""
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"add_rms_rows: x must be contiguous f32 rows [R, D], got {x.dtype} {tuple(x.shape)}")
    m, d = x.shape
    if (y is not None and (y.shape != x.shape or not y.is_contiguous())) or weight.numel() != d:
        raise ValueError(f"add_rms_rows: y must be contiguous [{m}, {d}] and the gain {d} values, got "
                         f"{None if y is None else tuple(y.shape)} and {weight.numel()}")
    h = torch.empty(m, d, dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return h
    _add_rms_rows_kernel[(triton.cdiv(m, block_m),)](
        x, x if y is None else y, weight.float().contiguous(), h, m, d, eps, HAS_Y=y is not None, BLOCK_M=block_m,
        BLOCK_D=min(1024, triton.next_power_of_2(d)), num_warps=num_warps, enable_fp_fusion=False)
    return h
