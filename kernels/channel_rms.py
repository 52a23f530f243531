"""RMS over the channels of channels-last activations, a per-channel shift before it and SiLU after it fused: the
Qwen-Image (Wan 2.1) VAE decoder's norm.

Issue 34; in torch that norm (F.normalize over dim 1, the gain, SiLU) of [B, C, H, W] takes a reduction and three
elementwise passes, and the conv before it one more for its bias: 14 of a 1024x1024 decode's 29 ms (H100,
bench_image_decode.py's profile). For rows x [N, C] (the positions of a channels-last [B, C, H, W], C contiguous), a
shift s [C] f32 (the bias of the conv that wrote x, not yet added) and a gain g [C] (the norm's gamma times sqrt(C)):
  v = x + s                                   (f32)
  y = v / max(|v|, 1e-12) * g                 (F.normalize(v, dim=1) * g; |v| the position's L2 norm)
  y = y * sigmoid(y)                          (where silu)
  one rounding to x's dtype.
One read of x and one write; a program takes BLOCK_M positions, all their channels in one tile.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None

EPS = 1e-12  # F.normalize's floor under the norm


def reference(x, gain, shift=None, silu=False):
    """The math above in plain torch: [B, C, ...] in x's dtype."""
    v = x.float() if shift is None else x.float() + shift.float().reshape(-1, *[1] * (x.dim() - 2))
    y = F.normalize(v, dim=1, eps=EPS) * gain.float().reshape(-1, *[1] * (x.dim() - 2))
    return (F.silu(y) if silu else y).to(x.dtype)


@triton_jit
def _channel_rms_kernel(x_ptr, s_ptr, g_ptr, y_ptr, M, C: tl.constexpr, SILU: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    # Grid (position blocks,): BLOCK_M positions, their C channels contiguous. C a constant (a build a width): the
    # rows' stride and the columns' mask known, so a row's loads are 16-byte vectors.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_C)
    inside = cols < C
    mask = (rows < M)[:, None] & inside[None, :]
    at = rows[:, None].to(tl.int64) * C + cols[None, :]
    shift = tl.load(s_ptr + cols, mask=inside, other=0.0)[None, :]
    v = tl.where(mask, tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32) + shift, 0.0)
    inv = tl.math.div_rn(1.0, tl.maximum(tl.sqrt_rn(tl.sum(v * v, axis=1)), 1e-12))  # (a division a position)
    y = v * inv[:, None] * tl.load(g_ptr + cols, mask=inside, other=0.0)[None, :]
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)


def channels_last(x) -> bool:
    """Whether x [B, C, *spatial] lies channels last in memory ([B, *spatial, C] contiguous)."""
    return x.dim() >= 3 and x.movedim(1, -1).is_contiguous()


def block_m(c: int) -> int:
    """Positions a program takes: about 4096 values a tile."""
    return max(1, 4096 // triton.next_power_of_2(c))


def channel_rms(x, gain, shift=None, silu=False, *, num_warps=4):
    """x [B, C, *spatial] laid out channels last: the norm of this file's docstring, channels last as x."""
    if not channels_last(x):
        raise ValueError(f"channel_rms: x must be [B, C, ...] laid out channels last, got {tuple(x.shape)} with "
                         f"strides {x.stride()}")
    c = x.shape[1]
    if gain.numel() != c or (shift is not None and shift.numel() != c):
        raise ValueError(f"channel_rms: the gain and shift must have {c} values, got {gain.numel()} and "
                         f"{'none' if shift is None else shift.numel()}")
    y = torch.empty_like(x)  # (channels last, as x)
    m = x.numel() // c if c else 0
    if m == 0:
        return y
    shift = torch.zeros(c, device=x.device) if shift is None else shift.float().contiguous()
    _channel_rms_kernel[(triton.cdiv(m, block_m(c)),)](
        x, shift, gain.float().contiguous(), y, m, C=c, SILU=silu, BLOCK_M=block_m(c),
        BLOCK_C=triton.next_power_of_2(c), num_warps=num_warps, enable_fp_fusion=False)
    return y


def build(dtype, widths, *, num_warps=4) -> int:
    """channel_rms's kernels for activations of dtype at these channel counts (a build each), compiled now for the
    current device without a launch (Triton's warmup on dtypes, with channel_rms's compile options: they are part of
    the kernel's key), SiLU and not. Returns how many."""
    widths = sorted(set(widths))
    for c in widths:
        for silu in (False, True):
            _channel_rms_kernel.warmup(dtype, torch.float32, torch.float32, dtype, 1, C=c, SILU=silu,
                                       BLOCK_M=block_m(c), BLOCK_C=triton.next_power_of_2(c), num_warps=num_warps,
                                       enable_fp_fusion=False, grid=(1,))
    return 2 * len(widths)
