"""Group norm of channels-first activations, a per-channel shift before it and SiLU after it fused: the VAE decoders'
norm.

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
With a shift s[c] (the bias of the conv that wrote x, not yet added: dit_core/codecs/conv.py) the norm is of x + s[c],
f32 (F.group_norm(x + s)): a piece of one channel keeps its M2, its mean moves by s[c]; y = (x + s[c] - mean) ...
Channels last (x [B, *spatial, C] in memory, a channels-last decoder's convs: no layout conversions around each
conv): a piece is PIECE positions of every channel, its moments per group from [positions, G, Cg] tiles; pass 2
combines a group's pieces as above and normalizes the piece's positions, in place of the channel's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .jit import triton_jit, triton_jit_unspecialized

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(x, weight, bias, groups, eps=1e-6, silu=False, shift=None):
    """The math above in plain torch: x + shift (f32, one value a channel), F.group_norm, then F.silu."""
    if shift is not None:
        x = x.float() + shift.float().reshape(-1, *[1] * (x.dim() - 2))
    y = F.group_norm(x, groups, weight.to(x.dtype), bias.to(x.dtype), eps)
    return F.silu(y) if silu else y


# One build serves every resolution and channel count (a first decode built one per level otherwise).
SIZES = ("S", "PIECE", "PIECES", "C", "CG")
LAST_SIZES = SIZES[:3]  # (channels last: a build a group width, C and CG constexprs)


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
def _group_norm_apply_kernel(x_ptr, y_ptr, w_ptr, b_ptr, shift_ptr, stats_ptr, C, CG, S, PIECE, PIECES, eps,
                             SILU: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr):
    # Grid as pass 1. Each program combines its group's Cg * PIECES pieces (a few hundred numbers) itself, PARTS at
    # a time: the mean first, then the spread about it; a piece's mean moved by its channel's shift.
    p = tl.program_id(0)
    row, piece = p // PIECES, p % PIECES
    sample, channel = row // C, row % C
    channel0 = (channel // CG) * CG
    first = (sample * C + channel0) * PIECES  # the group's first piece
    count = CG * PIECES
    total = CG * S * 1.0
    weighted = tl.zeros([PARTS], dtype=tl.float32)
    for p0 in tl.range(0, count, PARTS):
        parts = p0 + tl.arange(0, PARTS)
        valid = parts < count
        n = tl.where(valid, tl.minimum(PIECE, S - (parts % PIECES) * PIECE), 0).to(tl.float32)
        m = tl.load(stats_ptr + 2 * (first + parts), mask=valid, other=0.0)
        weighted += n * (m + tl.load(shift_ptr + channel0 + parts // PIECES, mask=valid, other=0.0))
    mean = tl.sum(weighted, axis=0) / total
    spread = tl.zeros([PARTS], dtype=tl.float32)
    for p0 in tl.range(0, count, PARTS):
        parts = p0 + tl.arange(0, PARTS)
        valid = parts < count
        n = tl.where(valid, tl.minimum(PIECE, S - (parts % PIECES) * PIECE), 0).to(tl.float32)
        m = tl.load(stats_ptr + 2 * (first + parts), mask=valid, other=0.0) + \
            tl.load(shift_ptr + channel0 + parts // PIECES, mask=valid, other=0.0)
        spread += tl.load(stats_ptr + 2 * (first + parts) + 1, mask=valid, other=0.0) + n * (m - mean) * (m - mean)
    var = tl.sum(spread, axis=0) / total
    inv = 1.0 / tl.sqrt_rn(var + eps)
    scale = tl.load(w_ptr + channel).to(tl.float32) * inv
    shift = tl.load(b_ptr + channel).to(tl.float32)
    mean -= tl.load(shift_ptr + channel)  # x + s - mean
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


@triton_jit_unspecialized(*LAST_SIZES)
def _last_moments_kernel(x_ptr, shift_ptr, stats_ptr, S, PIECE, PIECES, G: tl.constexpr, CG: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    # Grid (B * PIECES,): program p takes positions [piece * PIECE, +PIECE) of sample p // PIECES, all its channels;
    # stats [B * PIECES, 2, G]: each group's mean and M2 of x + shift over the piece.
    p = tl.program_id(0)
    sample, piece = p // PIECES, p % PIECES
    start = piece * PIECE
    end = tl.minimum(start + PIECE, S)
    base = x_ptr + sample.to(tl.int64) * S * (G * CG)
    offs = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, G * CG)
    channel_shift = tl.load(shift_ptr + cols)[None, :]
    n = 0.0
    mean = tl.zeros([G], dtype=tl.float32)
    m2 = tl.zeros([G], dtype=tl.float32)
    for s0 in tl.range(start, end, BLOCK_S):
        mask = (s0 + offs < end)[:, None]
        x = tl.load(base + (s0 + offs)[:, None].to(tl.int64) * (G * CG) + cols[None, :], mask=mask, other=0.0)
        x = tl.reshape(tl.where(mask, x.to(tl.float32) + channel_shift, 0.0), [BLOCK_S, G, CG])
        nb = (tl.minimum(end - s0, BLOCK_S) * CG).to(tl.float32)
        mb = tl.sum(tl.sum(x, axis=2), axis=0) / nb
        d = tl.where(tl.reshape(mask, [BLOCK_S, 1, 1]), x - mb[None, :, None], 0.0)
        m2b = tl.sum(tl.sum(d * d, axis=2), axis=0)
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    groups = tl.arange(0, G)
    tl.store(stats_ptr + 2 * G * p + groups, mean)
    tl.store(stats_ptr + 2 * G * p + G + groups, m2)


@triton_jit
def _pieces_moments(stats_ptr, first, p0, S, PIECE, PIECES, G: tl.constexpr, CG: tl.constexpr, PARTS: tl.constexpr):
    """Pieces p0 .. p0 + PARTS - 1 of a sample (its first at `first`): their counts [PARTS, 1] and each group's mean
    and M2 [PARTS, G] (zeros past the last piece)."""
    parts = p0 + tl.arange(0, PARTS)
    valid = (parts < PIECES)[:, None]
    n = tl.where(valid, tl.minimum(PIECE, S - parts[:, None] * PIECE) * CG, 0).to(tl.float32)
    at = 2 * G * (first + parts)[:, None] + tl.arange(0, G)[None, :]
    return n, tl.load(stats_ptr + at, mask=valid, other=0.0), tl.load(stats_ptr + at + G, mask=valid, other=0.0)


@triton_jit_unspecialized(*LAST_SIZES)
def _last_apply_kernel(x_ptr, y_ptr, w_ptr, b_ptr, shift_ptr, stats_ptr, S, PIECE, PIECES, eps, G: tl.constexpr,
                       CG: tl.constexpr, SILU: tl.constexpr, BLOCK_S: tl.constexpr, PARTS: tl.constexpr):
    # Grid as _last_moments_kernel's. Each program combines its sample's pieces for every group, PARTS at a time.
    p = tl.program_id(0)
    sample, piece = p // PIECES, p % PIECES
    first = sample * PIECES
    total = CG * S * 1.0
    weighted = tl.zeros([PARTS, G], dtype=tl.float32)
    for p0 in tl.range(0, PIECES, PARTS):
        n, m, _ = _pieces_moments(stats_ptr, first, p0, S, PIECE, PIECES, G, CG, PARTS)
        weighted += n * m
    mean = tl.sum(weighted, axis=0) / total
    spread = tl.zeros([PARTS, G], dtype=tl.float32)
    for p0 in tl.range(0, PIECES, PARTS):
        n, m, m2 = _pieces_moments(stats_ptr, first, p0, S, PIECE, PIECES, G, CG, PARTS)
        spread += m2 + n * (m - mean[None, :]) * (m - mean[None, :])
    var = tl.sum(spread, axis=0) / total
    inv = 1.0 / tl.sqrt_rn(var + eps)
    cols = tl.arange(0, G * CG)
    # each group's mean and 1/sqrt(var + eps) over its CG channels: [G] -> [C]
    mean_c = tl.reshape(tl.broadcast_to(mean[:, None], [G, CG]), [G * CG]) - tl.load(shift_ptr + cols)  # x + s - mean
    scale = tl.reshape(tl.broadcast_to(inv[:, None], [G, CG]), [G * CG]) * tl.load(w_ptr + cols).to(tl.float32)
    shift = tl.load(b_ptr + cols).to(tl.float32)
    start = piece * PIECE
    end = tl.minimum(start + PIECE, S)
    at0 = sample.to(tl.int64) * S * (G * CG)
    offs = tl.arange(0, BLOCK_S)
    for s0 in tl.range(start, end, BLOCK_S):
        mask = (s0 + offs < end)[:, None]
        at = at0 + (s0 + offs)[:, None].to(tl.int64) * (G * CG) + cols[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean_c[None, :]) * scale[None, :] + shift[None, :]
        if SILU:
            y = y * tl.sigmoid(y)
        tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)


def channels_last(x) -> bool:
    """Whether x [B, C, *spatial] lies channels last in memory ([B, *spatial, C] contiguous) and not also as it
    reads (a channel or a position alone)."""
    return x.dim() >= 3 and not x.is_contiguous() and x.movedim(1, -1).is_contiguous()


def _last_width(c: int, groups: int) -> bool:
    """Whether the channels-last kernels take c channels in `groups` groups (both counts powers of two)."""
    power_of_two = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    return c % groups == 0 and power_of_two(groups) and power_of_two(c // groups)


def last_block(c: int) -> int:
    """Positions a channels-last tile takes: 4096 values (8 KB of bf16 a load, at any width)."""
    return max(1, 4096 // c)


def group_norm(x, weight, bias, groups, eps=1e-6, silu=False, shift=None, *, block=1024, piece=16384,
               max_parts=4096, parts=256, num_warps=4, block_s=None, last_pieces=512, last_parts=64):
    """[B, C, *spatial] in x's dtype and memory format: x + shift (C values, f32; None: none) group-normed by weight
    and bias, then SiLU where silu (this file's docstring). piece: positions of one channel a program takes (rounded
    up to block; raised where a group would have more than max_parts pieces, which each program of pass 2 reads,
    `parts` at a time). Channels last (groups and channels a group powers of two): about last_pieces pieces a sample,
    block_s positions at a time (None: 4096 values a tile), the pieces combined last_parts at a time."""
    last = channels_last(x) and _last_width(x.shape[1], groups)
    if x.dim() < 2 or not (last or x.is_contiguous()) or x.shape[1] % groups:
        raise ValueError(f"group_norm: x must be contiguous [B, C, ...] (or channels last, groups and channels a "
                         f"group powers of two) with C divisible by {groups} groups, got {tuple(x.shape)}"
                         f"{'' if x.is_contiguous() else ' (not contiguous)'}")
    b, c = x.shape[:2]
    if weight.numel() != c or bias.numel() != c or (shift is not None and shift.numel() != c):
        raise ValueError(f"group_norm: weight, bias and shift must have {c} values, got {weight.numel()}, "
                         f"{bias.numel()} and {'none' if shift is None else shift.numel()}")
    shift = torch.zeros(c, device=x.device) if shift is None else shift.float().contiguous()
    if last:
        return _group_norm_last(x, weight, bias, shift, groups, eps, silu, block_s or last_block(c), last_pieces,
                                last_parts, num_warps)
    y = torch.empty_like(x)
    s, cg = x.shape[2:].numel(), c // groups
    if y.numel() == 0:
        return y
    piece = block * triton.cdiv(min(max(piece, triton.cdiv(cg * s, max_parts)), s), block)
    pieces = triton.cdiv(s, piece)
    stats = torch.empty(b * c * pieces, 2, dtype=torch.float32, device=x.device)
    grid = (b * c * pieces,)
    _piece_moments_kernel[grid](x, stats, s, piece, pieces, BLOCK=block, num_warps=num_warps)
    _group_norm_apply_kernel[grid](x, y, weight, bias, shift, stats, c, cg, s, piece, pieces, eps, SILU=silu,
                                   BLOCK=block, PARTS=parts, num_warps=num_warps)
    return y


def _group_norm_last(x, weight, bias, shift, groups, eps, silu, block_s, pieces, parts, num_warps):
    b, c = x.shape[:2]
    y = torch.empty_like(x)  # (channels last, as x)
    s = x.shape[2:].numel()
    if y.numel() == 0:
        return y
    piece = block_s * triton.cdiv(triton.cdiv(s, pieces), block_s)
    pieces = triton.cdiv(s, piece)
    stats = torch.empty(b * pieces, 2, groups, dtype=torch.float32, device=x.device)
    grid, sizes = (b * pieces,), {"G": groups, "CG": c // groups, "BLOCK_S": block_s, "num_warps": num_warps}
    weight, bias = weight.contiguous(), bias.contiguous()
    _last_moments_kernel[grid](x, shift, stats, s, piece, pieces, **sizes)
    _last_apply_kernel[grid](x, y, weight, bias, shift, stats, s, piece, pieces, eps, SILU=silu, PARTS=parts,
                             **sizes)
    return y


def build(dtype, *, block=1024, parts=256, num_warps=4, last_widths=(), groups=32, last_parts=64) -> int:
    """group_norm's kernels for activations of dtype (weights alike) compiled now for the current device, without a
    tensor or a launch (Triton's warmup on dtypes): safe on a thread of its own beside a CUDA graph's capture;
    last_widths: the channel counts of channels-last activations in `groups` groups (a build for each). Returns
    how many."""
    _piece_moments_kernel.warmup(dtype, torch.float32, 1, 1, 1, BLOCK=block, num_warps=num_warps, grid=(1,))
    for silu in (False, True):
        _group_norm_apply_kernel.warmup(dtype, dtype, dtype, dtype, torch.float32, torch.float32, 1, 1, 1, 1, 1, 1e-6,
                                        SILU=silu, BLOCK=block, PARTS=parts, num_warps=num_warps, grid=(1,))
    widths = sorted({c for c in last_widths if _last_width(c, groups)})
    for c in widths:
        sizes = {"G": groups, "CG": c // groups, "BLOCK_S": last_block(c), "num_warps": num_warps, "grid": (1,)}
        _last_moments_kernel.warmup(dtype, torch.float32, torch.float32, 1, 1, 1, **sizes)
        for silu in (False, True):
            _last_apply_kernel.warmup(dtype, dtype, dtype, dtype, torch.float32, torch.float32, 1, 1, 1, 1e-6,
                                      SILU=silu, PARTS=last_parts, **sizes)
    return 3 + 3 * len(widths)
