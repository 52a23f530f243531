"""The INT8 GEMM's main loop, shared by kernels/int8/linear.py and kernels/int8/qkv_rope_linear.py: the order programs
take the output tiles in, a tile's int32 products over a run of K, a tile's column halves, the epilogues' first
steps (the scales and bias; SwiGLU of column pairs) and int8_linear's whole epilogue; and the references' exact
products.

Issue 4; reference/int8_convrot_format.md section 6 (the forward formula): acc[m, n] = sum over k of q[m, k]
w[n, k], exact in int32 (|sums| <= K 2^14 < 2^31). On Hopper the loads are TMA descriptors' and tl.dot lowers
to wgmma on int8 operands.
"""
from __future__ import annotations

import torch

from .quant_turned import turned_hidden, turned_top
from ..rounding import round_to_bf16, rounded_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None


def exact_products(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q wᵀ exactly (|sums| <= K 2^14 < 2^31): cuBLASLt's INT8 product on a GPU where its shapes allow (more than 16
    rows, K and N multiples of 8; the reference runs where Triton is missing), else in float64."""
    if q.is_cuda and q.shape[0] > 16 and q.shape[1] % 8 == 0 and w.shape[0] % 8 == 0:
        try:
            return torch._int_mm(q.contiguous(), w.contiguous().t())
        except RuntimeError:  # a layout or build whose cuBLASLt does not take it: the float64 products below
            pass
    return q.double() @ w.double().t()


@triton_jit
def tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Program order: GROUP_M row tiles walk the column tiles together, so their weight columns stay in L2."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton_jit
def products(q_ptr, w_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, k_lo, k_hi, TMA: tl.constexpr,
              EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] int32 = the tile's q wᵀ over K's columns [k_lo, k_hi) (multiples of BLOCK_K)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    if TMA:
        # Hopper's tensor memory accelerator: one instruction a tile, zeros past the edges, no address math.
        for k0 in range(k_lo, k_hi, BLOCK_K):
            a = a_desc.load([pid_m * BLOCK_M, k0])
            b = b_desc.load([pid_n * BLOCK_N, k0])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    else:
        rk = tl.arange(0, BLOCK_K)
        # Rows and columns past the edge read row M-1 / N-1 (clamped: unconditional loads), never stored.
        rm_in = tl.minimum(pid_m * BLOCK_M + tl.arange(0, BLOCK_M), M - 1).to(tl.int64)
        rn_in = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
        a_ptrs = q_ptr + rm_in[:, None] * K + (k_lo + rk)[None, :]
        # A [BLOCK_K, BLOCK_N] view of w: K-major, the only layout int8 wgmma takes for B.
        b_ptrs = w_ptr + rn_in[None, :] * K + (k_lo + rk)[:, None]
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0)
                b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
    return acc


@triton_jit
def halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc's columns [0, BLOCK_N / 2) and [BLOCK_N / 2, BLOCK_N), as a pair."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton_jit
def dequantized(acc, rm, rn, mmask, nmask, sx_ptr, sw_ptr, bias_ptr, HAS_BIAS: tl.constexpr):
    """y [rows rm, columns rn] f32 = float(acc) * (s_x[m] * s_w[n]) + bias[n], each operation rounded (the launches
    turn fused multiply-adds off): int8_linear's math."""
    sx = tl.load(sx_ptr + rm, mask=mmask, other=0.0)
    sw = tl.load(sw_ptr + rn, mask=nmask, other=0.0)
    y = acc.to(tl.float32) * (sx[:, None] * sw[None, :])
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    return y


@triton_jit
def swiglu_pairs(y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TURN: tl.constexpr):
    """SiLU(gate) up of y's interleaved column pairs, [BLOCK_M, BLOCK_N / 2] bf16 values held in f32: each of gate
    and up rounded to bf16 first, as the product int8_linear writes; the division approximate (div.full: see
    int8_quant's swiglu). TURN: each 64 columns turned before the rounding (quant_turned.turned_hidden)."""
    gate, up = tl.split(tl.reshape(round_to_bf16(y), (BLOCK_M, BLOCK_N // 2, 2)))
    act = gate / (1.0 + tl.exp(-gate)) * up
    if TURN:
        act = turned_hidden(act, BLOCK_M, BLOCK_N // 2)
    return round_to_bf16(act)


@triton_jit
def gelu_rows(y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TURN: tl.constexpr):
    """GELU (tanh form) of y's values rounded to bf16 first, as the product int8_linear writes, f32 (int8_quant's
    gelu_tanh; the division approximate, as swiglu_pairs'); TURN: each 64 columns turned along digit d2 before the
    rounding (quant_turned.turned_f32's "v")."""
    u = round_to_bf16(y)
    act = u / (1.0 + tl.exp(-(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))))
    if TURN:
        act = turned_top(act, BLOCK_M, BLOCK_N)
    return act


@triton_jit
def linear_epilogue(acc, pid_m, pid_n, sx_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr, gate_ptr, map_ptr,
                    add_ptr, shared, M, N, R, HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, FORM: tl.constexpr,
                    ONE_GATE_ROW: tl.constexpr, HAS_ADDEND: tl.constexpr, WIDE: tl.constexpr,
                    LORA_DTYPE: tl.constexpr, TURN: tl.constexpr, GELU: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """kernels/int8/linear.py's epilogue on a tile (or a column part of one) of int32 products: its math's forms
    (FORM 0 bf16 rows, GELU's where GELU; 1 the gated residual; 2 SwiGLU), with the LoRA's product and the addend
    where given."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    y = dequantized(acc, rm, rn, mmask, nmask, sx_ptr, sw_ptr, bias_ptr, HAS_BIAS)
    if HAS_LORA:
        rr = tl.arange(0, BLOCK_R)
        down = tl.load(down_ptr + rm[:, None].to(tl.int64) * R + rr[None, :], mask=mmask[:, None] & (rr[None, :] < R),
                       other=0.0)
        up = tl.load(up_ptr + rn[None, :].to(tl.int64) * R + rr[:, None], mask=nmask[None, :] & (rr[:, None] < R),
                     other=0.0)
        y = y + tl.dot(down.to(LORA_DTYPE), up.to(LORA_DTYPE), input_precision="ieee", out_dtype=tl.float32)
    mask = mmask[:, None] & nmask[None, :]
    # 32-bit offsets below 2^31 outputs (WIDE off): live from the residual's load to its store, 64-bit ones spilled.
    row = rm.to(tl.int64) if WIDE else rm
    offs = row[:, None] * N + rn[None, :]
    if FORM == 1:  # gated residual
        if HAS_ADDEND:
            y = y + tl.load(add_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(out_ptr + offs, mask=mask, other=0.0)
        if ONE_GATE_ROW:  # every row takes gate row 0 (one modulation row): a vector, not a gather
            tl.store(out_ptr + offs, r + tl.load(gate_ptr + rn, mask=nmask, other=0.0)[None, :] * y, mask=mask)
        elif shared >= 0:  # the tile's rows share one gate row (_tile): a vector (kernels/int8/modulation_rows.py)
            tl.store(out_ptr + offs, r + tl.load(gate_ptr + shared * N + rn, mask=nmask, other=0.0)[None, :] * y,
                     mask=mask)
        else:
            rows = tl.load(map_ptr + rm, mask=mmask, other=0)  # the gate table: under 2^31 values
            tl.store(out_ptr + offs, r + tl.load(gate_ptr + rows[:, None] * N + rn[None, :], mask=mask, other=0.0) * y,
                     mask=mask)
    elif FORM == 2:  # SwiGLU of the column pairs (a tile holds whole pairs: BLOCK_N is even; turned: whole 64s)
        act = swiglu_pairs(y, BLOCK_M, BLOCK_N, TURN)
        rh = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + row[:, None] * (N // 2) + rh[None, :], act.to(tl.bfloat16),
                 mask=mmask[:, None] & (rh < N // 2)[None, :])
    else:
        if GELU:
            y = gelu_rows(y, BLOCK_M, BLOCK_N, TURN)
        tl.store(out_ptr + offs, rounded_bf16(y), mask=mask)
