"""The QKV product with the q/k head norm and rotary in its epilogue: kernels/int8/linear.py then
kernels/head_norm_rope.py in one launch (dit_core/gpu/block.py's QKV where it is INT8 and turns whole heads).

Issue 4. Why: the two-launch path writes the product's bf16 rows [M, 3 heads D] and reads them back (at Z-Image's 1024^2
shape 106 MB each way, head_norm_rope 78 us a block); here each output tile goes through the head math while in
registers (about 4% faster than the two launches on the H200, bench_int8_linear.py). Math: with the INT8
ConvRot product of int8_linear's docstring, rounded to bf16 as int8_linear returns it, qkv = bf16(q w^T s_x s_w + bias),
then head_norm_rope's math on qkv for the split-half rotary of r = D / 2 (FLUX.3's and Z-Image's heads: every column
turned), the same one rounding to bf16 at the end, written as head_norm_rope writes it: q, k, v of one buffer [3, M,
heads, D] (BSHD), returned as [G, heads, g, D] views. A tile holds whole heads of one of q, k or v (BLOCK_N a multiple
of D that divides heads D), so a row's RMS over its head is a sum within the tile. The RMS sums run in another order
than head_norm_rope's: within one bf16 step of it. (Slower on the H200: the epilogue a head at a time; the
rotary tables and the rows through TMA descriptors; a persistent loop at 3 stages. The epilogue costs about 60
us a call over the product. Two programs an SM on 128 x 128 tiles of 4 warps, so that one's epilogue runs
under the other's products, were no faster alone and made a Z-Image step slower.) On Hopper with heads of 128
this epilogue runs in kernels/int8/linear_hopper.py instead (a tile a head; v bit for bit, q and k within one
bf16 step of this kernel's). Where asked (turn_v), v leaves turned along each 64 columns' top base-4 digit, a
factor of OUT's ConvRot rotation (kernels/int8/quant_turned.py): here a product with (H4 / 2) (x) I_16, in the
Hopper epilogue sums in registers.
"""
from __future__ import annotations

import functools

import torch

from .. import head_norm_rope
from . import linear, linear_hopper
from ..choices import DEFAULT, Choices
from .products import dequantized, products, tile_of
from .quant_turned import BLOCK as TURN
from .quant_turned import turn_matrix, turned_rows
from .tiles import candidate_tiles, config, fixed_tiles, launch_grid, tma_where_it_can, tune_bucket
from ..rounding import round_to_bf16, rounded_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None


def reference(q, s_x, w, s_w, bias, heads, head, q_weight, k_weight, cos, sin, eps=1e-6, *, group=0, angles=None,
              turn_v=False):
    """The two launches it replaces, as their plain-torch references: (q, k, v) [G, heads, g, head] bf16, v turned
    where asked. (angles: the tables' factors, read only by the Hopper epilogue: the tables are the rotary's
    truth.)"""
    qkv = linear.reference(q, s_x, w, s_w, bias)
    q, k, v = head_norm_rope.reference(qkv, heads, head, q_weight, k_weight, cos, sin, eps, group=group)
    return (q, k, turned_rows(v)) if turn_v else (q, k, v)


@triton_jit
def _qkv_rope_kernel(q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, nw_ptr, cos_ptr, sin_ptr, h_ptr, out_ptr, M, N, K, HD,
                     eps, M_TUNE, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, D: tl.constexpr, WIDE: tl.constexpr,
                     EVEN_K: tl.constexpr, TURN_V: tl.constexpr, DOT_DTYPE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     TMA: tl.constexpr, PERSISTENT: tl.constexpr, SUBTILE: tl.constexpr):
    # SUBTILE: int8_linear's configs carry it (pruned here: this epilogue takes whole tiles).
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    a_desc = None
    b_desc = None
    if TMA:
        a_desc = tl.make_tensor_descriptor(q_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=True):
            _qkv_rope_tile(tile, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, nw_ptr, cos_ptr, sin_ptr, h_ptr, out_ptr,
                           a_desc, b_desc, M, N, K, HD, eps, tiles_m, tiles_n, HAS_BIAS, HAS_NORM, D, WIDE, EVEN_K,
                           TURN_V, DOT_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, TMA)
    else:
        _qkv_rope_tile(tl.program_id(0), q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, nw_ptr, cos_ptr, sin_ptr, h_ptr,
                       out_ptr, a_desc, b_desc, M, N, K, HD, eps, tiles_m, tiles_n, HAS_BIAS, HAS_NORM, D, WIDE, EVEN_K,
                       TURN_V, DOT_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, TMA)


@triton_jit
def _qkv_rope_tile(tile, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, nw_ptr, cos_ptr, sin_ptr, h_ptr, out_ptr, a_desc,
                   b_desc, M, N, K, HD, eps, tiles_m, tiles_n, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                   D: tl.constexpr, WIDE: tl.constexpr, EVEN_K: tl.constexpr, TURN_V: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr):
    R: tl.constexpr = D // 2
    HT: tl.constexpr = BLOCK_N // D  # whole heads in the tile
    pid_m, pid_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
    acc = products(q_ptr, w_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, 0, K, TMA, EVEN_K, BLOCK_M, BLOCK_N,
                   BLOCK_K)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    # the product as int8_linear writes it
    y = round_to_bf16(dequantized(acc, rm, rn, mmask, rn < N, sx_ptr, sw_ptr, bias_ptr, HAS_BIAS))
    which = (pid_n * BLOCK_N) // HD  # 0 q, 1 k, 2 v: the tile lies in one of them
    if which < 2:
        # [BM, heads, 2 halves, R] -> each head's first and second half: n[j] and its rotary partner n[j + R].
        a, b = tl.split(tl.permute(tl.reshape(y, (BLOCK_M, HT, 2, R)), (0, 1, 3, 2)))
        if HAS_NORM:
            ms = tl.math.div_rn(tl.sum(a * a, axis=2) + tl.sum(b * b, axis=2), D * 1.0)
            inv = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))[:, :, None]
            j = tl.arange(0, R)
            a = (a * inv) * tl.load(nw_ptr + which * D + j)[None, None, :]
            b = (b * inv) * tl.load(nw_ptr + which * D + R + j)[None, None, :]
        angle = rm[:, None] * R + tl.arange(0, R)[None, :]
        c = tl.load(cos_ptr + angle, mask=mmask[:, None], other=1.0)[:, None, :]
        s = tl.load(sin_ptr + angle, mask=mmask[:, None], other=0.0)[:, None, :]
        turned = tl.join(a * c - b * s, b * c + a * s)  # [BM, heads, R, 2]
        y = tl.reshape(tl.permute(turned, (0, 1, 3, 2)), (BLOCK_M, BLOCK_N))
    elif TURN_V:  # each 64 columns of v times (H4 / 2) (x) I_16: exact products of the bf16 values, f32 sums
        hq = tl.arange(0, 64)
        h = tl.load(h_ptr + hq[:, None] * 64 + hq[None, :]).to(DOT_DTYPE)
        blocks = tl.reshape(y, (BLOCK_M * (BLOCK_N // 64), 64)).to(DOT_DTYPE)
        y = tl.reshape(tl.dot(blocks, h, input_precision="ieee", out_dtype=tl.float32), (BLOCK_M, BLOCK_N))
    # [3, M, heads, D]: the tile's columns within q, k or v, at row m; 32-bit offsets within a plane below 2^31
    # outputs (WIDE off): a [BLOCK_M, BLOCK_N] tensor of 64-bit ones takes twice the registers.
    row = rm.to(tl.int64) if WIDE else rm
    dst = out_ptr + which.to(tl.int64) * M * HD + (row[:, None] * HD + (rn - which * HD)[None, :])
    tl.store(dst, rounded_bf16(y), mask=mmask[:, None])


_UNFIT: list = []  # the fixed Hopper tile, once it ran out of shared memory with this epilogue


def _fits(block_n: int, heads: int, head: int) -> bool:
    return block_n % head == 0 and (heads * head) % block_n == 0


@functools.cache
def _autotuned():
    """int8_linear's tiles, those of whole heads (and TMA where K allows it)."""
    def whole_heads(configs, named_args, **kwargs):
        d, hd = kwargs["D"], named_args["HD"]
        kept = [c for c in tma_where_it_can(configs, named_args) if _fits(c.kwargs["BLOCK_N"], hd // d, d)
                and not c.kwargs["SUBTILE"]]
        return kept or [config(64, d, 64, 4, 3)]
    return triton.autotune(candidate_tiles(gated=False), key=["M_TUNE", "N", "K", "HD"],
                           prune_configs_by={"early_config_prune": whole_heads}, cache_results=True)(_qkv_rope_kernel)


def qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, q_weight, k_weight, cos, sin, eps=1e-6, *, group=0,
                    tiles=None, angles=None, turn_v=False, choices: Choices = DEFAULT):
    """(q, k, v) [G, heads, g, head] bf16 views of one [3, M, heads, head] buffer, equal (within one bf16 step of
    the RMS) to head_norm_rope(int8_linear(q, s_x, w, s_w, bias), heads, head, q_weight, k_weight, cos, sin, eps,
    group=group) for cos/sin [M, head / 2]. tiles: None (Hopper's fixed tile, HOPPER_TILES["qkv_rope"], where it
    holds whole heads, else autotuned over tiles that do) or int8_linear's form. angles: None, or the factors of
    cos's and sin's angles (positions [M, 4], freqs [2, head / 2], the first columns of axes 1-3:
    kernels/int8/hopper_epilogues.py), from which the Hopper kernel makes cos and sin rather than reading them.
    turn_v: v's each 64 columns leave turned along their top base-4 digit, bf16(v ((H4 / 2) (x) I_16))
    (quant_turned.turned_rows; head a multiple of 64): the rotation's share that the Hopper epilogue does in
    registers, so that the attention's output rows go to codes in kernels/int8/quant_turned.py's one pass.
    choices: the Hopper kernel's (hopper_gemm, group_m; kernels/choices.py)."""
    m, k = q.shape
    n, g = w.shape[0], group or m
    if m % max(g, 1):
        raise ValueError(f"qkv_rope_linear: {m} rows do not split into attention groups of {g}")
    if n != 3 * heads * head or cos.shape != (m, head // 2) or sin.shape != cos.shape or head % 2:
        raise ValueError(f"qkv_rope_linear: weight [3 x {heads} x {head}, K] and cos/sin [{m}, {head // 2}] "
                         f"(every column turned), got {tuple(w.shape)} and {tuple(cos.shape)}")
    if angles is not None and (tuple(angles[0].shape) != (m, 4) or tuple(angles[1].shape) != (2, head // 2)):
        raise ValueError(f"qkv_rope_linear: angles' positions [{m}, 4] and freqs [2, {head // 2}], got "
                         f"{tuple(angles[0].shape)} and {tuple(angles[1].shape)}")
    if turn_v and head % TURN:
        raise ValueError(f"qkv_rope_linear: turn_v turns v by blocks of {TURN} columns within a head, not {head}")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qkv_rope_linear: q and k are normed together (both weights or neither)")
    out = torch.empty(3, m, heads, head, dtype=torch.bfloat16, device=q.device)
    views = tuple(t.reshape(m // max(g, 1), g, heads, head).transpose(1, 2) for t in out)
    if m == 0:
        return views
    if tiles is None and choices.hopper_gemm and head == linear_hopper.TILE["BLOCK_N"] and \
            linear_hopper.unusable(q, out, heads * head * 2) is None and linear_hopper.launch(
            q, s_x, w, s_w, bias, out.view(3, m, heads * head), linear_hopper.QKV_ROPE,
            norms=head_norm_rope.qk_norm_rows(q_weight, k_weight) if q_weight is not None else None, cos=cos,
            sin=sin, angles=angles, heads_d=heads * head, head=head, eps=eps, turn=turn_v, group_m=choices.group_m):
        return views
    fixed = fixed_tiles("qkv_rope", q.device, k)
    fixed = fixed if tiles is None and fixed and _fits(fixed["BLOCK_N"], heads, head) and not _UNFIT else None
    tiles = tiles or fixed
    weights = head_norm_rope.qk_norm_rows(q_weight, k_weight) if q_weight is not None else s_x
    args = (q.contiguous(), s_x.float().contiguous().reshape(-1), w.contiguous(), s_w.float().contiguous().reshape(-1),
            bias if bias is not None else s_x, weights, cos.float().contiguous(), sin.float().contiguous(),
            turn_matrix(q.device) if turn_v else s_x, out, m, n, k, heads * head, eps, tune_bucket(m))
    # TURN_V's products: bf16 on the matrix cores, f32 on the CPU (the interpreter multiplies bf16 as 16-bit ints)
    flags = {"HAS_BIAS": bias is not None, "HAS_NORM": q_weight is not None, "D": head, "WIDE": m * n >= 2**31,
             "EVEN_K": k % (tiles["BLOCK_K"] if tiles else 128) == 0, "TURN_V": turn_v,
             "DOT_DTYPE": tl.bfloat16 if q.is_cuda else tl.float32}
    grid = launch_grid(m, n, q.device)
    if tiles is None:
        _autotuned()[grid](*args, **flags, enable_fp_fusion=False)
    else:
        if not _fits(tiles["BLOCK_N"], heads, head):
            raise ValueError(f"qkv_rope_linear: BLOCK_N {tiles['BLOCK_N']} must hold whole heads of {head} and "
                             f"divide {heads} x {head}")
        tiles = {"TMA": False, "PERSISTENT": False, "SUBTILE": 0, **tiles}
        try:
            _qkv_rope_kernel[grid](*args, **flags, **tiles, enable_fp_fusion=False)
        except triton.runtime.errors.OutOfResources:
            if not fixed:
                raise
            _UNFIT.append(tiles)  # nothing ran: autotune (over tiles that fit) from now on
            _autotuned()[grid](*args, **flags, enable_fp_fusion=False)
    return views
