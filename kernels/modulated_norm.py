"""Rows through a norm without a gain, then each row's modulation row: one pass in place of a dozen.

Issue 36; dit_core/block.py modulated_norm is the host math. LTX-2.5's attentions read their rows this way eight
times a layer (dit_core/families/ltx25.py gpu_block); in torch that is a reduction, five elementwise passes and two
gathers of [M, D] f32 each (a quarter of the stage-1 step's GPU time on the H100, and most of its launches). For
rows x [M, D] (f32 or bf16, rows any stride apart, columns contiguous), tables scale and shift [R, D] (shift may be
absent) and row_map [M] (each row's table row), in f32:
  rms:    n = x * 1/sqrt(mean(x^2) + eps)
  layer:  n = (x - mean(x)) * 1/sqrt(mean((x - mean(x))^2) + eps)
  out = n * (1 + scale[row_map]) + shift[row_map]      (each product rounded, then the sum: no FMA)
Returned as [M, D] f32, contiguous, or rounded once to bf16 (out_dtype: where every reader takes bf16 rows, half the
bytes written and read back). The sums run in another order than torch's: within a few f32 steps of it. A second
pair of tables (also) gives a second output of the same rows' norm in the same pass (LTX-2.5's A->V queries and V->A
keys read the video rows under two modulations: one read of x, not two).
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

NORMS = {"rms": 0, "layer": 1}


def reference(x, scale, shift, row_map, eps=1e-6, *, norm="rms", out_dtype=torch.float32, also=None):
    """The math above in plain torch, as the host block runs it: [M, D] f32 (or out_dtype); with also (scale,
    shift), the pair of outputs."""
    x = x.float()
    if norm == "rms":
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:
        n = F.layer_norm(x, (x.shape[-1],), eps=eps)
    row_map = row_map.long()

    def modulated(scale, shift):
        y = n * (1 + scale.float()[row_map])
        return (y if shift is None else y + shift.float()[row_map]).to(out_dtype)
    return modulated(scale, shift) if also is None else (modulated(scale, shift), modulated(*also))


@triton_jit
def _store_modulated(n, table, c, mask, at, scale_ptr, shift_ptr, out_ptr, HAS_SHIFT: tl.constexpr,
                     OUT_BF16: tl.constexpr):
    y = n * (1.0 + tl.load(scale_ptr + table + c, mask=mask, other=0.0))
    if HAS_SHIFT:
        y = y + tl.load(shift_ptr + table + c, mask=mask, other=0.0)
    if OUT_BF16:
        tl.store(out_ptr + at + c, rounded_bf16(y), mask=mask)
    else:
        tl.store(out_ptr + at + c, y, mask=mask)


@triton_jit
def _modulated_norm_kernel(x_ptr, stride_x, scale_ptr, shift_ptr, map_ptr, out_ptr, M, D, eps,
                           scale2_ptr, shift2_ptr, out2_ptr,
                           LAYER: tl.constexpr, HAS_SHIFT: tl.constexpr, OUT_BF16: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SECOND: tl.constexpr,
                           ONE_BLOCK: tl.constexpr):
    # Grid (row blocks,): a program takes BLOCK_M rows. ONE_BLOCK (BLOCK_D >= D): the rows loaded once, statistics
    # and values from registers. Else walking their D columns in BLOCK_D steps: the statistics (LAYER: the mean
    # first, then the centred squares), then the modulated values; the later walks find the rows in L2 (a row block
    # is BLOCK_M x D x 4 bytes).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < M
    base = x_ptr + rows[:, None].to(tl.int64) * stride_x
    table = tl.load(map_ptr + rows, mask=rmask, other=0).to(tl.int64)[:, None] * D
    at = rows[:, None].to(tl.int64) * D
    if ONE_BLOCK:
        mask = rmask[:, None] & (cols < D)[None, :]
        x = tl.load(base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if LAYER:
            x = tl.where(mask, x - tl.math.div_rn(tl.sum(x, axis=1), D * 1.0)[:, None], 0.0)
        inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(x * x, axis=1), D * 1.0) + eps))
        n = x * inv[:, None]
        _store_modulated(n, table, cols[None, :], mask, at, scale_ptr, shift_ptr, out_ptr, HAS_SHIFT, OUT_BF16)
        if SECOND:
            _store_modulated(n, table, cols[None, :], mask, at, scale2_ptr, shift2_ptr, out2_ptr, HAS_SHIFT,
                             OUT_BF16)
    else:
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        if LAYER:
            sums = tl.zeros([BLOCK_M], dtype=tl.float32)
            for d0 in tl.range(0, D, BLOCK_D):
                mask = rmask[:, None] & (d0 + cols < D)[None, :]
                sums += tl.sum(tl.load(base + d0 + cols[None, :], mask=mask, other=0.0).to(tl.float32), axis=1)
            mean = tl.math.div_rn(sums, D * 1.0)
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for d0 in tl.range(0, D, BLOCK_D):
            mask = rmask[:, None] & (d0 + cols < D)[None, :]
            x = tl.load(base + d0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x - mean[:, None], 0.0)
            squares += tl.sum(x * x, axis=1)
        inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(squares, D * 1.0) + eps))
        for d0 in tl.range(0, D, BLOCK_D):
            c = d0 + cols[None, :]
            mask = rmask[:, None] & (c < D)
            n = (tl.load(base + c, mask=mask, other=0.0).to(tl.float32) - mean[:, None]) * inv[:, None]
            _store_modulated(n, table, c, mask, at, scale_ptr, shift_ptr, out_ptr, HAS_SHIFT, OUT_BF16)
            if SECOND:
                _store_modulated(n, table, c, mask, at, scale2_ptr, shift2_ptr, out2_ptr, HAS_SHIFT, OUT_BF16)


def modulated_norm(x, scale, shift, row_map, eps=1e-6, *, norm="rms", out_dtype=torch.float32, also=None, block_m=1,
                   num_warps=8, block_d=4096):
    """[M, D] f32 (or bf16: out_dtype) from rows x [M, D] by the math in this file's docstring: norm "rms" or
    "layer"; scale and shift [R, D] (shift None: none); row_map [M] into them. also: a second (scale, shift) of the
    same form (both shifts or neither): the pair of outputs, from one pass. block_d: the columns a step (at least
    D: each row read once, held in registers). The default launch, a row a program on 8 warps holding it whole, was
    the fastest at LTX-2.5's stage-2 video rows on an H100 (tests/kernels/bench_modulated_norm.py)."""
    if norm not in NORMS:
        raise ValueError(f"modulated_norm: norm must be one of {tuple(NORMS)}, got {norm!r}")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"modulated_norm: out_dtype must be float32 or bfloat16, got {out_dtype}")
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"modulated_norm: x must be rows [M, D] with contiguous columns, got {tuple(x.shape)}")
    if block_d & (block_d - 1):
        raise ValueError(f"modulated_norm: block_d must be a power of 2, got {block_d}")
    m, d = x.shape
    pairs = [(scale, shift)] + ([] if also is None else [tuple(also)])
    tables = [t for pair in pairs for t in pair if t is not None]
    if any(t.dim() != 2 or t.shape[1] != d for t in tables) or row_map.shape != (m,):
        raise ValueError(f"modulated_norm: tables must be [R, {d}] and row_map [{m}], got "
                         f"{[tuple(t.shape) for t in tables]} and {tuple(row_map.shape)}")
    if any((s is None) != (shift is None) for _, s in pairs):
        raise ValueError("modulated_norm: the second modulation must have a shift where the first has one")
    outs = [torch.empty(m, d, dtype=out_dtype, device=x.device) for _ in pairs]
    if m == 0:
        return outs[0] if also is None else tuple(outs)
    has_shift = shift is not None
    pairs = [(sc.float().contiguous(), (sh if has_shift else sc).float().contiguous())  # (a missing shift: unread)
             for sc, sh in pairs]
    (scale, shift), (scale2, shift2) = pairs[0], pairs[-1]
    _modulated_norm_kernel[(triton.cdiv(m, block_m),)](
        x, x.stride(0), scale, shift, row_map.contiguous(), outs[0], m, d, eps, scale2, shift2, outs[-1],
        LAYER=NORMS[norm] == 1, HAS_SHIFT=has_shift, OUT_BF16=out_dtype == torch.bfloat16, BLOCK_M=block_m,
        BLOCK_D=triton.next_power_of_2(d) if block_d >= d else block_d, SECOND=also is not None,
        ONE_BLOCK=block_d >= d, num_warps=num_warps, enable_fp_fusion=False)
    return outs[0] if also is None else tuple(outs)
