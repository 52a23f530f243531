"""The gated residual update with an optional sandwich norm: x += gate[row_map] * rms_norm(y) * post_weight.

Issue 4; dit_core/block.py Block.forward (POST_ATTN / POST_MLP). Z-Image's sandwich norm needs the whole
output row, so it cannot ride in a GEMM's epilogue (the gated form of kernels/int8_linear.py covers the branch
without it). For the residual x [M, N] f32 (in place), a branch output y [M, N] (bf16 or f32), gate rows
[R, N] f32 and row_map [M]:
  n = (y * 1/sqrt(mean(y^2) + eps)) * post_weight          with post_weight; else n = y      (f32)
  x[m] = x[m] + gate[row_map[m]] * n                         (the product rounded, then the sum: no FMA)
With next_rms = (stats [2, M] f32, eps'), also the statistics of the next RMS norm of the updated rows, which
this kernel holds anyway: stats[0] = 0 (the mean an RMS norm leaves), stats[1] = 1/sqrt(mean(x^2) + eps'), the
sum in f32 (order unspecified). kernels/int8_quant.py quantize_rows(stats=) then skips its statistics launch.
gated_residual_quantized goes further: the same program also rotates its updated row for the next linear, as
quantize_rows(x, g, norm="rms", norm_weight, scale, shift, row_map, stats=those statistics) does (the same f32 and bf16
steps: codes bit for bit equal), storing the bf16 rotated row and its absmax for int8_codes.py's launch. The rotate
pass's read of the f32 rows (4 bytes a value, 70 MB at Z-Image's 4608 x 3840) and its launch go: the row is re-read
from L2, where this program has just stored it. Its g-feature groups stand as the rows of int8_quant.py's rotation
(a row's groups are [K / g, g] at stride g), so the matrix-core rotation is int8_quant.py's own.
"""
from __future__ import annotations

import torch

from . import int8_quant
from .int8_codes import launch_codes

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)


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


def reference_quantized(x, y, gate, row_map, post_weight, eps, next_eps, group, norm_weight=None, scale=None,
                        shift=None, out=None):
    """gated_residual_quantized's math in plain torch: x updated in place; (codes, scales) of its next RMS norm's
    modulated rows."""
    reference(x, y, gate, row_map, post_weight, eps)
    return int8_quant.reference(x, group, norm="rms", norm_weight=norm_weight, eps=next_eps, scale=scale, shift=shift,
                                row_map=row_map, out=out)


@triton_jit
def _gated_residual_kernel(x_ptr, y_ptr, stride_y, gate_ptr, map_ptr, w_ptr, stats_ptr, stride_stats, N, eps,
                           next_eps, nw_ptr, scale_ptr, shift_ptr, h_ptr, rot_ptr, gmax_ptr, HAS_NORM: tl.constexpr,
                           NEXT_RMS: tl.constexpr, BLOCK_N: tl.constexpr, QUANTIZE: tl.constexpr, G: tl.constexpr,
                           GROUPS_P2: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SCALE: tl.constexpr,
                           HAS_SHIFT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # One program per row; it walks the row in BLOCK_N columns (twice with the norm: statistic, then update).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    y_row = y_ptr + row * stride_y
    x_row = x_ptr + row * N
    mod_row = tl.load(map_ptr + row).to(tl.int64) * N
    gate_row = gate_ptr + mod_row
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
        next_inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(updated, axis=0), N * 1.0) + next_eps))
        tl.store(stats_ptr + row, 0.0)
        tl.store(stats_ptr + stride_stats + row, next_inv)
        if QUANTIZE:
            # The updated row, read back from L2 (every thread's stores issued first), as [groups, G]: the groups
            # are the rows of int8_quant.py's rotation, whose gathers of the gain and modulation then take column
            # g G + c of this row's vectors (index `groups` with row length G).
            tl.debug_barrier()
            SPLIT: tl.constexpr = 4 if G == 256 else 1
            Q: tl.constexpr = G // SPLIT
            hq = tl.arange(0, Q)
            h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
            groups = tl.arange(0, GROUPS_P2)
            gmask = groups < N // G
            y0, y1, y2, y3 = int8_quant._rotate_group(
                x_row, G, groups, gmask, groups, 0, tl.zeros([GROUPS_P2], dtype=tl.float32),
                tl.zeros([GROUPS_P2], dtype=tl.float32) + next_inv, nw_ptr, scale_ptr + mod_row, shift_ptr + mod_row, h,
                G, 1, 2 * HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, 0, False, Q, SPLIT, DOT_DTYPE)
            rot_row = rot_ptr + row * N
            int8_quant._store_rotated(rot_row, groups, gmask, hq, y0, G)
            if SPLIT == 4:
                int8_quant._store_rotated(rot_row, groups, gmask, Q + hq, y1, G)
                int8_quant._store_rotated(rot_row, groups, gmask, 2 * Q + hq, y2, G)
                int8_quant._store_rotated(rot_row, groups, gmask, 3 * Q + hq, y3, G)
            top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
            tl.store(gmax_ptr + row, tl.max(tl.max(top, axis=1), axis=0))


def _checked(x, y, gate, row_map, post_weight, next_rms) -> None:
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
    stats = next_rms[0] if next_rms is not None else None
    if stats is not None and (stats.shape != (2, m) or stats.dtype != torch.float32 or stats.stride(1) != 1):
        raise ValueError(f"gated_residual: next_rms statistics must be f32 [2, {m}] with contiguous rows")


def _launch(x, y, gate, row_map, post_weight, eps, stats, next_eps, block_n, quantized=None, num_warps=4) -> None:
    """The kernel over every row; quantized: (group, norm_weight, scale, shift, rotated, group_max) or None."""
    m, n = x.shape
    weight = post_weight.float().contiguous() if post_weight is not None else x  # never read without the norm
    group, norm_weight, scale, shift, rotated, gmax = quantized or (16, None, None, None, x, x)
    vectors = [x if t is None else t.float().contiguous() for t in (norm_weight, scale, shift)]  # x: never read
    h = int8_quant._hadamard_bf16(group // 4 if group == 256 else group, x.device)
    _gated_residual_kernel[(m,)](x, y, y.stride(0), gate.float().contiguous(), row_map.to(torch.int32).contiguous(),
                                 weight, stats, stats.stride(0), n, eps, float(next_eps), *vectors, h, rotated, gmax,
                                 HAS_NORM=post_weight is not None, NEXT_RMS=stats is not x,
                                 BLOCK_N=min(block_n, triton.next_power_of_2(n)), QUANTIZE=quantized is not None,
                                 G=group, GROUPS_P2=max(16, triton.next_power_of_2(n // group)),
                                 HAS_WEIGHT=norm_weight is not None, HAS_SCALE=scale is not None,
                                 HAS_SHIFT=shift is not None and scale is not None,
                                 # f32 on the CPU, whose interpreter multiplies bf16 as 16-bit ints (triton 3.9)
                                 DOT_DTYPE=tl.bfloat16 if x.is_cuda else tl.float32, num_warps=num_warps,
                                 enable_fp_fusion=False)


def gated_residual(x, y, gate, row_map, post_weight=None, eps=1e-6, next_rms=None, block_n=4096):
    """x (f32 [M, N], in place) += gate[row_map[m]] * (rms_norm(y) * post_weight, or y); returns x. next_rms:
    optional (stats [2, M] f32, eps') filled with the next RMS norm's row statistics of the updated x."""
    _checked(x, y, gate, row_map, post_weight, next_rms)
    stats, next_eps = next_rms if next_rms is not None else (x, 0.0)  # stats: never written without next_rms
    if x.shape[0]:
        _launch(x, y, gate, row_map, post_weight, eps, stats, next_eps, block_n)
    return x


def gated_residual_quantized(x, y, gate, row_map, post_weight, eps, next_eps, group, norm_weight=None, scale=None,
                             shift=None, out=None, block_n=4096, num_warps=4):
    """gated_residual, then the next linear's input rows of the updated x: (codes int8 [M, N], scales f32 [M]) of
    its RMS norm (eps next_eps, gain norm_weight) modulated by scale/shift [R, N] through row_map, rotated in groups
    of `group` (kernels/int8_quant.py's math; ConvRot's 256 or 64, N a multiple of it). out: (codes, scales)."""
    _checked(x, y, gate, row_map, post_weight, None)
    m, n, codes, scales = int8_quant.checked(x, group, "rms", norm_weight, scale, row_map, None, out, None,
                                             name="gated_residual_quantized")
    stats = torch.empty(2, m, dtype=torch.float32, device=x.device)
    rotated = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    gmax = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        _launch(x, y, gate, row_map, post_weight, eps, stats, next_eps, block_n,
                (group, norm_weight, scale, shift, rotated, gmax), num_warps)
        launch_codes(rotated, gmax, codes, scales)
    return codes, scales
