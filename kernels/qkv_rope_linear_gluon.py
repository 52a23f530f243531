"""The fused QKV product with the q/k head norm and rotary (kernels/qkv_rope_linear.py) on the Gluon GEMM of
kernels/int8_linear_gluon.py, whose K loop keeps an integer MMA in flight: to be timed against the Triton one.

The math is qkv_rope_linear's (its reference() is this kernel's): qkv = bf16(q wᵀ s_x s_w + bias), then for q and k
each head's RMS norm (gain optional) and split-half rotary of r = D / 2 by cos/sin [M, r], one bf16 rounding at the
end, written as [3, M, heads, D] (BSHD). A tile holds whole heads of one of q, k or v (BLOCK_N a multiple of D that
divides heads D), so a row's RMS over its head is a sum within the tile; the tile leaves through shared memory by
one 3-D TMA store (box [1, BLOCK_M, BLOCK_N]), which clips at M inside q, k and v alike. Not used by the block yet:
tests/kernels/test_int8_linear_gluon.py builds it in CI and checks it on the GPU; bench_int8_linear.py times it.
"""
from __future__ import annotations

import torch

from .int8_linear_gluon import TILE, available, gluon

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    from .int8_linear_gluon import (ACC_LAYOUT, _descriptor, _grid, _scaled, _start, _tile_offsets, _tile_products,
                                    tma_store)

    @gluon.jit
    def _store_out3(part, out_desc, out_tile, which, off_m, col):
        """A [1, BLOCK_M, BLOCK_N] part to out[which, off_m:, col:] through out_tile and TMA (clipped at M)."""
        tma.store_wait(0)
        out_tile.store(part)
        fence_async_shared()
        tma_store(out_desc, [which, off_m, col], out_tile)

    @gluon.jit
    def _qkv_rope_gluon_kernel(a_desc, b_desc, out_desc, sx_ptr, sw_ptr, bias_ptr, nw_ptr, cos_ptr, sin_ptr, M, N, K,
                               HD, eps, HAS_BIAS: gl.constexpr, HAS_NORM: gl.constexpr, D: gl.constexpr,
                               GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        R: gl.constexpr = D // 2
        HT: gl.constexpr = BLOCK_N // D  # whole heads in the tile
        a_ring, b_ring, ready, tiles_m, tiles_n, first, stride, steps, run = _start(a_desc, b_desc, M, N, K, GROUP_M,
                                                                                   STAGES)
        out_tile = gl.allocate_shared_memory(out_desc.dtype, out_desc.block_type.shape, out_desc.layout)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=ACC_LAYOUT(num_warps))
        for t in range(run // steps):
            acc = _tile_products(a_desc, b_desc, a_ring, b_ring, ready, acc, t, steps, run, first, stride, tiles_m,
                                 tiles_n, GROUP_M, STAGES)
            off_m, off_n = _tile_offsets(first + t * stride, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
            y = _scaled(acc, off_m, off_n, sx_ptr, sw_ptr, bias_ptr, M, N, HAS_BIAS, BLOCK_M, BLOCK_N)
            y = y.to(gl.bfloat16).to(gl.float32)  # the product as int8_linear writes it
            which = off_n // HD  # 0 q, 1 k, 2 v: the tile lies in one of them
            # (Each branch stores: the head math leaves the values in another layout than y's.)
            if which < 2:
                # [BM, heads, 2 halves, R] -> each head's first and second half: n[j] and its rotary partner n[j + R].
                a, b = gl.split(gl.permute(gl.reshape(y, [BLOCK_M, HT, 2, R]), [0, 1, 3, 2]))
                # Index vectors in a's layout less its head axis (the [BM, R] planes), then less one more axis.
                j = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(1, a.type.layout)))
                if HAS_NORM:
                    ms = gl.div_rn(gl.sum(a * a, axis=2) + gl.sum(b * b, axis=2), D * 1.0)
                    inv = gl.expand_dims(gl.div_rn(1.0, gl.sqrt_rn(ms + eps)), 2)
                    gain_a = gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + j), 0), 1)
                    gain_b = gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + R + j), 0), 1)
                    a = (a * inv) * gain_a
                    b = (b * inv) * gain_b
                rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(1, a.type.layout)))
                angle = gl.expand_dims(rm, 1) * R + gl.expand_dims(j, 0)
                inside = gl.expand_dims(rm < M, 1)
                cos = gl.expand_dims(gl.load(cos_ptr + angle, mask=inside, other=1.0), 1)
                sin = gl.expand_dims(gl.load(sin_ptr + angle, mask=inside, other=0.0), 1)
                turned = gl.join(a * cos - b * sin, b * cos + a * sin)  # [BM, heads, R, 2]
                y_turned = gl.reshape(gl.permute(turned, [0, 1, 3, 2]), [BLOCK_M, BLOCK_N]).to(gl.bfloat16)
                _store_out3(gl.reshape(y_turned, [1, BLOCK_M, BLOCK_N]), out_desc, out_tile, which, off_m,
                            off_n - which * HD)
            else:
                _store_out3(gl.reshape(y.to(gl.bfloat16), [1, BLOCK_M, BLOCK_N]), out_desc, out_tile, which, off_m,
                            off_n - which * HD)
        tma.store_wait(0)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))


def qkv_rope_linear_gluon(q, s_x, w, s_w, bias, heads, head, q_weight, k_weight, cos, sin, eps=1e-6, *, group=0,
                          tile=None):
    """As kernels/qkv_rope_linear.qkv_rope_linear: (q, k, v) [G, heads, g, head] bf16 views of one [3, M, heads,
    head] buffer. CUDA (Hopper), K a multiple of 16; BLOCK_N whole heads dividing heads x head. tile: TILE's keys."""
    if not available():
        raise RuntimeError("qkv_rope_linear_gluon: this Triton has no Gluon (3.5 or later needed)")
    t = {**TILE, "STAGES": 3, **(tile or {})}
    (m, k), n, g = q.shape, w.shape[0], group or q.shape[0]
    if m % max(g, 1) or n != 3 * heads * head or cos.shape != (m, head // 2) or sin.shape != cos.shape or head % 2:
        raise ValueError(f"qkv_rope_linear_gluon: weight [3 x {heads} x {head}, K], cos/sin [{m}, {head // 2}] and "
                         f"groups of {g} rows, got {tuple(w.shape)} and {tuple(cos.shape)}")
    if t["BLOCK_N"] % head or (heads * head) % t["BLOCK_N"] or k % 16 or q.dtype != torch.int8 or not q.is_cuda:
        raise ValueError(f"qkv_rope_linear_gluon: BLOCK_N {t['BLOCK_N']} must hold whole heads of {head} and divide "
                         f"{heads} x {head}; codes CUDA int8 with K a multiple of 16")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qkv_rope_linear_gluon: q and k are normed together (both weights or neither)")
    out = torch.empty(3, m, heads * head, dtype=torch.bfloat16, device=q.device)
    views = tuple(v.reshape(m // max(g, 1), g, heads, head).transpose(1, 2) for v in out)
    if m == 0:
        return views
    bm, bn, bk = t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"]
    norms = torch.stack([q_weight.float(), k_weight.float()]).contiguous() if q_weight is not None else s_x
    _qkv_rope_gluon_kernel[_grid(m, n, t, q.device)](
        _descriptor(q.contiguous(), [bm, bk], gl.int8), _descriptor(w.contiguous(), [bn, bk], gl.int8),
        _descriptor(out, [1, bm, bn], gl.bfloat16), s_x.float().contiguous().reshape(-1),
        s_w.float().contiguous().reshape(-1), bias if bias is not None else s_w, norms, cos.float().contiguous(),
        sin.float().contiguous(), m, n, k, heads * head, eps, HAS_BIAS=bias is not None,
        HAS_NORM=q_weight is not None, D=head, GROUP_M=t["GROUP_M"], STAGES=t["STAGES"], num_warps=t["num_warps"],
        enable_fp_fusion=False)
    return views
