"""Pixel norm of channels-first video activations, modulation and SiLU fused, written where the caller says.

Issue 36: the LTX video VAE decoder's resnets run norm, scale/shift, SiLU, then a 3x3x3 convolution on padded rows;
in torch the first three are about six passes over activations of up to gigabytes a tile (the power, the mean, the
division, the scale, the shift, SiLU) beside two convolutions. Here one pass reads x twice (the second from L2) and
writes once, into `out`: the interior of the caller's padded buffer, so the conv's input is not copied again. For
x [B, C, T, H, W] contiguous, at each position p = (b, t, h, w), in f32:
  n = x[b, :, p] / sqrt(mean_c x[b, c, p]^2 + eps)       (the LTX VAEs' PerChannelRMSNorm: no weight)
  y = n * (1 + scale[b, c]) + shift[b, c]                 (where the decoder is timestep-conditioned)
  y = y * sigmoid(y)                                      (F.silu)
  out[b, c, t, h, w] = y, rounded once to out's dtype (out: any view of x's shape whose last dimension is unit-strided).
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


def reference(x, eps, scale=None, shift=None, *, out=None):
    """The math above in plain torch (f32, rounded once): out (a new tensor like x when None)."""
    y = x.float()
    y = y / torch.sqrt(y.pow(2).mean(dim=1, keepdim=True) + eps)
    if scale is not None:
        view = (*scale.shape, 1, 1, 1)
        y = y * (1 + scale.float().view(view)) + shift.float().view(view)
    y = F.silu(y)
    return y.to(x.dtype) if out is None else out.copy_(y)


# One build serves every tile and level (a tile's sizes follow the latent, a level's channels the decoder).
SIZES = ("C", "T", "H", "W", "SB", "SC", "ST", "SH")


@triton_jit_unspecialized(*SIZES, "out_ptr")  # (out: a padded buffer's interior, of any alignment)
def _pixel_norm_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, C, T, H, W, SB, SC, ST, SH, eps,
                       MOD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    # Grid (B * T * H, cdiv(W, BLOCK_W)): a program takes BLOCK_W positions of one row (b, t, h), every channel.
    row, wb = tl.program_id(0), tl.program_id(1)
    h = row % H
    t = (row // H) % T
    b = row // (H * T)
    s_in = (T * H * W).to(tl.int64)  # a channel's stride in x
    w = wb * BLOCK_W + tl.arange(0, BLOCK_W)
    in_row = b * C * s_in + (t * H + h) * W
    out_row = b.to(tl.int64) * SB + t.to(tl.int64) * ST + h.to(tl.int64) * SH
    valid_w = w < W
    channels = tl.arange(0, BLOCK_C)
    squares = tl.zeros([BLOCK_W], dtype=tl.float32)
    for c0 in tl.range(0, C, BLOCK_C):
        c = c0 + channels
        mask = (c < C)[:, None] & valid_w[None, :]
        v = tl.load(x_ptr + in_row + c[:, None] * s_in + w[None, :], mask=mask, other=0.0).to(tl.float32)
        squares += tl.sum(v * v, axis=0)
    inv = 1.0 / tl.sqrt_rn(squares / C + eps)
    for c0 in tl.range(0, C, BLOCK_C):
        c = c0 + channels
        mask = (c < C)[:, None] & valid_w[None, :]
        v = tl.load(x_ptr + in_row + c[:, None] * s_in + w[None, :], mask=mask, other=0.0).to(tl.float32)
        y = v * inv[None, :]
        if MOD:
            sc = tl.load(scale_ptr + b * C + c, mask=c < C, other=0.0)
            sh = tl.load(shift_ptr + b * C + c, mask=c < C, other=0.0)
            y = y * (1.0 + sc[:, None]) + sh[:, None]
        y = y * tl.sigmoid(y)
        tl.store(out_ptr + out_row + c[:, None].to(tl.int64) * SC + w[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=mask)


def pixel_norm_silu(x, eps, scale=None, shift=None, *, out=None, block_c=32, block_w=64, num_warps=4):
    """out (a new tensor like x when None; else a view of x's shape, its last dimension unit-strided) by this file's
    math; scale, shift [B, C] (both or neither)."""
    if x.dim() != 5 or not x.is_contiguous():
        raise ValueError(f"pixel_norm_silu: x must be contiguous [B, C, T, H, W], got {tuple(x.shape)}")
    b, c, t, h, w = x.shape
    if (scale is None) != (shift is None) or (scale is not None and (scale.shape != (b, c) or shift.shape != (b, c))):
        raise ValueError(f"pixel_norm_silu: scale and shift must both be [{b}, {c}] or both None")
    out = torch.empty_like(x) if out is None else out
    if out.shape != x.shape or out.stride(4) != 1:
        raise ValueError(f"pixel_norm_silu: out must be {tuple(x.shape)} with unit-strided rows, got "
                         f"{tuple(out.shape)} strided {out.stride()}")
    if x.numel():
        vectors = [x if v is None else v.float().contiguous() for v in (scale, shift)]  # x: a pointer never read
        grid = (b * t * h, triton.cdiv(w, block_w))
        _pixel_norm_kernel[grid](x, out, *vectors, c, t, h, w, *out.stride()[:4], eps, MOD=scale is not None,
                                 BLOCK_C=block_c, BLOCK_W=block_w, num_warps=num_warps)
    return out


def build(dtype, *, block_c=32, block_w=64, num_warps=4) -> int:
    """pixel_norm_silu's kernels for activations of dtype compiled now for the current device, without a tensor or a
    launch (Triton's warmup on dtypes): safe on a thread of its own. Returns how many."""
    for mod in (False, True):
        vectors = (torch.float32,) * 2 if mod else (dtype,) * 2  # (unmodulated: x stands in for them)
        _pixel_norm_kernel.warmup(dtype, dtype, *vectors, 1, 1, 1, 1, 1, 1, 1, 1, 1e-8, MOD=mod, BLOCK_C=block_c,
                                  BLOCK_W=block_w, num_warps=num_warps, grid=(1,))
    return 2
