"""The gated residual update with an optional sandwich norm: x += gate[row_map] * rms_norm(y) * post_weight.

Issue 4; dit_core/block.py Block.forward (POST_ATTN / POST_MLP). Z-Image's sandwich norm needs the whole
output row, so it cannot ride in a GEMM's epilogue (the gated form of kernels/int8/linear.py covers the branch
without it). For the residual x [M, N] f32 (in place), a branch output y [M, N] (bf16 or f32), gate rows
[R, N] f32 and row_map [M]:
  n = (y * 1/sqrt(mean(y^2) + eps)) * post_weight          with post_weight; else n = y      (f32)
  x[m] = x[m] + gate[row_map[m]] * n                         (the product rounded, then the sum: no FMA)
With next_rms = (stats [2, M] f32, eps'), also the statistics of the next RMS norm of the updated rows, which
this kernel holds anyway: stats[0] = 0 (the mean an RMS norm leaves), stats[1] = 1/sqrt(mean(x^2) + eps'), the
sum in f32 (order unspecified). kernels/int8/quant.py quantize_rows(stats=) then skips its statistics launch.
(Not done here: this program also rotating its updated row for the next linear, the row's groups as the
rotation's rows, bit-equal, saved a little over the quantizer apart on the H200 but left a Z-Image step's time
unchanged.)
"""
from __future__ import annotations

import torch

from .jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(x, y, gate, row_map, post_weight=None, eps=1e-6, next_rms=None):
    """The math above in plain torch; updates x in place and returns it."""
    n = y.float()
    if post_weight is not None:
        n = (n * (1 / torch.sqrt(n.pow(2).mean(-1, keepdim=True) + eps))) * post_weight.float()
    x.add_(gate.float()[row_map.long()] * n)
    if next_rms is not None:
        stats, next_eps = next_rms
        stats[0].zero_()
        stats[1].copy_(1 / torch.sqrt(x.pow(2).mean(-1) + next_eps))
    return x


@triton_jit
def _gated_residual_kernel(x_ptr, y_ptr, stride_y, gate_ptr, map_ptr, w_ptr, stats_ptr, stride_stats, N, eps,
                           next_eps, HAS_NORM: tl.constexpr, NEXT_RMS: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program per row; it walks the row in BLOCK_N columns (twice with the norm: statistic, then update).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    y_row = y_ptr + row * stride_y
    x_row = x_ptr + row * N
    gate_row = gate_ptr + tl.load(map_ptr + row).to(tl.int64) * N
    inv = 1.0
    if HAS_NORM:
        squares = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c0 in range(0, N, BLOCK_N):
            v = tl.load(y_row + c0 + cols, mask=c0 + cols < N, other=0.0).to(tl.float32)
            squares += v * v
        inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(squares, axis=0), N * 1.0) + eps))
    updated = tl.zeros([BLOCK_N], dtype=tl.float32)  # the next norm's sum of squares (NEXT_RMS)
    for c0 in range(0, N, BLOCK_N):
        mask = c0 + cols < N
        n = tl.load(y_row + c0 + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            n = (n * inv) * tl.load(w_ptr + c0 + cols, mask=mask, other=0.0)
        g = tl.load(gate_row + c0 + cols, mask=mask, other=0.0)
        x = tl.load(x_row + c0 + cols, mask=mask, other=0.0) + g * n
        tl.store(x_row + c0 + cols, x, mask=mask)
        if NEXT_RMS:
            updated += tl.where(mask, x * x, 0.0)
    if NEXT_RMS:
        tl.store(stats_ptr + row, 0.0)
        tl.store(stats_ptr + stride_stats + row,
                 tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(updated, axis=0), N * 1.0) + next_eps)))


def gated_residual(x, y, gate, row_map, post_weight=None, eps=1e-6, next_rms=None, block_n=4096):
    """x (f32 [M, N], in place) += gate[row_map[m]] * (rms_norm(y) * post_weight, or y); returns x. next_rms:
    optional (stats [2, M] f32, eps') filled with the next RMS norm's row statistics of the updated x."""
    m, n = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"gated_residual: the residual x must be contiguous f32 [M, N], got {x.dtype}")
    if y.shape != (m, n) or y.stride(-1) != 1:
        raise ValueError(f"gated_residual: y must be rows [{m}, {n}] with contiguous columns, "
                         f"got {tuple(y.shape)}")
    if gate.dim() != 2 or gate.shape[1] != n or row_map.shape != (m,):
        raise ValueError(f"gated_residual: gate must be [R, {n}] and row_map [{m}]")
    if post_weight is not None and post_weight.shape != (n,):
        raise ValueError(f"gated_residual: post_weight must be [{n}], got {tuple(post_weight.shape)}")
    stats, next_eps = next_rms if next_rms is not None else (x, 0.0)  # stats: never written without next_rms
    if next_rms is not None and (stats.shape != (2, m) or stats.dtype != torch.float32 or stats.stride(1) != 1):
        raise ValueError(f"gated_residual: next_rms statistics must be f32 [2, {m}] with contiguous rows")
    if m == 0:
        return x
    weight = post_weight.float().contiguous() if post_weight is not None else x  # never read without the norm
    _gated_residual_kernel[(m,)](x, y, y.stride(0), gate.float().contiguous(),
                                 row_map.to(torch.int32).contiguous(), weight, stats, stats.stride(0), n, eps,
                                 float(next_eps), HAS_NORM=post_weight is not None, NEXT_RMS=next_rms is not None,
                                 BLOCK_N=min(block_n, triton.next_power_of_2(n)), num_warps=4,
                                 enable_fp_fusion=False)
    return x
