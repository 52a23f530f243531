"""Rows to INT8 ConvRot codes in one pass: whole rows held in registers, read once, codes written once.

Issue 4. The math is kernels/int8_quant.py's (steps 1-5, its reference() is this kernel's reference), for the
inputs without an activation: plain rows, or the modulated RMS / layer norm of f32 rows. Why a second kernel: the
two-pass quantizer writes the rotated rows in bf16 and reads them back because a row's scale needs every group's
maximum first; at Z-Image's 4608 x 3840 that round trip and the row statistics' own launch make it 2-3.5x its
bandwidth floor (docs/benchmarks.md). Here a program holds BLOCK_M whole rows (padded to WIDTH, a power of two; 16K
values a program by default: 4 rows of Z-Image's 3840 or FLUX.3's 3072, one of the MLP's 10240 or 9216):
their statistics (unless given), the normed and modulated bf16 rows, the rotation (every Q = min(g, 64) columns by
H_Q on the matrix cores, the four Q-blocks of a 256-group mixed by H4 / 2 as int8_quant does), the row maxima, the
scales and the codes all stay in registers. The row statistics are summed in another order than row_stats' (f32,
order unspecified in both): a code may move as int8_quant's fused prologues allow (its tests' bound).
"""
from __future__ import annotations

import functools

import torch

from .int8_quant import _hadamard_bf16, checked, quantize_rows
from .row_stats import NORMS
from .rounding import round_half_even, round_to_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

MAX_WIDTH = 16384  # the widest row held whole (padded to a power of two): one row a program, 64 values a thread


@triton_jit
def _one_pass_kernel(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, h_ptr, stats_ptr, stride_stats, q_ptr,
                     s_ptr, M, K, eps, NORM: tl.constexpr, STATS_GIVEN: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr,
                     WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr):
    Q: tl.constexpr = G // SPLIT
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, WIDTH)
    rmask, cmask = rows < M, cols < K
    mask = rmask[:, None] & cmask[None, :]
    u = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM != 0:  # step 1: the norm (statistics from the rows in hand unless given) and its gain
        if STATS_GIVEN:
            mean = tl.load(stats_ptr + rows, mask=rmask, other=0.0)
            inv = tl.load(stats_ptr + stride_stats + rows, mask=rmask, other=1.0)
        else:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            if NORM == 2:
                mean = tl.math.div_rn(tl.sum(u, axis=1), K * 1.0)
            centred = tl.where(mask, u - mean[:, None], 0.0)
            inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(centred * centred, axis=1), K * 1.0) + eps))
        u = (u - mean[:, None]) * inv[:, None]
        if HAS_WEIGHT:
            u = u * tl.load(w_ptr + cols, mask=cmask, other=0.0)[None, :]
    if HAS_SCALE == 2:  # the modulation: one row, read as vectors
        u = u * (1.0 + tl.load(scale_ptr + cols, mask=cmask, other=0.0)[None, :])
        if HAS_SHIFT:
            u = u + tl.load(shift_ptr + cols, mask=cmask, other=0.0)[None, :]
    elif HAS_SCALE:
        mod = tl.load(map_ptr + rows, mask=rmask, other=0).to(tl.int64)[:, None] * K + cols[None, :]
        u = u * (1.0 + tl.load(scale_ptr + mod, mask=mask, other=0.0))
        if HAS_SHIFT:
            u = u + tl.load(shift_ptr + mod, mask=mask, other=0.0)
    u = tl.where(mask, round_to_bf16(u), 0.0)  # bf16 rows (exact for bf16 input); padded groups all 0
    hq = tl.arange(0, Q)
    h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
    # Steps 2-3: every Q columns times H_Q, then (g = 256) H4 / 2 across a group's four Q-blocks.
    z = tl.dot(tl.reshape(u, (BLOCK_M * WIDTH // Q, Q)).to(DOT_DTYPE), h, input_precision="ieee",
               out_dtype=tl.float32)
    if SPLIT == 4:
        # Block b of a group at [..., i, j] with b = 2 i + j: two splits give z0..z3.
        t = tl.reshape(tl.permute(tl.reshape(z, (BLOCK_M * WIDTH // G, 4, Q)), (0, 2, 1)),
                       (BLOCK_M * WIDTH // G, Q, 2, 2))
        even, odd = tl.split(t)
        z0, z2 = tl.split(even)
        z1, z3 = tl.split(odd)
        p, m, r, s = z0 + z1, z2 - z3, z0 - z1, z2 + z3
        y0, y1 = round_to_bf16((p + m) * 0.5), round_to_bf16((p - m) * 0.5)
        y2, y3 = round_to_bf16((r + s) * 0.5), round_to_bf16((s - r) * 0.5)
        t = tl.join(tl.join(y0, y2), tl.join(y1, y3))  # [..., Q, i, j]
        y = tl.reshape(tl.permute(tl.reshape(t, (BLOCK_M * WIDTH // G, Q, 4)), (0, 2, 1)), (BLOCK_M, WIDTH))
    else:
        y = tl.reshape(round_to_bf16(z), (BLOCK_M, WIDTH))
    # Steps 4-5, as int8_quant's codes pass.
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(y), axis=1), 127.0), 1e-30)
    tl.store(s_ptr + rows, scale, mask=rmask)
    code = round_half_even(round_to_bf16(tl.math.div_rn(y, round_to_bf16(scale)[:, None])))
    tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
             tl.minimum(tl.maximum(code, -128.0), 127.0).to(tl.int8), mask=mask)


_UNFIT_WIDTHS: set[int] = set()  # padded widths whose programs ran out of shared memory on this GPU


def fits(k: int, act) -> bool:
    """Whether these rows can take one pass: no activation, K of at most MAX_WIDTH (and not a width this GPU's
    shared memory turned down)."""
    return act is None and k <= MAX_WIDTH and 1 << (k - 1).bit_length() not in _UNFIT_WIDTHS


def quantize_rows_one_pass(x, group, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
                           act=None, out=None, stats=None, block_m=None, num_warps=8):
    """int8_quant.quantize_rows' arguments and results: in one pass where the rows fit (fits(K, act)), else through
    quantize_rows itself. block_m rows a program (by default 16K values a program), num_warps: the launch
    (bench_int8_linear.py sweeps them)."""
    two_passes = functools.partial(quantize_rows, x, group, norm=norm, norm_weight=norm_weight, eps=eps, scale=scale,
                                   shift=shift, row_map=row_map, act=act, out=out, stats=stats)
    if not fits(x.shape[-1], act):
        return two_passes()
    m, k, codes, scales = checked(x, group, norm, norm_weight, scale, row_map, act, out, stats,
                                  "quantize_rows_one_pass")
    if m == 0:
        return codes, scales
    split, width = (4 if group == 256 else 1), max(triton.next_power_of_2(k), group)
    block_m = max(block_m or min(64, MAX_WIDTH // width), 16 * (group // split) // width)  # a product of >= 16 rows
    absent = scales  # pointers the kernel never reads (their constexpr flag off)
    f32 = lambda t: absent if t is None else t.float().contiguous()  # noqa: E731
    stats_given = stats is not None
    try:
        _one_pass_kernel[(triton.cdiv(m, block_m),)](
            x, x.stride(0), f32(norm_weight), f32(scale), f32(shift),
            row_map.to(torch.int32).contiguous() if row_map is not None else absent,
            _hadamard_bf16(group // split, x.device), stats if stats_given else absent,
            stats.stride(0) if stats_given else 0, codes, scales, m, k, eps,
            NORM=NORMS[norm], STATS_GIVEN=stats_given, HAS_WEIGHT=norm_weight is not None,
            HAS_SCALE=0 if scale is None else 2 if scale.shape[0] == 1 else 1,
            HAS_SHIFT=shift is not None and scale is not None, G=group, SPLIT=split, WIDTH=width, BLOCK_M=block_m,
            DOT_DTYPE=tl.bfloat16 if x.is_cuda else tl.float32, num_warps=num_warps, enable_fp_fusion=False)
    except triton.runtime.errors.OutOfResources:
        # Nothing ran: the rows' layout changes need more shared memory than this GPU has (Ada's 100 KB, say).
        _UNFIT_WIDTHS.add(width)
        return two_passes()
    return codes, scales
