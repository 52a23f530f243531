"""Pixel norm of channels-first video activations, modulation and SiLU fused, written padded for the causal conv.

Issue 36: the LTX video VAE decoder's resnets run norm, scale/shift, SiLU, then a 3x3x3 convolution on time-padded
(edge frames repeated) and space-padded (reflected) rows; in torch that is about eight passes over activations of up
to gigabytes a tile (the power, the mean, the division, the scale, the shift, SiLU, the frames' concatenation, the
reflection) beside two convolutions. Here one pass reads x twice (the second from L2) and writes the padded input
once. For x [B, C, T, H, W] contiguous, at each position p = (b, t, h, w), in f32:
  n = x[b, :, p] / sqrt(mean_c x[b, c, p]^2 + eps)       (the LTX VAEs' PerChannelRMSNorm: no weight)
  y = n * (1 + scale[b, c]) + shift[b, c]                 (where the decoder is timestep-conditioned)
  y = y * sigmoid(y)                                      (F.silu)
  out[b, c, front + t, ph + h, pw + w] = y, rounded once to x's dtype
then the borders as LTX2VideoCausalConv3d pads (its reflect mode): `front` copies of the first frame before it and
`back` of the last after it, and ph rows / pw columns reflected about each edge (the edge not repeated).
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


def reference(x, eps, scale=None, shift=None, pad=(0, 0, 0, 0)):
    """The math above in plain torch (f32, rounded once): out [B, C, front + T + back, H + 2 ph, W + 2 pw]."""
    y = x.float()
    y = y / torch.sqrt(y.pow(2).mean(dim=1, keepdim=True) + eps)
    if scale is not None:
        view = (*scale.shape, 1, 1, 1)
        y = y * (1 + scale.float().view(view)) + shift.float().view(view)
    return padded(F.silu(y).to(x.dtype), pad)


def padded(y, pad):
    """y [B, C, T, H, W] with `front`, `back` edge frames repeated and ph rows, pw columns reflected: pad =
    (front, back, ph, pw)."""
    front, back, ph, pw = pad
    y = torch.cat([y[:, :, :1].expand(-1, -1, front, -1, -1), y, y[:, :, -1:].expand(-1, -1, back, -1, -1)], dim=2)
    return F.pad(y, (pw, pw, ph, ph, 0, 0), mode="reflect") if ph or pw else y


# One build serves every tile and level (a tile's sizes follow the latent, a level's channels the decoder).
SIZES = ("C", "T", "H", "W", "TP", "HP", "WP", "FRONT", "PH", "PW")


@triton_jit_unspecialized(*SIZES)
def _pixel_norm_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, C, T, H, W, TP, HP, WP, FRONT, PH, PW, eps,
                       MOD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    # Grid (B * T * H, cdiv(W, BLOCK_W)): a program takes BLOCK_W positions of one row (b, t, h), every channel.
    row, wb = tl.program_id(0), tl.program_id(1)
    h = row % H
    t = (row // H) % T
    b = row // (H * T)
    s_in = (T * H * W).to(tl.int64)  # a channel's stride in x, and in out
    s_out = (TP * HP * WP).to(tl.int64)
    w = wb * BLOCK_W + tl.arange(0, BLOCK_W)
    in_row = b * C * s_in + (t * H + h) * W
    out_row = b * C * s_out + ((t + FRONT) * HP + h + PH) * WP + PW
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
        tl.store(out_ptr + out_row + c[:, None] * s_out + w[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def pixel_norm_silu(x, eps, scale=None, shift=None, pad=(0, 0, 0, 0), *, block_c=32, block_w=64, num_warps=4):
    """out [B, C, front + T + back, H + 2 ph, W + 2 pw] in x's dtype by this file's math (pad = (front, back, ph,
    pw)); scale, shift [B, C] (both or neither)."""
    if x.dim() != 5 or not x.is_contiguous():
        raise ValueError(f"pixel_norm_silu: x must be contiguous [B, C, T, H, W], got {tuple(x.shape)}")
    b, c, t, h, w = x.shape
    front, back, ph, pw = pad
    if (scale is None) != (shift is None) or (scale is not None and (scale.shape != (b, c) or shift.shape != (b, c))):
        raise ValueError(f"pixel_norm_silu: scale and shift must both be [{b}, {c}] or both None")
    if ph >= h or pw >= w:
        raise ValueError(f"pixel_norm_silu: a reflection of {ph} rows / {pw} columns needs more than {h} x {w}")
    out = torch.empty(b, c, front + t + back, h + 2 * ph, w + 2 * pw, dtype=x.dtype, device=x.device)
    if x.numel():
        vectors = [x if v is None else v.float().contiguous() for v in (scale, shift)]  # x: a pointer never read
        grid = (b * t * h, triton.cdiv(w, block_w))
        _pixel_norm_kernel[grid](x, out, *vectors, c, t, h, w, *out.shape[2:], front, ph, pw, eps,
                                 MOD=scale is not None, BLOCK_C=block_c, BLOCK_W=block_w, num_warps=num_warps)
    _fill_borders(out, pad)
    return out


def _fill_borders(out, pad):
    """The borders of out around its interior, as `padded` makes them: columns, then rows (the corners from the
    reflected columns), then whole frames."""
    front, back, ph, pw = pad
    inner = out[:, :, front:out.shape[2] - back]
    for i in range(1, pw + 1):
        inner[..., pw - i] = inner[..., pw + i]
        inner[..., -1 - pw + i] = inner[..., -1 - pw - i]
    for i in range(1, ph + 1):
        inner[..., ph - i, :] = inner[..., ph + i, :]
        inner[..., -1 - ph + i, :] = inner[..., -1 - ph - i, :]
    if front:
        out[:, :, :front] = inner[:, :, :1]
    if back:
        out[:, :, out.shape[2] - back:] = inner[:, :, -1:]
