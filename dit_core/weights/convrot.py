"""ConvRot: the regular Hadamard rotation of groups of inputs, and INT8 rows with f32 scales
(reference/int8_convrot_format.md: the format of ComfyUI's quantized checkpoints)."""
from __future__ import annotations

import functools
import math

import torch

CONVROT_GROUP = 256


@functools.cache
def _hadamard_f64(group: int) -> torch.Tensor:
    if group < 4 or 4 ** round(math.log(group, 4)) != group:
        raise ValueError(f"ConvRot group size must be a power of 4 (>= 4), got {group}")
    with torch.inference_mode(False):  # a normal tensor, whatever mode the first caller runs in
        h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
        h = h4
        while h.shape[0] < group:
            h = torch.kron(h, h4)
        return h / math.sqrt(group)


def hadamard(group: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The normalized regular Hadamard H4^(x log4 g) / sqrt(g): symmetric, H H = I (not Sylvester/Walsh); a new
    tensor (built once a size)."""
    return _hadamard_f64(group).to(dtype, copy=True)


@functools.cache
def hadamard_on(group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """hadamard(group, dtype) on device, made once and kept (never write to it): a load that rotates each of a
    model's linears back on a card copied it there for each, and a copy from the host waits for the card's queue."""
    with torch.inference_mode(False):
        return hadamard(group, dtype).to(device)


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x's last axis rotated by H in contiguous groups of `group` (in x's dtype; H is symmetric)."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"ConvRot group {group} does not divide {k} input features")
    return torch.matmul(x.reshape(-1, k // group, group), hadamard_on(group, x.dtype, x.device)).reshape(x.shape)


def rotate_weight(w: torch.Tensor, group: int) -> torch.Tensor:
    """A weight [N, K] rotated offline, W.reshape(N, K/g, g) @ Hᵀ in w's dtype (doc section 4, rotation).
    Equal to rotate() in exact math; written with Hᵀ as kitchen's _rotate_weight is, because BLAS takes
    another path for a transposed operand and small-N f32 results then differ in the last bit."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"ConvRot group {group} does not divide {k} input features")
    return torch.matmul(w.reshape(n, k // group, group), hadamard_on(group, w.dtype, w.device).t()).reshape(n, k)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row INT8 as ComfyUI quantizes: s = max(absmax/127, 1e-30) in f32, q = clamp(round(x / s), -128, 127)
    with the division in x's dtype (so -128 can occur). Returns (int8 codes, f32 scales [..., 1])."""
    absmax = x.abs().amax(dim=-1, keepdim=True).float()
    # A tensor divisor: CUDA torch turns division by a Python scalar into a multiply by its reciprocal, which is
    # not correctly rounded and changes some rows' scales (seen on an H200); the CPU divides exactly either way.
    scale = (absmax / torch.full_like(absmax, 127.0)).clamp(min=1e-30)
    divisor = scale.to(x.dtype)
    divisor = torch.where(divisor == 0, torch.full_like(divisor, torch.finfo(x.dtype).tiny), divisor)
    return (x / divisor).round_().clamp_(-128, 127).to(torch.int8), scale


def quantize_convrot(weight: torch.Tensor, group: int = CONVROT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] as INT8 ConvRot codes and f32 row scales [N, 1], rotated in the weight's dtype."""
    return quantize_rows(rotate_weight(weight, group))


def dequantize_convrot(codes: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """INT8 codes times their row scales, rotated back to the native basis (f32); group 0: not rotated."""
    w = codes.float() * scale.float().reshape(-1, 1) if scale.numel() > 1 else codes.float() * scale.float()
    return rotate_weight(w, group) if group else w


def convrot_group_for(k: int, preferred: int = CONVROT_GROUP) -> int:
    """The largest power-of-4 group <= preferred that divides k (0 if none: the linear then stays float)."""
    g = preferred
    while g >= 4:
        if k % g == 0:
            return g
        g //= 4
    return 0
