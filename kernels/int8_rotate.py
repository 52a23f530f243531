"""Steps 1-3 of kernels/int8_quant.py: the rotation input (modulated norm or gated activation, rounded to bf16), its
product with the regular Hadamard per group on the matrix cores, the rotated rows rounded to bf16, and each (row,
group)'s absmax.

Issue 4; reference/int8_convrot_format.md section 3; the math is int8_quant.py's steps 1-3, rotation_input its
reference for step 1. The helpers here rotate one (row block, group) in registers, for both of int8_quant.py's
kernels: the one-launch quantizer, and the rotate pass (`rotate_kernel`, below) that stores the bf16 rotated rows
for kernels/int8_codes.py's launch.
"""
from __future__ import annotations

import functools
import math

import torch

from .modulation_rows import shared_row
from .rounding import round_to_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

ACTS = {None: 0, "swiglu": 1, "gelu_tanh": 2}


def hadamard(group: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The regular Hadamard H4^(x log4 g) / sqrt(g) (format doc section 3): dit_core.weights.hadamard,
    rebuilt because kernels/ imports nothing of dit_core, its sibling package inside ComfyUI."""
    h = h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    while h.shape[0] < group:
        h = torch.kron(h, h4)
    return (h / math.sqrt(group)).to(dtype)


def rotation_input(x, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
                   act=None, stats=None):
    """Step 1 of int8_quant.py's math: the bf16 rows [M, K] the rotation takes (stats: quantize_rows')."""
    x = x.float()
    if act == "swiglu":
        gate, up = x[:, 0::2], x[:, 1::2]
        return (gate / (1 + torch.exp(-gate)) * up).to(torch.bfloat16)
    if act == "gelu_tanh":
        return (x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x))).to(torch.bfloat16)
    if stats is not None:  # the row statistics as given: (mean, 1/sqrt(.)) of each row
        x = (x - stats[0].float()[:, None]) * stats[1].float()[:, None]
        x = x if norm_weight is None else x * norm_weight.float()
    elif norm == "rms":
        x = x * (1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        x = x if norm_weight is None else x * norm_weight.float()
    elif norm == "layer":
        x = x - x.mean(-1, keepdim=True)
        x = x * (1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    if scale is not None:
        rows = row_map.long()
        x = x * (1 + scale.float()[rows])
        x = x if shift is None else x + shift.float()[rows]
    return x.to(torch.bfloat16)


@functools.cache
def hadamard_bf16(size: int, device: torch.device) -> torch.Tensor:
    """H_size in bf16 (exact: entries +-2^-k) on device, made once."""
    return hadamard(size, torch.bfloat16).to(device).contiguous()


@triton_jit
def rotated_block(x_ptr, stride_x, rows, rmask, rmap, first, mean, inv, w_ptr, scale_ptr, shift_ptr, h, K,
                  NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, WIDTH, DOT_DTYPE):
    """Step 1 for the WIDTH columns from `first` (bf16 values u [BLOCK_M, WIDTH], held in f32 or bf16), times
    H_WIDTH on the matrix cores: exact products, f32 sums [BLOCK_M, WIDTH]."""
    cols = first + tl.arange(0, WIDTH)
    m2 = rmask[:, None]
    base = x_ptr + rows[:, None].to(tl.int64) * stride_x
    if ACT == 1:
        # gate j and up j sit side by side: one contiguous load of 2 WIDTH values, split in pairs.
        pairs = tl.load(base + 2 * first + tl.arange(0, 2 * WIDTH)[None, :], mask=m2, other=0.0)
        gate, up = tl.split(tl.reshape(pairs.to(tl.float32), (pairs.shape[0], WIDTH, 2)))
        # exp is approximate on the GPU (ex2.approx), so a correctly rounded division (div.rn: a dozen instructions
        # and a slow-path branch) buys no exactness; `/` lowers to div.full (2 ulp). Both within a bf16 step of torch.
        u = round_to_bf16(gate / (1.0 + tl.exp(-gate)) * up)
    elif NORM == 0 and not HAS_SCALE and ACT == 0 and X_BF16:
        u = tl.load(base + cols[None, :], mask=m2, other=0.0)  # already bf16: nothing to round
    else:
        u = tl.load(base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
        if ACT == 2:
            u = u * tl.sigmoid(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))
        if NORM != 0:
            u = (u - mean[:, None]) * inv[:, None]
            if HAS_WEIGHT:
                u = u * tl.load(w_ptr + cols)[None, :]
        if HAS_SCALE == 2:  # one modulation row (one image): vectors, not a gather per value
            u = u * (1.0 + tl.load(scale_ptr + cols)[None, :])
            if HAS_SHIFT:
                u = u + tl.load(shift_ptr + cols)[None, :]
        elif HAS_SCALE:
            mod = rmap[:, None] * K + cols[None, :]
            u = u * (1.0 + tl.load(scale_ptr + mod, mask=m2, other=0.0))
            if HAS_SHIFT:
                u = u + tl.load(shift_ptr + mod, mask=m2, other=0.0)
        u = round_to_bf16(u)
    return tl.dot(u.to(DOT_DTYPE), h, input_precision="ieee", out_dtype=tl.float32)


@triton_jit
def rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr, shift_ptr, h, K,
                 NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, SPLIT, DOT_DTYPE):
    """Steps 2-3 for the group at column c0: its g rotated columns as SPLIT blocks of Q, rounded to bf16
    (held in f32).
    g <= 64: one product with H_g (SPLIT 1; the three other outputs repeat it). g = 256: H_256 =
    H4 (x) H_64, so each 64-column block goes through H_64 on the matrix cores and H4/2 mixes the four
    results (a radix-4 butterfly): a quarter of the products of a dense H_256, and H_64 (8 KB) instead
    of 128 KB of shared memory."""
    z0 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr, shift_ptr, h,
                       K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE)
    if SPLIT == 4:
        z1 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + Q, mean, inv, w_ptr, scale_ptr,
                           shift_ptr, h, K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE)
        z2 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + 2 * Q, mean, inv, w_ptr, scale_ptr,
                           shift_ptr, h, K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE)
        z3 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + 3 * Q, mean, inv, w_ptr, scale_ptr,
                           shift_ptr, h, K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE)
        # Output block s weighs z0..z3 by column s of H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]],
        # halved (1/sqrt(256) = 1/sqrt(64) * 1/2).
        p, m, r, t = z0 + z1, z2 - z3, z0 - z1, z2 + z3
        y0, y1, y2, y3 = (p + m) * 0.5, (p - m) * 0.5, (r + t) * 0.5, (t - r) * 0.5
        y0, y1, y2, y3 = round_to_bf16(y0), round_to_bf16(y1), round_to_bf16(y2), round_to_bf16(y3)
    else:
        y0 = round_to_bf16(z0)
        y1, y2, y3 = y0, y0, y0
    return y0, y1, y2, y3


@triton_jit
def _store_rotated(y_ptr, rows, rmask, cols, y, K):
    """Step 3's bf16 rows for one block of rotated columns (y already holds bf16 values: the cast is exact)."""
    tl.store(y_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], y.to(tl.bfloat16), mask=rmask[:, None])


@triton_jit
def rotated_rows(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, stats_ptr, stride_stats, h, block, c0, M,
                 K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, SPLIT, BLOCK_M, DOT_DTYPE):
    """Steps 1-3 for row block `block` and the group at column c0: (rows, rmask, y0..y3 as _rotate_group's)."""
    Q: tl.constexpr = h.shape[0]
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    inv = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if NORM != 0:
        mean = tl.load(stats_ptr + rows, mask=rmask, other=0.0)
        inv = tl.load(stats_ptr + stride_stats + rows, mask=rmask, other=1.0)
    if HAS_SCALE == 1:
        # Rows in runs of one modulation row (packed sequences): a block within a run reads that row as vectors
        # (HAS_SCALE 2 at the row's address), else each value is gathered (kernels/modulation_rows.py).
        rmap = tl.load(map_ptr + rows, mask=rmask, other=0)  # int32: half the registers of the gather's offsets
        shared = shared_row(rmap, rmask)
        if shared >= 0:
            y0, y1, y2, y3 = rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr,
                                          scale_ptr + shared * K, shift_ptr + shared * K, h, K, NORM, HAS_WEIGHT,
                                          2, HAS_SHIFT, ACT, X_BF16, Q, SPLIT, DOT_DTYPE)
        else:
            y0, y1, y2, y3 = rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr,
                                          shift_ptr, h, K, NORM, HAS_WEIGHT, 1, HAS_SHIFT, ACT, X_BF16, Q, SPLIT,
                                          DOT_DTYPE)
    else:  # no row map to read: rows stand in for it
        y0, y1, y2, y3 = rotate_group(x_ptr, stride_x, rows, rmask, rows, c0, mean, inv, w_ptr, scale_ptr,
                                      shift_ptr, h, K, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, SPLIT,
                                      DOT_DTYPE)
    return rows, rmask, y0, y1, y2, y3


@triton_jit
def group_absmax(y0, y1, y2, y3):
    return tl.max(tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3))), axis=1)


@triton_jit
def rotate_kernel(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, h_ptr, stats_ptr, stride_stats, y_ptr,
                   gmax_ptr, M, K, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SCALE: tl.constexpr,
                   HAS_SHIFT: tl.constexpr, ACT: tl.constexpr, X_BF16: tl.constexpr, G: tl.constexpr,
                   SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # Two launches, the first: grid (row programs, groups); a program takes a group of BLOCK_M rows at a time through
    # steps 1-3 (row blocks strided by the row programs: one each by default; fewer let Triton load the next under
    # this one's products), storing the bf16 rotated rows and each (row, group)'s absmax to gmax [M, K / G] (no
    # atomics, nothing to clear); the codes launch reads them back. Many small programs keep many loads in flight:
    # a program per row block walking all groups ran 2-3x slower.
    Q: tl.constexpr = G // SPLIT
    hq = tl.arange(0, Q)
    h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
    c0 = tl.program_id(1) * G
    for block in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows, rmask, y0, y1, y2, y3 = rotated_rows(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, stats_ptr,
                                                   stride_stats, h, block, c0, M, K, NORM, HAS_WEIGHT, HAS_SCALE,
                                                   HAS_SHIFT, ACT, X_BF16, SPLIT, BLOCK_M, DOT_DTYPE)
        _store_rotated(y_ptr, rows, rmask, c0 + hq, y0, K)
        if SPLIT == 4:
            _store_rotated(y_ptr, rows, rmask, c0 + Q + hq, y1, K)
            _store_rotated(y_ptr, rows, rmask, c0 + 2 * Q + hq, y2, K)
            _store_rotated(y_ptr, rows, rmask, c0 + 3 * Q + hq, y3, K)
        tl.store(gmax_ptr + rows * (K // G) + tl.program_id(1), group_absmax(y0, y1, y2, y3), mask=rmask)
