"""Attention with INT8 scores on Hopper: q k^T on the INT8 matrix cores, the softmax in f32, p v in bf16 (Gluon).

Issue 6. Why: a graphed FLUX.3 Klein step runs at the H200's 700 W limit and follows its joules; attention (cuDNN
bf16) is about 29% of them, and NVIDIA's own FP8 attention takes 0.69x bf16's joules. Only the scores are
8-bit here: e4m3 p v was slower (its operand's layout conversion) and tripled the error against f32 (this
kernel's about 1.3%, cuDNN's bf16 0.2%).
For rows q, k, v [M, H D] bf16 (head h at columns h D .. h D + D - 1, D = 128; kernels/head_norm_rope.py's rows):
1. q codes a row and head: a = max_d |q[m, h, d]|, sq[h, m] = a / 127, cq = rint(q (127 / a)) (ties to even).
   k codes a block of BLOCK_N = 128 rows and head: a = max over the block's rows and d, sk[h, b] = a / 127, ck alike.
   (1e-30 stands for a of 0.) A block's scale, not a row's, so the softmax's factor is a row's, not an element's.
2. s[i, j] = sum_d cq[i, d] ck[j, d], exact in int32 (|s| <= 128 * 127^2 < 2^22).
3. x[i, j] = s[i, j] * (sq[h, i] * sk[h, j / 128] * log2(e) / sqrt(D)), f32: scores in base 2.
4. o[i] = sum_j bf16(2^(x_ij - m_i)) v[j] / sum_j 2^(x_ij - m_i), m_i the row's running maximum (flash attention's
   online rescaling by 2^(m_old - m_new)); the products and sums in f32, o rounded once to bf16.
The kernel: a program a 128-row block of one head; a producer warp brings the block's q codes once and k codes and
v by TMA into a ring of STAGES slots; two consumer warpgroups (64 rows each) take every slot. Each issues key block
j's q k^T with block j - 1's p v behind it and awaits only the first, so j's softmax runs under j - 1's p v. Step 3
never uses the int32 -> f32 instruction (a quarter of the FMA's rate, as heavy as the MUFU's exp2 beside it): s +
1.5 * 2^23 as bits is that f32 exactly (|s| < 2^22), its row maximum is s's, and x - m is one fma of it. At
Klein's shape it takes cuDNN's time at 0.96x its joules (bench/bench_attention.py); the products in turns were
slower.
"""
from __future__ import annotations

import logging
import math
import os

import torch

from ..gluon_builds import build_failure
from ..rounding import round_half_even
from ..jit import gluon_jit, triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .hopper_epilogues import tma_load
    from .linear_hopper import tma_descriptor
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None

HEAD, BLOCK_M, BLOCK_N = 128, 128, 128
STAGES = 3  # two stall (a slot frees after its p v); four were 1-3% faster alone, their joules no better
LOG2E = 1.4426950408889634
UNBUILT: list[str] = []  # why this Triton could not build the kernel (Gluon's API moves between releases)


def codes_reference(x: torch.Tensor, heads: int, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 in plain torch: (codes int8 [M, H D], scales f32 [H, M] (per_row) or [H, ceil(M / BLOCK_N)])."""
    m = x.shape[0]
    t = x.float().reshape(m, heads, HEAD)
    if per_row:
        amax = t.abs().amax(-1).t()  # [H, M]
        inv = torch.full_like(amax, 127.0) / amax.clamp(min=1e-30)
        codes = (t * inv.t()[:, :, None]).round()
    else:
        blocks = -(-m // BLOCK_N)
        padded = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, blocks * BLOCK_N - m))
        amax = padded.abs().reshape(blocks, BLOCK_N, heads, HEAD).amax((1, 3)).t()  # [H, blocks]
        inv = torch.full_like(amax, 127.0) / amax.clamp(min=1e-30)
        codes = (padded * inv.t().repeat_interleave(BLOCK_N, 0)[:, :, None]).round()[:m]
    scales = amax.clamp(min=1e-30) / torch.full_like(amax, 127.0)
    return codes.to(torch.int8).reshape(m, heads * HEAD), scales


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Steps 1-4 in float64 (p rounded to bf16 against the row's final maximum): rows [M, H D] bf16."""
    m = q.shape[0]
    (cq, sq), (ck, sk) = codes_reference(q, heads, True), codes_reference(k, heads, False)
    cq, ck = (c.double().reshape(m, heads, HEAD).transpose(0, 1) for c in (cq, ck))
    s = cq @ ck.transpose(1, 2)  # [H, M, M], exact
    key_scale = sk.double().repeat_interleave(BLOCK_N, 1)[:, :m]
    x = s * (sq.double()[:, :, None] * key_scale[:, None, :]) * (LOG2E / math.sqrt(HEAD))
    p = torch.exp2(x - x.amax(-1, keepdim=True))
    vh = v.double().reshape(m, heads, HEAD).transpose(0, 1)
    o = (p.to(torch.bfloat16).double() @ vh) / p.sum(-1, keepdim=True)
    return o.transpose(0, 1).reshape(m, heads * HEAD).to(torch.bfloat16)


@triton_jit
def _codes_kernel(x_ptr, c_ptr, s_ptr, M, H, PER_ROW: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr):
    """Step 1 for a block of BLOCK rows of head program_id(1)."""
    b, h = tl.program_id(0), tl.program_id(1)
    rows = b * BLOCK + tl.arange(0, BLOCK)
    at = rows[:, None] * (H * D) + h * D + tl.arange(0, D)[None, :]
    x = tl.load(x_ptr + at, mask=rows[:, None] < M, other=0.0).to(tl.float32)
    if PER_ROW:
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-30)
        codes = round_half_even(x * (127.0 / amax)[:, None])
        tl.store(s_ptr + h * M + rows, amax / 127.0, mask=rows < M)
    else:
        amax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-30)
        codes = round_half_even(x * (127.0 / amax))
        tl.store(s_ptr + h * tl.cdiv(M, BLOCK) + b, amax / 127.0)
    tl.store(c_ptr + at, codes.to(tl.int8), mask=rows[:, None] < M)


def codes(x: torch.Tensor, heads: int, per_row: bool, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 by _codes_kernel: what codes_reference returns, bit for bit (out: (codes, scales), written fully)."""
    m = x.shape[0]
    c, s = out if out is not None else (
        torch.empty(m, heads * HEAD, dtype=torch.int8, device=x.device),
        torch.empty(heads, m if per_row else triton.cdiv(m, BLOCK_N), dtype=torch.float32, device=x.device))
    block = 64 if per_row else BLOCK_N
    _codes_kernel[(triton.cdiv(m, block), heads)](x, c, s, m, heads, PER_ROW=per_row, BLOCK=block, D=HEAD,
                                                  num_warps=4)
    return c, s


def unusable(q: torch.Tensor, heads: int) -> str | None:
    """None when the kernel can take rows q [M, H D] (and k, v alike), else why not."""
    if q.dim() != 2 or q.shape[1] != heads * HEAD or q.stride() != (heads * HEAD, 1) or q.dtype != torch.bfloat16:
        return f"rows must be contiguous bf16 [M, heads x {HEAD}]"
    if UNBUILT:
        return f"not built: {UNBUILT[0]}"
    if gluon is None or os.environ.get("TRITON_INTERPRET") == "1":
        return "no Gluon, or interpreted"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "not a Hopper GPU (wgmma)"
    return None


if gluon is not None:
    @gluon_jit
    def _loads(q_desc, k_desc, v_desc, q_tile, k_ring, v_ring, q_ready, ready, empty, M):
        """The producer warp: the block's q codes once, then each key block's k codes and v rows into slot j % STAGES
        once both consumers freed it from block j - STAGES."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        D: gl.constexpr = k_desc.block_type.shape[1]
        S: gl.constexpr = k_ring.shape[0]
        h = gl.program_id(1)
        mbarrier.expect(q_ready, q_desc.block_type.nbytes)
        tma_load(q_desc, [gl.program_id(0) * q_desc.block_type.shape[0], h * D], q_ready, q_tile)
        for j in range(gl.cdiv(M, BN)):
            slot = j % S
            mbarrier.wait(empty.index(slot), ((j // S) & 1) ^ 1)  # a fresh barrier passes parity 1
            mbarrier.expect(ready.index(slot), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma_load(k_desc, [j * BN, h * D], ready.index(slot), k_ring.index(slot))  # zeros past M
            tma_load(v_desc, [j * BN, h * D], ready.index(slot), v_ring.index(slot))

    @gluon_jit
    def _softmax_block(s, r, m_i, j, M, EVEN: gl.constexpr, BN: gl.constexpr):
        """Step 4's part of key block j: (p = 2^(x - m_new), m_new, 2^(m_i - m_new)) from its int32 scores s and the
        rows' factors r (step 3). The scores biased by 1.5 * 2^23 as f32 bits are s + 1.5 * 2^23 exactly (|s| <
        2^22) and keep s's order: their row maximum is taken as they are, and x - m_new is one fma of them."""
        fb = (s + 0x4B400000).to(gl.float32, bitcast=True)
        if not EVEN:
            cols = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
            fb = gl.where(gl.expand_dims(cols < M, 0), fb, 0.0)
        m_new = gl.maximum(m_i, (gl.max(fb, axis=1) - 12582912.0) * r)
        x = fb * gl.expand_dims(r, 1) - gl.expand_dims(m_new + 12582912.0 * r, 1)
        if not EVEN:
            x = gl.where(gl.expand_dims(cols < M, 0), x, float("-inf"))
        return gl.exp2(x), m_new, gl.exp2(m_i - m_new)

    @gluon_jit
    def _rows(q_tile, k_ring, v_ring, q_ready, ready, empty, sq_ptr, sk_ptr, o_ptr, M, H, factor,
              EVEN: gl.constexpr, W: gl.constexpr):
        """Consumer W: the block's rows 64 W .. 64 W + 63 through every key block (steps 2-4), then o stored. Key
        block j's q k^T is issued with block j - 1's p v behind it, so j's softmax runs under j - 1's p v."""
        BN: gl.constexpr = k_ring.shape[1]
        D: gl.constexpr = k_ring.shape[2]
        S: gl.constexpr = k_ring.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN, 32])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        h = gl.program_id(1)
        first = gl.program_id(0) * (2 * 64) + W * 64
        rows = first + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        row_factor = gl.load(sq_ptr + h * M + rows, mask=rows < M, other=0.0) * factor
        blocks = gl.cdiv(M, BN)
        zeros = gl.zeros([64, BN], gl.int32, layout=s_layout)
        q_rows = q_tile.slice(W * 64, 64)
        mbarrier.wait(q_ready, 0)
        mbarrier.wait(ready.index(0), 0)
        s = warpgroup_mma(q_rows, k_ring.index(0).permute((1, 0)), zeros, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_rows, k_ring.index(0)))[0]
        m_i = gl.full([64], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        p, m_i, alpha = _softmax_block(s, row_factor * gl.load(sk_ptr + h * blocks), m_i, 0, M, EVEN, BN)
        l_i = gl.sum(p, axis=1)
        p16 = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = gl.zeros([64, D], gl.float32, layout=o_layout)
        for j in range(1, blocks):
            slot, last = j % S, (j - 1) % S
            mbarrier.wait(ready.index(slot), (j // S) & 1)
            s = warpgroup_mma(q_rows, k_ring.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
            acc = warpgroup_mma(p16, v_ring.index(last), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, q_rows, k_ring.index(slot)))[0]
            p, m_i, alpha = _softmax_block(s, row_factor * gl.load(sk_ptr + h * blocks + j), m_i, j, M, EVEN, BN)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, v_ring.index(last)))[0]
            mbarrier.arrive(empty.index(last))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            p16 = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        last = (blocks - 1) % S
        acc = warpgroup_mma(p16, v_ring.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, v_ring.index(last)))[0]
        mbarrier.arrive(empty.index(last))
        o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
        out_rows = first + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        at = gl.expand_dims(out_rows, 1) * (H * D) + h * D + gl.expand_dims(cols, 0)
        gl.store(o_ptr + at, o.to(gl.bfloat16), mask=gl.expand_dims(out_rows < M, 1))

    @gluon_jit
    def _attention_kernel(q_desc, k_desc, v_desc, sq_ptr, sk_ptr, o_ptr, M, H, factor, EVEN: gl.constexpr,
                          STAGES: gl.constexpr):
        q_tile = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
        k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)  # both consumers
        fence_async_shared()
        gl.warp_specialize([
            (_rows, (q_tile, k_ring, v_ring, q_ready, ready, empty, sq_ptr, sk_ptr, o_ptr, M, H, factor, EVEN, 0)),
            (_rows, (q_tile, k_ring, v_ring, q_ready, ready, empty, sq_ptr, sk_ptr, o_ptr, M, H, factor, EVEN, 1)),
            (_loads, (q_desc, k_desc, v_desc, q_tile, k_ring, v_ring, q_ready, ready, empty, M)),
        ], [4, 1], [232, 24])


def operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple:
    """The kernel's operands from rows q, k, v [M, H D] bf16: q codes and scales, k codes and scales, v's rows."""
    return (*codes(q, heads, True), *codes(k, heads, False), v)


def launch(cq, sq, ck, sk, v, heads: int, stages: int = STAGES) -> torch.Tensor | None:
    """o [M, H D] bf16 from operands()' tensors (the caller asks `unusable` first), k and v through a ring of
    `stages` slots; None where this Triton could not build the kernel (UNBUILT says why, logged once; the caller
    runs SDPA)."""
    m = cq.shape[0]
    out = torch.empty_like(v)
    why = build_failure(lambda: _attention_kernel[(triton.cdiv(m, BLOCK_M), heads)](
        tma_descriptor(cq, [BLOCK_M, HEAD], gl.int8), tma_descriptor(ck, [BLOCK_N, HEAD], gl.int8),
        tma_descriptor(v, [BLOCK_N, HEAD], gl.bfloat16), sq, sk, out, m, heads, LOG2E / math.sqrt(HEAD),
        EVEN=m % BLOCK_N == 0, STAGES=stages, num_warps=4))
    if why is not None:
        UNBUILT.append(why)
        logging.getLogger(__name__).warning("attention_int8: not built (%s); attention stays on SDPA", why)
        return None
    return out


def attention_int8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                   stages: int = STAGES) -> torch.Tensor | None:
    """Rows q, k, v [M, H D] bf16 to o [M, H D] bf16 by this file's math (the caller asks `unusable` first); None
    where the kernel could not be built (launch)."""
    return launch(*operands(q, k, v, heads), heads, stages)
