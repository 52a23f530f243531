"""The one entry point of a linear's product on the host: float math, or the exact INT8 ConvRot emulation.

A GPU path replaces `linear` with kernels/int8/linear.py; this file stays the reference of its numerics.
"""
from __future__ import annotations

import torch

from .weights import Linear, moved_to, quantize_rows, rotate


def int8_product(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    """x Wᵀ as the INT8 matrix cores compute it (f32 out, bias excluded): rotate x's rows in groups, per-row
    INT8 (ComfyUI's rounding), integer products accumulated exactly (float64 holds every int32 sum),
    then times x's row scale and W's row scale."""
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    work = rows.float()
    if lin.group:
        work = rotate(work, lin.group)
    if rows.dtype in (torch.bfloat16, torch.float16):
        # Kitchen's quantizers round the rotated rows to x's dtype and divide in it (eager: a bf16 matmul;
        # CUDA: f32 rotation then a bf16 cast), format doc section 5
        # (quantization numerics); f32 throughout drifts ~4e-3 from them.
        work = work.to(rows.dtype)
    codes, x_scale = quantize_rows(work)
    acc = codes.double() @ lin.weight.double().t()
    w_scale = lin.scale.float().reshape(1, -1) if lin.scale.numel() > 1 else lin.scale.float().reshape(1, 1)
    y = acc.float() * (x_scale * w_scale)
    return y.reshape(*x.shape[:-1], lin.out_features)


def linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    """x Wᵀ + b in f32 (x any float dtype): float weights in x's precision (f32 at least), INT8 ConvRot
    weights through int8_product."""
    if x.shape[-1] != lin.in_features:
        raise ValueError(f"linear of {lin.in_features} inputs given rows of {x.shape[-1]} values")
    if lin.quantized:
        y = int8_product(x, lin)
    else:
        dtype = torch.promote_types(x.dtype, torch.float32)
        y = torch.nn.functional.linear(x.to(dtype), lin.weight.to(dtype))
    if lin.bias is not None:
        y = y + lin.bias.to(y.dtype)
    return y


def float_on(lin: Linear, device: torch.device) -> Linear:
    """lin as f32 float weights (INT8 ones dequantized) and an f32 bias on device: how a model on a GPU keeps its
    small linears (embedders, time and modulation, final layer), which linear() above runs. A float linear moves
    as stored and converts there (a BF16 one never exists in f32 on the host: half the bytes to copy, no host
    pass); an INT8 ConvRot one is rotated back on the host, as the reference does (a card's f32 products may
    round otherwise)."""
    weight = moved_to(lin.dequantized() if lin.quantized else lin.weight, device).float()
    return Linear(weight, None if lin.bias is None else lin.bias.to(device).float())
