"""Group norm of channels-first activations, SiLU optionally fused: the VAE decoders' norm.

Issue 34; torch's group norm reduces each (sample, group) in one thread block: a 1024x1024 decode has 32 of them per
norm, each over 4 channels of a million pixels, so a quarter of an H100's SMs worked and its 30 norms took 46 of the
decode's 96 ms (bench_image_decode.py's profile). Here the reduction is split into pieces of a channel and the pieces'
moments combined. For x [B, C, *spatial] contiguous, G groups of Cg = C / G channels, S positions per channel:
  pass 1, per piece (PIECE positions of one channel): count n_i, mean m_i and M2_i = sum((x - m_i)^2), its blocks
          combined by Chan's rule (no sum of squares that cancels);
  pass 2, per piece: the group's N = Cg * S, mean = sum(n_i * m_i) / N, var = sum(M2_i + n_i * (m_i - mean)^2) / N
          over the group's pieces, then
          y = (x - mean) / sqrt(var + eps) * w[c] + b[c]      (F.group_norm's math)
          y = y * sigmoid(y)                                  (where silu: F.silu, without the rounding between)
          stored in x's dtype, one rounding.
Three passes over x (read, read, write) where torch's norm and SiLU make five.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .jit import triton_jit_unspecialized

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(x, weight, bias, groups, eps=1e-6, silu=False):
    """The math above in plain torch, as the decoders ran it: F.group_norm, then F.silu."""
    y = F.group_norm(x, groups, weight, bias, eps)
    return F.silu(y) if silu else y


# One build serves every resolution and channel count (a first decode built one per level otherwise).
SIZES = ("S", "PIECE", "PIECES", "C", "CG")


@triton_jit_unspecialized(*SIZES)
def _piece_moments_kernel(x_ptr, stats_ptr, S, PIECE, PIECES, BLOCK: tl.constexpr):
    # Grid (B * C * PIECES,): program p takes positions [piece * PIECE, +PIECE) of channel row p // PIECES.
    p = tl.program_id(0)
    row, piece = p // PIECES, p % PIECES
    start = piece * PIECE
    end = tl.minimum(start + PIECE, S)
    base = x_ptr + row.to(tl.int64) * S
    offs = tl.arange(0, BLOCK)
    n = 0.0
    mean = 0.0
    m2 = 0.0
    for s0 in tl.range(start, end, BLOCK):
        mask = s0 + offs < end
        x = tl.load(base + s0 + offs, mask=mask, other=0.0).to(tl.float32)
        nb = tl.minimum(end - s0, BLOCK).to(tl.float32)
        mb = tl.sum(x, axis=0) / nb
        m2b = tl.sum(tl.where(mask, (x - mb) * (x - mb), 0.0), axis=0)
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    tl.store(stats_ptr + 2 * p, mean)
    tl.store(stats_ptr + 2 * p + 1, m2)


@triton_jit_unspecialized(*SIZES)
def _group_norm_apply_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, C, CG, S, PIECE, PIECES, eps,
                             SILU: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr):
    # Grid as pass 1. Each program combines its group's Cg * PIECES pieces (a few hundred numbers) itself, PARTS at
    # a time: the mean first, then the spread about it.
    p = tl.program_id(0)
    row, piece = p // PIECES, p % PIECES
    sample, channel = row // C, row % C
    first = (sample * C + (channel // CG) * CG) * PIECES  # the group's first piece
    count = CG * PIECES
    total = CG * S * 1.0
    weighted = tl.zeros([PARTS], dtype=tl.float32)
    for p0 in tl.range(0, count, PARTS):
        parts = p0 + tl.arange(0, PARTS)
        valid = parts < count
        n = tl.where(valid, tl.minimum(PIECE, S - (parts % PIECES) * PIECE), 0).to(tl.float32)
        weighted += n * tl.load(stats_ptr + 2 * (first + parts), mask=valid, other=0.0)
    mean = tl.sum(weighted, axis=0) / total
    spread = tl.zeros([PARTS], dtype=tl.float32)
    for p0 in tl.range(0, count, PARTS):
        parts = p0 + tl.arange(0, PARTS)
        valid = parts < count
        n = tl.where(valid, tl.minimum(PIECE, S - (parts % PIECES) * PIECE), 0).to(tl.float32)
        m = tl.load(stats_ptr + 2 * (first + parts), mask=valid, other=0.0)
        spread += tl.load(stats_ptr + 2 * (first + parts) + 1, mask=valid, other=0.0) + n * (m - mean) * (m - mean)
    var = tl.sum(spread, axis=0) / total
    inv = 1.0 / tl.sqrt_rn(var + eps)
    scale = tl.load(w_ptr + channel).to(tl.float32) * inv
    shift = tl.load(b_ptr + channel).to(tl.float32)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, S)
    at = row.to(tl.int64) * S
    offs = tl.arange(0, BLOCK)
    for s0 in tl.range(start, end, BLOCK):
        mask = s0 + offs < end
        x = tl.load(x_ptr + at + s0 + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * scale + shift
        if SILU:
            y = y * tl.sigmoid(y)
        tl.store(y_ptr + at + s0 + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def group_norm(x, weight, bias, groups, eps=1e-6, silu=False, *, block=1024, piece=16384, max_parts=4096,
               parts=256, num_warps=4):
    """[B, C, *spatial] in x's dtype: x group-normed by weight and bias, then SiLU where silu (this file's
    docstring). piece: positions of one channel a program takes (rounded up to block; raised where a group would
    have more than max_parts pieces, which each program of pass 2 reads, `parts` at a time)."""
    if x.dim() < 2 or not x.is_contiguous() or x.shape[1] % groups:
        raise ValueError(f"group_norm: x must be contiguous [B, C, ...] with C divisible by {groups} groups, got "
                         f"{tuple(x.shape)}{'' if x.is_contiguous() else ' (not contiguous)'}")
    b, c = x.shape[:2]
    if weight.numel() != c or bias.numel() != c:
        raise ValueError(f"group_norm: weight and bias must have {c} values, got {weight.numel()} and "
                         f"{bias.numel()}")
    y = torch.empty_like(x)
    s, cg = x.shape[2:].numel(), c // groups
    if y.numel() == 0:
        return y
    piece = block * triton.cdiv(min(max(piece, triton.cdiv(cg * s, max_parts)), s), block)
    pieces = triton.cdiv(s, piece)
    stats = torch.empty(b * c * pieces, 2, dtype=torch.float32, device=x.device)
    grid = (b * c * pieces,)
    _piece_moments_kernel[grid](x, stats, s, piece, pieces, BLOCK=block, num_warps=num_warps)
    _group_norm_apply_kernel[grid](x, y, weight, bias, stats, c, cg, s, piece, pieces, eps, SILU=silu,
                                   BLOCK=block, PARTS=parts, num_warps=num_warps)
    return y


def build(dtype, *, block=1024, parts=256, num_warps=4) -> int:
    """group_norm's kernels for activations of dtype (weights alike) compiled now for the current device, without a
    tensor or a launch (Triton's warmup on dtypes): safe on a thread of its own beside a CUDA graph's capture. Returns
    how many."""
    _piece_moments_kernel.warmup(dtype, torch.float32, 1, 1, 1, BLOCK=block, num_warps=num_warps, grid=(1,))
    for silu in (False, True):
        _group_norm_apply_kernel.warmup(dtype, dtype, dtype, dtype, torch.float32, 1, 1, 1, 1, 1, 1e-6, SILU=silu,
                                        BLOCK=block, PARTS=parts, num_warps=num_warps, grid=(1,))
    return 3
