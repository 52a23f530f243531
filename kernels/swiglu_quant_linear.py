"""The MLP's UP product with SwiGLU and the down projection's ConvRot rotation in its epilogue: kernels/int8_linear.py's
SwiGLU form and kernels/int8_quant.py's rotate pass (plain rows, group 256) in one launch, then the codes launch.

Issue 4. Why: the two launches write the hidden rows and read them back to rotate them (Z-Image's 4608 x 10240 bf16:
94 MB each way, 50 us and a launch a block). Math: h = int8_linear(q, s_x, w, s_w, bias, swiglu=True) (bf16 [M, N / 2],
the interleaved gate and up rows of int8_linear's docstring), then int8_quant's steps 2-5 on h as plain rows: codes
and scales equal to quantize_rows(h, 256) bit for bit (the same products, sums and roundings).
How: a tile of the product BLOCK_N = 256 columns wide holds 128 hidden columns, half a group. A program takes a
group's two tiles in turn (pair p: tiles 2 g and 2 g + 1 of a row block, g = the group): it stores the first tile's
SwiGLU rows in the output, where the rotated rows go, and in the second tile's epilogue reads them back (from L2: it
has just written them), rotates the whole group (H_64 on the matrix cores, then the radix-4 butterfly,
kernels/hadamard.py), stores the rotated rows over both halves and each row's absmax of the group. The codes launch
(kernels/int8_codes.py) reads them as after the rotate pass.
"""
from __future__ import annotations

import torch

from . import int8_linear, int8_quant
from .hadamard import hadamard_bf16, radix4_rounded
from .int8_codes import launch_codes
from .int8_products import dequantized, products, swiglu_pairs, tile_of
from .int8_tiles import fixed_tiles, launch_grid

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

GROUP = 256  # hidden columns a rotation group: a pair of tiles BLOCK_N = 256 wide
# Switch for the step benchmark's variant row (bench/step_variants.py): off, the product and the quantizer apart.
ENABLED = True


def reference(q, s_x, w, s_w, bias=None, *, out=None):
    """The two launches it replaces, as their plain-torch references: (codes int8 [M, N / 2], scales f32 [M])."""
    return int8_quant.reference(int8_linear.reference(q, s_x, w, s_w, bias, swiglu=True), GROUP, out=out)


@triton_jit
def _half_tile(pair, half, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, h_ptr, y_ptr, gmax_ptr, a_desc, b_desc, M, N, K,
               tiles_m, groups, HAS_BIAS: tl.constexpr, WIDE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
               DOT_DTYPE: tl.constexpr):
    """Tile `half` (0, 1) of a pair: its products and SwiGLU rows stored; the second then rotates the group's."""
    HALF: tl.constexpr = BLOCK_N // 2  # hidden columns of a tile: half a group
    pid_m, group = tile_of(pair, tiles_m, groups, GROUP_M)
    pid_n = 2 * group + half
    acc = products(q_ptr, w_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, 0, K, TMA, EVEN_K, BLOCK_M, BLOCK_N,
                   BLOCK_K)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    act = swiglu_pairs(dequantized(acc, rm, rn, mmask, rn < N, sx_ptr, sw_ptr, bias_ptr, HAS_BIAS), BLOCK_M,
                       BLOCK_N)
    # 32-bit offsets below 2^31 hidden values (WIDE off): a [BLOCK_M, 64] tensor of 64-bit ones takes 64 registers.
    tl.store(y_ptr + _offsets(rm, group * BLOCK_N + half * HALF, HALF, N, WIDE), act.to(tl.bfloat16),
             mask=mmask[:, None])
    if half == 1:
        # The group's SwiGLU rows read back ROWS at a time (the whole tile's rotation in registers spilled), each
        # read in full before its rotated rows go over it (bar.sync: CTA-scope order for global memory too).
        ROWS: tl.constexpr = min(BLOCK_M, 64)
        Q: tl.constexpr = BLOCK_N // 4  # a pair's 256 columns in four blocks
        hq = tl.arange(0, Q)
        h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
        for r in tl.static_range(BLOCK_M // ROWS):
            rows = pid_m * BLOCK_M + r * ROWS + tl.arange(0, ROWS)
            m2 = (rows < M)[:, None]
            tl.debug_barrier()
            z0 = _rotated_block(y_ptr, rows, group * BLOCK_N, h, m2, N, WIDE, DOT_DTYPE)
            z1 = _rotated_block(y_ptr, rows, group * BLOCK_N + Q, h, m2, N, WIDE, DOT_DTYPE)
            z2 = _rotated_block(y_ptr, rows, group * BLOCK_N + 2 * Q, h, m2, N, WIDE, DOT_DTYPE)
            z3 = _rotated_block(y_ptr, rows, group * BLOCK_N + 3 * Q, h, m2, N, WIDE, DOT_DTYPE)
            y0, y1, y2, y3 = radix4_rounded(z0, z1, z2, z3)
            tl.debug_barrier()
            tl.store(y_ptr + _offsets(rows, group * BLOCK_N, Q, N, WIDE), y0.to(tl.bfloat16), mask=m2)
            tl.store(y_ptr + _offsets(rows, group * BLOCK_N + Q, Q, N, WIDE), y1.to(tl.bfloat16), mask=m2)
            tl.store(y_ptr + _offsets(rows, group * BLOCK_N + 2 * Q, Q, N, WIDE), y2.to(tl.bfloat16), mask=m2)
            tl.store(y_ptr + _offsets(rows, group * BLOCK_N + 3 * Q, Q, N, WIDE), y3.to(tl.bfloat16), mask=m2)
            top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
            tl.store(gmax_ptr + rows * groups + group, tl.max(top, axis=1), mask=rows < M)


@triton_jit
def _offsets(rows, first, WIDTH: tl.constexpr, N, WIDE: tl.constexpr):
    """Offsets of the hidden rows' [rows, WIDTH] columns from `first` (the hidden rows are N / 2 wide)."""
    return (rows.to(tl.int64) if WIDE else rows)[:, None] * (N // 2) + first + tl.arange(0, WIDTH)[None, :]


@triton_jit
def _rotated_block(y_ptr, rows, first, h, m2, N, WIDE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """z = u H_64 for the 64 SwiGLU columns from `first` of the rows (f32 sums of exact products)."""
    u = tl.load(y_ptr + _offsets(rows, first, h.shape[0], N, WIDE), mask=m2, other=0.0)
    return tl.dot(u.to(DOT_DTYPE), h, input_precision="ieee", out_dtype=tl.float32)


@triton_jit
def _swiglu_rotate_kernel(q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, h_ptr, y_ptr, gmax_ptr, M, N, K,
                          HAS_BIAS: tl.constexpr, WIDE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr, PERSISTENT: tl.constexpr,
                          SUBTILE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # PERSISTENT: one program an SM walks the pairs p, p + programs, ... a tile at a time (the loop flattened: the
    # next tile's loads start during this epilogue), else a program a pair. SUBTILE: int8_linear's tiles carry it
    # (unused: this epilogue takes whole tiles).
    tiles_m = tl.cdiv(M, BLOCK_M)
    groups = N // (2 * BLOCK_N)
    a_desc = None
    b_desc = None
    if TMA:
        a_desc = tl.make_tensor_descriptor(q_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    pid, programs = tl.program_id(0), tl.num_programs(0)
    if PERSISTENT:
        for pair in tl.range(pid, tiles_m * groups, programs, flatten=True):
            for half in tl.static_range(2):
                _half_tile(pair, half, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, h_ptr, y_ptr, gmax_ptr, a_desc,
                           b_desc, M, N, K, tiles_m, groups, HAS_BIAS, WIDE, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                           TMA, DOT_DTYPE)
    else:
        for half in tl.static_range(2):
            _half_tile(pid, half, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, h_ptr, y_ptr, gmax_ptr, a_desc, b_desc, M,
                       N, K, tiles_m, groups, HAS_BIAS, WIDE, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, TMA, DOT_DTYPE)


_UNFIT: list = []  # the fixed Hopper tile, once it ran out of shared memory with this epilogue


def swiglu_quant_linear(q, s_x, w, s_w, bias=None, *, out=None, tiles=None):
    """(codes int8 [M, N / 2], scales f32 [M]): quantize_rows(int8_linear(q, s_x, w, s_w, bias, swiglu=True), 256)
    bit for bit, the rotation in the product's epilogue. out: optional (codes, scales) work buffers. tiles: None
    (Hopper's fixed SwiGLU tile, 256 columns wide; elsewhere, or ENABLED off, the two launches) or int8_linear's
    form with BLOCK_N = 256 (tests)."""
    (m, k), n = q.shape, w.shape[0]
    if n % (2 * GROUP) or w.shape[1] != k or q.dtype != torch.int8 or w.dtype != torch.int8:
        raise ValueError(f"swiglu_quant_linear: codes int8 [M, K] and interleaved gate and up rows int8 [N, K], N a "
                         f"multiple of {2 * GROUP}, got {tuple(q.shape)} {q.dtype} and {tuple(w.shape)} {w.dtype}")
    fixed = fixed_tiles(int8_linear.SWIGLU, q.device, k) if tiles is None and ENABLED and not _UNFIT else None
    tiles = tiles or fixed
    if tiles is None:  # the two launches
        hidden = int8_linear.int8_linear(q, s_x, w, s_w, bias, swiglu=True)
        return int8_quant.quantize_rows(hidden, GROUP, out=out)
    if tiles["BLOCK_N"] != GROUP:
        raise ValueError(f"swiglu_quant_linear: a tile holds half a rotation group: BLOCK_N {GROUP}, got "
                         f"{tiles['BLOCK_N']}")
    codes, scales = out if out is not None else (torch.empty(m, n // 2, dtype=torch.int8, device=q.device),
                                                  torch.empty(m, dtype=torch.float32, device=q.device))
    if (codes.shape, codes.dtype, scales.shape, scales.dtype) != ((m, n // 2), torch.int8, (m,), torch.float32):
        raise ValueError(f"swiglu_quant_linear: out must be (int8 [{m}, {n // 2}], f32 [{m}])")
    if m == 0:
        return codes, scales
    rotated = torch.empty(m, n // 2, dtype=torch.bfloat16, device=q.device)
    group_max = torch.empty(m, n // (2 * GROUP), dtype=torch.float32, device=q.device)
    tiles = {"TMA": False, "PERSISTENT": False, "SUBTILE": 0, **tiles}
    s_x, s_w = s_x.float().contiguous().reshape(-1), s_w.float().contiguous().reshape(-1)
    try:
        # A program a pair (one an SM when persistent): the grid of [m, n / 2] at tiles 256 wide counts the pairs.
        _swiglu_rotate_kernel[launch_grid(m, n // 2, q.device)](
            q.contiguous(), s_x, w.contiguous(), s_w, bias.contiguous() if bias is not None else s_x,
            hadamard_bf16(GROUP // 4, q.device), rotated, group_max, m, n, k, HAS_BIAS=bias is not None,
            WIDE=m * n // 2 >= 2**31,
            EVEN_K=k % tiles["BLOCK_K"] == 0, DOT_DTYPE=tl.bfloat16 if q.is_cuda else tl.float32, **tiles,
            enable_fp_fusion=False)
    except triton.runtime.errors.OutOfResources:
        if not fixed:
            raise
        _UNFIT.append(tiles)  # nothing ran: the two launches from now on
        return swiglu_quant_linear(q, s_x, w, s_w, bias, out=out)
    launch_codes(rotated, group_max, codes, scales)
    return codes, scales
