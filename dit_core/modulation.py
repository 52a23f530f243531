"""Time embedding and a block's modulation rows (shift, scale, gate of its attention and of its MLP)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def sinusoids(times: torch.Tensor, dim: int, max_period: float = 10000.0, shift: float = 0.0) -> torch.Tensor:
    """Rows [cos | sin] of each time times dim/2 frequencies max_period^(-i / (dim/2 - shift)), in f32 as
    diffusers' Timesteps (flip_sin_to_cos) and Z-Image's TimestepEmbedder compute them."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=times.device) / (half - shift)
    args = times.reshape(-1, 1).float() * exponent.exp()[None]
    emb = torch.cat([args.cos(), args.sin()], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


@dataclass(frozen=True)
class Modulation:
    """A block's modulation, each [modulation rows, hidden] f32 (a row's norm is taken as norm*(1 + scale) +
    shift, its branch added as gate*branch; gates already through their activation). None shift: zero."""
    attn_scale: torch.Tensor
    attn_gate: torch.Tensor
    mlp_scale: torch.Tensor
    mlp_gate: torch.Tensor
    attn_shift: torch.Tensor | None = None
    mlp_shift: torch.Tensor | None = None

    @staticmethod
    def identity(hidden: int, rows: int = 1, dtype: torch.dtype = torch.float32, device=None) -> Modulation:
        """Scale 0 and gate 1: an unmodulated block (Z-Image's context refiners)."""
        zero = torch.zeros(rows, hidden, dtype=dtype, device=device)
        one = torch.ones(rows, hidden, dtype=dtype, device=device)
        return Modulation(zero, one, zero, one)


def table_plus(table: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """A block's static table [k, D] plus a time embedding's modulation rows [n, k D] whose k-th D-wide part goes
    with table row k (PixArt's AdaLN-single as LTX-2.5's blocks add them, reference/families/ltx25.md section 2):
    [k, n, D], part k of distinct time i at [k, i]."""
    k = table.shape[0]
    return table[:, None, :].to(emb.dtype) + emb.reshape(emb.shape[0], k, -1).transpose(0, 1)
