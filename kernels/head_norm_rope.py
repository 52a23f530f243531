"""q/k head RMS norm and split-half rotary from the fused qkv product, written as SDPA's q, k, v.

Issue 4; dit_core/block.py head_norm_rotary and dit_core/sequence.py rotate_halves are the host math. From
qkv [M, (heads + 2 kv) D] (bf16, row m = [q | k | v]: q heads x D, k and v kv x D; kv = heads but where key heads
are shared, grouped-query attention, each serving heads / kv query heads in a row: Krea 2) and cos/sin [M, r] (f32),
for q and k, each head t [D]:
  n = (t * 1/sqrt(mean(t^2) + eps)) * weight           (f32; skipped when the weight is None, as in the host)
  out[j]     = n[j] c[j] - n[j + r] s[j]               j < r
  out[j + r] = n[j + r] c[j] + n[j] s[j]               j < r      (each product rounded, then the sum: no FMA)
  out[j]     = n[j]                                    j >= 2r
  one rounding to bf16 at the end; v is copied unchanged. Shared k and v heads are written once for each query head
  they serve, so attention takes them as it takes any (a copy SDPA's grouped mode would spare, cuDNN's bf16 first).
Written as q, k, v of one buffer [3, G, g, heads, D] bf16 and returned as its views [G, heads, g, D]: G = M / g
groups of g consecutive rows (g = group; G = 1, g = M when group is 0), the batch that kernels/attention.py hands
to SDPA. Rows-major, heads within a row (SDPA's "BSHD"): cuDNN reads it as it is and writes its output in the same
layout, so the attention's output is already the rows [M, heads D] the next linear takes (heads-major storage
cost a copy of every output, ~43 us a Z-Image block at 1024^2).
"""
from __future__ import annotations

import torch

from .rounding import rounded_bf16
from .jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(qkv, heads, head, q_weight, k_weight, cos, sin, eps=1e-6, *, group=0, out=None, kv_heads=0):
    """The math above in plain torch: (q, k, v), each [G, heads, g, D] bf16."""
    m, d, kv = qkv.shape[0], head, kv_heads or heads
    r = cos.shape[-1]
    g = group or m
    q, k, v = torch.split(qkv.float(), (heads * d, kv * d, kv * d), dim=1)
    parts = [q.reshape(m, heads, d)] + [t.reshape(m, kv, d).repeat_interleave(heads // kv, 1) for t in (k, v)]
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    result = []
    for t, weight in zip(parts[:2], (q_weight, k_weight)):
        if weight is not None:
            t = (t * (1 / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps))) * weight.float()
        a, b = t[..., :r], t[..., r:2 * r]
        result.append(torch.cat([a * c - b * s, b * c + a * s, t[..., 2 * r:]], dim=-1))
    result.append(parts[2])
    value = torch.stack(result).reshape(3, m // g, g, heads, d).to(torch.bfloat16)
    return tuple(t.transpose(1, 2) for t in (value if out is None else out.copy_(value)))


@triton_jit
def _head_norm_rope_kernel(qkv_ptr, stride_qkv, w_ptr, cos_ptr, sin_ptr, out_ptr, M, HEADS, KV, R, eps,
                           HAS_NORM: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_M: tl.constexpr):
    # Grid (row blocks, heads, q/k/v): a program normalizes and turns one head of BLOCK_M rows (of k and v: the key
    # head that serves query head `head`). Each value's rotary partner (j +- r) is a second load of the same row,
    # which the first one brought into L1.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1)
    which = tl.program_id(2)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < M
    mask = rmask[:, None] & (cols < D)[None, :]
    if which == 0:
        col = head * D
    else:
        col = (HEADS + (which - 1) * KV + head // (HEADS // KV)) * D
    src = qkv_ptr + rows[:, None].to(tl.int64) * stride_qkv + col
    x = tl.load(src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if which < 2:
        partner = tl.where(cols < R, cols + R, tl.where(cols < 2 * R, cols - R, cols))
        xp = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            ms = tl.math.div_rn(tl.sum(x * x, axis=1), D * 1.0)
            inv = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))[:, None]
            weight = w_ptr + which * D
            x = (x * inv) * tl.load(weight + cols, mask=cols < D, other=0.0)[None, :]
            xp = (xp * inv) * tl.load(weight + partner, mask=cols < D, other=0.0)[None, :]
        turned = cols < 2 * R
        angle = tl.where(cols < R, cols, cols - R)
        amask = rmask[:, None] & turned[None, :]
        c = tl.load(cos_ptr + rows[:, None] * R + angle[None, :], mask=amask, other=1.0)
        s = tl.load(sin_ptr + rows[:, None] * R + angle[None, :], mask=amask, other=0.0)
        first = (cols < R)[None, :]
        x = tl.where(first, x * c - xp * s, tl.where(turned[None, :], x * c + xp * s, x))
    # [3, G, g, heads, D] is [3, M, heads, D]: row m is position m % g of group m // g.
    dst = ((which * M + rows).to(tl.int64) * HEADS + head) * D
    tl.store(out_ptr + dst[:, None] + cols[None, :], rounded_bf16(x), mask=mask)


def qk_norm_rows(q_weight: torch.Tensor, k_weight: torch.Tensor) -> torch.Tensor:
    """The q and k norm gains as rows [2, D] f32: a view where they are already the two rows of one such tensor
    (dit_core.gpu.block.GpuBlock keeps them so), else a stacked copy (a launch a call)."""
    d = q_weight.numel()
    if (q_weight.dtype == k_weight.dtype == torch.float32 and q_weight.is_contiguous() and k_weight.is_contiguous()
            and k_weight.numel() == d and k_weight.data_ptr() == q_weight.data_ptr() + 4 * d
            and k_weight.untyped_storage().data_ptr() == q_weight.untyped_storage().data_ptr()):
        return q_weight.as_strided((2, d), (d, 1))
    return torch.stack([q_weight.float().reshape(-1), k_weight.float().reshape(-1)])


def head_norm_rope(qkv, heads, head, q_weight, k_weight, cos, sin, eps=1e-6, *, group=0, out=None,
                   block_m=32, kv_heads=0):
    """(q, k, v), each [G, heads, g, head] bf16 (views of [G, g, heads, head]), from qkv [M, (heads + 2 kv) head]
    by the math in this file's docstring (q_weight/k_weight None: no head norm; kv_heads 0: as many as heads). out:
    an optional contiguous [3, G, g, heads, head] bf16 buffer."""
    m, d, kv = qkv.shape[0], head, kv_heads or heads
    if heads % kv:
        raise ValueError(f"head_norm_rope: {kv} key heads do not divide {heads} query heads")
    if qkv.dim() != 2 or qkv.shape[1] != (heads + 2 * kv) * head or qkv.stride(-1) != 1:
        raise ValueError(f"head_norm_rope: qkv must be rows [M, ({heads} + 2 x {kv}) heads x {head}], "
                         f"got {tuple(qkv.shape)}")
    r = cos.shape[-1]
    g = group or m
    if cos.shape != (m, r) or sin.shape != (m, r) or 2 * r > d:
        raise ValueError(f"head_norm_rope: cos/sin must be [{m}, r] with 2r <= {d}, got {tuple(cos.shape)}")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("head_norm_rope: q and k are normed together (both weights or neither)")
    if m % max(g, 1):
        raise ValueError(f"head_norm_rope: {m} rows do not split into attention groups of {g}")
    shape = (3, m // max(g, 1), g, heads, d)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=qkv.device)
    if out.shape != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"head_norm_rope: out must be contiguous bf16 {list(shape)}")
    if m == 0:
        return tuple(t.transpose(1, 2) for t in out)
    weights = qk_norm_rows(q_weight, k_weight) if q_weight is not None else cos  # never read without a norm
    _head_norm_rope_kernel[(triton.cdiv(m, block_m), heads, 3)](
        qkv, qkv.stride(0), weights, cos.float().contiguous(), sin.float().contiguous(), out, m, heads, kv, r, eps,
        HAS_NORM=q_weight is not None, D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_M=block_m, num_warps=4,
        enable_fp_fusion=False)
    return tuple(t.transpose(1, 2) for t in out)
