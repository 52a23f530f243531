"""INT8 x INT8 -> INT32 products on the matrix cores, with a dequantizing, GELU, SwiGLU or gated-residual epilogue.

Issue 4; reference/int8_convrot_format.md section 6 (the forward formula). Codes q [M, K] int8 with row scales
s_x [M] f32 (from kernels/int8/quant.py), weight codes w [N, K] int8 with row scales s_w [N] f32, bias [N]
(any float dtype):
  acc[m, n] = sum_k q[m, k] w[n, k]                        exact, int32
  y[m, n]   = float(acc) * (s_x[m] * s_w[n]) + bias[n]    f32, each operation rounded (no fused multiply-add)
            (+ lora[m, n] = (lora_down [M, r] @ lora_up [N, r]^T)[m, n]: bf16 operands, f32 sums)
  int8_linear:       out[m, n] = bf16(y[m, n])                                        (one rounding)
    gelu_tanh=True:  out[m, n] = bf16(u / (1 + exp(-2c (u + 0.044715 u^3)))), u = bf16(y[m, n]), c = sqrt(2/pi)
                     (the MLP's GELU, as int8_quant's gelu_tanh)
      turn_hidden:   its f32 values turned along each 64 columns' digit d2 before the rounding (quant_turned's TURNED
                     "v": the digit a thread's accumulator registers hold, the codes pass doing d1 and d0)
    swiglu=True:     out[m, j] = bf16(silu(g) u), g = bf16(y[m, 2j]), u = bf16(y[m, 2j + 1]), silu(a) = a / (1 +
                     exp(-a)) (N / 2 columns: the MLP's interleaved gate and up rows, as int8_quant's swiglu)
    turn_hidden:     out = bf16(turned_f32(silu(g) u)): each 64 columns turned along digits d2 and d1 in f32
                     (kernels/int8/quant_turned.py: two factors of DOWN's rotation, in the epilogue's registers on
                     Hopper; the codes pass then does the rest, no matrix product)
  int8_linear_gated: residual[m, n] = residual[m, n] + gate[row_map[m], n] * y[m, n]  (f32, in place)
    addend:          y[m, n] + addend[m, n] in place of y (bf16 [M, N]: a parallel block's other branch)
The scale product first, then the bias in f32, is dit_core.linear (int8_product, then + bias), our host
reference; kitchen's CUTLASS epilogue (acc * s_x * s_w + bias) differs from it by an f32 ulp before the bf16
rounding. The gated form is the block's `x + gate * linear(h)`: the linear's output is never stored. The SwiGLU form
writes half the bytes (measured slower on the H200: it rotating its rows for DOWN too, and bf16 rows stored by TMA).
On Hopper the calls without a LoRA go to kernels/int8/linear_hopper.py (the same math bit for bit, 1.2-1.5x faster:
warp-specialized); this kernel runs everything else.
"""
from __future__ import annotations

import functools
import logging
import math

import torch

from . import linear_hopper
from ..choices import DEFAULT, Choices
from .products import exact_products, halves, linear_epilogue, products, tile_of
from .quant_turned import TURNED, turned_f32
from .tiles import (BF16, GATED, SWIGLU, candidate_tiles, fixed_tiles, launch_grid, sm_count, tma_where_it_can,
                         tune_bucket)
from .modulation_rows import shared_row
from .row_stats import reference as stats_reference
from .row_stats import row_stats, stats_of_parts
from .arrival_counters import counter_reset
from .split_tail import item_of, others_added, parts_stored, tail_split
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def reference(q, s_x, w, s_w, bias=None, *, lora_down=None, lora_up=None, residual=None, gate=None,
              row_map=None, out=None, swiglu=False, addend=None, next_norm=None, turn_hidden=False, gelu_tanh=False):
    """The math above in plain torch (exact_products). With residual: the gated form (residual updated in place and
    returned; next_norm's stats filled); otherwise bf16 [M, N], with swiglu [M, N / 2] (into out when given)."""
    y = exact_products(q, w).float() * (s_x.float().reshape(-1, 1) * s_w.float().reshape(1, -1))
    if bias is not None:
        y = y + bias.float()
    if lora_down is not None:
        y = y + lora_down.float() @ lora_up.float().t()
    if residual is not None:
        residual.add_(gate.float()[row_map.long()] * (y if addend is None else y + addend.float()))
        if next_norm is not None:
            next_norm[0].copy_(stats_reference(residual, *next_norm[1:]))
        return residual
    if swiglu:
        g, u = y.to(torch.bfloat16).float()[:, 0::2], y.to(torch.bfloat16).float()[:, 1::2]
        y = g / (1 + torch.exp(-g)) * u
        y = turned_f32(y) if turn_hidden else y
    elif gelu_tanh:
        u = y.to(torch.bfloat16).float()
        y = u / (1 + torch.exp(-(2 * math.sqrt(2 / math.pi) * (u + 0.044715 * u * u * u))))
        y = turned_f32(y, TURNED["v"]) if turn_hidden else y
    return y.to(torch.bfloat16) if out is None else out.copy_(y)


@triton_jit
def _int8_linear_kernel(q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr, gate_ptr, map_ptr,
                        add_ptr, M, N, K, R, M_TUNE, sums_ptr, count_ptr, whole, parts, HAS_BIAS: tl.constexpr,
                        HAS_LORA: tl.constexpr, FORM: tl.constexpr, ONE_GATE_ROW: tl.constexpr,
                        HAS_ADDEND: tl.constexpr, WIDE: tl.constexpr, EVEN_K: tl.constexpr, LORA_DTYPE: tl.constexpr,
                        TURN: tl.constexpr, GELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
                        PERSISTENT: tl.constexpr, SUBTILE: tl.constexpr, SPLIT: tl.constexpr):
    # TMA: tiles loaded by descriptors (Hopper), else by pointers. PERSISTENT: one program per SM walks the work
    # items (the loop flattened: the next tile's loads start during this epilogue), else one an item; Triton's warp-
    # specialized loop was no faster on the H200. SUBTILE (0, 2, 4): the epilogue takes the
    # columns in that many parts, needing less shared memory (a gated 128 x 256 tile) and fewer registers (spills).
    # SPLIT: the tail launch, program i the part i % parts of tile whole + i // parts (kernels/int8/split_tail.py), else
    # the tiles [0, whole) whole.
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    a_desc = None
    b_desc = None
    if TMA:
        a_desc = tl.make_tensor_descriptor(q_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    if not PERSISTENT:
        _tile(tl.program_id(0), q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr, gate_ptr,
              map_ptr, add_ptr, sums_ptr, count_ptr, a_desc, b_desc, M, N, K, R, tiles_m, tiles_n, whole, parts,
              HAS_BIAS, HAS_LORA, FORM, ONE_GATE_ROW, HAS_ADDEND, WIDE, EVEN_K, LORA_DTYPE, TURN, GELU, BLOCK_M,
              BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, TMA, SUBTILE, SPLIT)
    else:
        for tile in tl.range(tl.program_id(0), tl.minimum(whole, tiles_m * tiles_n), tl.num_programs(0),
                             flatten=True):
            _tile(tile, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr, gate_ptr, map_ptr,
                  add_ptr, sums_ptr, count_ptr, a_desc, b_desc, M, N, K, R, tiles_m, tiles_n, whole, parts,
                  HAS_BIAS, HAS_LORA, FORM, ONE_GATE_ROW, HAS_ADDEND, WIDE, EVEN_K, LORA_DTYPE, TURN, GELU, BLOCK_M,
                  BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, TMA, SUBTILE, SPLIT)


@triton_jit
def _tile(item, q_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr, gate_ptr, map_ptr, add_ptr,
          sums_ptr, count_ptr, a_desc, b_desc, M, N, K, R, tiles_m, tiles_n, whole, parts, HAS_BIAS: tl.constexpr,
          HAS_LORA: tl.constexpr, FORM: tl.constexpr, ONE_GATE_ROW: tl.constexpr, HAS_ADDEND: tl.constexpr,
          WIDE: tl.constexpr, EVEN_K: tl.constexpr, LORA_DTYPE: tl.constexpr, TURN: tl.constexpr, GELU: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
          GROUP_M: tl.constexpr, TMA: tl.constexpr, SUBTILE: tl.constexpr, SPLIT: tl.constexpr):
    """An output tile's products, then the epilogue (on SUBTILE parts of the columns in turn); with SPLIT, program
    `item`'s part of a tail tile, the epilogue run by the part that is counted last."""
    if SPLIT:
        tile, tail, part, k_lo, k_hi = item_of(item, whole, parts, tl.cdiv(K, BLOCK_K), BLOCK_K)
    else:
        tile, tail, part, k_lo, k_hi = item, 0, 0, 0, K
    pid_m, pid_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
    shared = -1  # the gate row all the tile's rows take, or -1; asked before the products, which hide the load
    if FORM == 1 and not ONE_GATE_ROW:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        shared = shared_row(tl.load(map_ptr + rm, mask=rm < M, other=0).to(tl.int64), rm < M)
    acc = products(q_ptr, w_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, k_lo, k_hi, TMA, EVEN_K, BLOCK_M, BLOCK_N,
                    BLOCK_K)
    if SUBTILE:  # the epilogue's column parts (and a split tile's stored sums: fewer pointers live at a time)
        subtiles = halves(acc, BLOCK_M, BLOCK_N)
        if SUBTILE == 4:
            subtiles = halves(subtiles[0], BLOCK_M, BLOCK_N // 2) + halves(subtiles[1], BLOCK_M, BLOCK_N // 2)
    else:
        subtiles = (acc,)
    count: tl.constexpr = SUBTILE if SUBTILE else 1
    last = True  # a whole tile; a part: whether it is counted last
    if SPLIT:
        last = parts_stored(subtiles, sums_ptr, count_ptr, tail, part, parts, BLOCK_M, BLOCK_N)
    if last:
        for i in tl.static_range(count):
            subtile = subtiles[i]
            if SPLIT:
                subtile = others_added(subtile, i, count, sums_ptr, tail, part, parts, BLOCK_M, BLOCK_N)
            linear_epilogue(subtile, pid_m, count * pid_n + i, sx_ptr, sw_ptr, bias_ptr, down_ptr, up_ptr, out_ptr,
                      gate_ptr, map_ptr, add_ptr, shared, M, N, R, HAS_BIAS, HAS_LORA, FORM, ONE_GATE_ROW, HAS_ADDEND,
                      WIDE, LORA_DTYPE, TURN, GELU, BLOCK_M, BLOCK_N // count, BLOCK_R)
        if SPLIT:
            counter_reset(count_ptr, tail)


_UNFIT: set[int] = set()  # forms whose fixed tiles ran out of shared memory here: autotuned instead
log = logging.getLogger(__name__)


@functools.cache
def _autotuned(form: int):
    """The kernel autotuned over candidate_tiles, keyed on (N, K) and M's bucket (M_TUNE: a new image size within
    the bucket tunes nothing again); the gated form restores the residual between trials. Where the tiles are not
    fixed (GPUs other than Hopper)."""
    # cache_results: the timings persist in Triton's cache, so a ComfyUI restart does not tune again.
    return triton.autotune(candidate_tiles(form == GATED), key=["M_TUNE", "N", "K"],
                           restore_value=["out_ptr"] if form == GATED else None,
                           prune_configs_by={"early_config_prune": tma_where_it_can}, cache_results=True)(
        _int8_linear_kernel)


def _launch(q, s_x, w, s_w, bias, lora_down, lora_up, out, gate, row_map, tiles, form, addend=None, parts=None,
            turn=False, gelu=False, choices: Choices = DEFAULT):
    """tiles: None (fixed_tiles', else autotuned) or {BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages[,
    TMA, PERSISTENT, SUBTILE] (off when left out)} (tests, tuning). True where the Hopper kernel ran (it fills
    parts, the updated rows' norm parts, when given). turn: SWIGLU's or GELU's rows turned (int8_linear's
    turn_hidden); gelu: BF16's rows through GELU (int8_linear's gelu_tanh). choices: hopper_gemm, group_m and
    split_tail (kernels/choices.py)."""
    (m, k), n = q.shape, w.shape[0]
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != k:
        raise ValueError(f"int8_linear: codes must be int8 [M, K] and [N, K], got {tuple(q.shape)} "
                         f"{q.dtype} and {tuple(w.shape)} {w.dtype}")
    if s_x.numel() != m or s_w.numel() != n:
        raise ValueError(f"int8_linear: scales must be one a row ({m} and {n}), got {s_x.numel()}, {s_w.numel()}")
    if (lora_down is None) != (lora_up is None) or (
            lora_down is not None and (lora_down.shape[0] != m or lora_up.shape[0] != n
                                       or lora_down.shape[1] != lora_up.shape[1])):
        raise ValueError("int8_linear: a LoRA needs lora_down [M, r] and lora_up [N, r] together")
    if m == 0:
        return
    if tiles is None and lora_down is None and choices.hopper_gemm and linear_hopper.unusable(
            q, out, out.shape[1] * out.element_size()) is None and linear_hopper.launch(
            q, s_x, w, s_w, bias, out, form, gate=gate, row_map=row_map, addend=addend, parts=parts, turn=turn,
            gelu=gelu, group_m=choices.group_m):
        return True
    rank = lora_down.shape[1] if lora_down is not None else 0
    fixed = tiles is None and form not in _UNFIT and fixed_tiles(form, q.device, k)
    tiles = tiles or fixed or None
    absent = s_x  # pointer arguments the kernel never reads (their constexpr flag is off)
    args = (q.contiguous(), s_x.float().contiguous().reshape(-1), w.contiguous(),
            s_w.float().contiguous().reshape(-1), bias.contiguous() if bias is not None else absent,
            lora_down.contiguous() if lora_down is not None else absent,
            lora_up.contiguous() if lora_up is not None else absent, out,
            gate.float().contiguous() if gate is not None else absent,
            row_map.to(torch.int32).contiguous() if row_map is not None else absent,
            addend if addend is not None else absent, m, n, k, rank, tune_bucket(m))
    flags = {"HAS_BIAS": bias is not None, "HAS_LORA": lora_down is not None, "FORM": form,
             "ONE_GATE_ROW": gate is not None and gate.shape[0] == 1, "HAS_ADDEND": addend is not None,
             "WIDE": m * n >= 2**31,
             "EVEN_K": k % (tiles["BLOCK_K"] if tiles else 128) == 0,  # the tuned BLOCK_K are 64 and 128
             "LORA_DTYPE": tl.bfloat16 if q.is_cuda else tl.float32, "TURN": turn, "GELU": gelu,
             "BLOCK_R": max(16, triton.next_power_of_2(max(rank, 1)))}
    # enable_fp_fusion=False: the epilogue's multiply-then-add must round twice, as the reference's does.
    def autotuned():  # every tile whole
        _autotuned(form)[launch_grid(m, n, q.device)](*args, absent, absent, 2**30, 1, **flags, SPLIT=False,
                                                      enable_fp_fusion=False)
    if tiles is None:
        return autotuned()
    tiles = {"TMA": False, "PERSISTENT": False, "SUBTILE": 0, **tiles}
    whole_columns = 128 if form == SWIGLU else 64  # (SwiGLU: 64 rows' pairs)
    if turn and (tiles["BLOCK_N"] // max(tiles["SUBTILE"], 1)) % whole_columns:
        raise ValueError(f"int8_linear: turned rows need an epilogue of whole {whole_columns} columns, got BLOCK_N "
                         f"{tiles['BLOCK_N']} in {max(tiles['SUBTILE'], 1)} parts")
    wave = tiles.pop("WAVE", sm_count(q.device) if fixed else 0)  # tests set it; tiles of their own: no split
    sums, counts, whole, parts, tail_programs = tail_split(m, n, k, tiles, wave, absent, choices.split_tail)
    try:
        _int8_linear_kernel[launch_grid(m, n, q.device, whole)](*args, absent, absent, whole, 1, **flags, **tiles,
                                                                 SPLIT=False, enable_fp_fusion=False)
    except triton.runtime.errors.OutOfResources:
        if not fixed:
            raise
        # A fixed tile that does not fit (another driver or Triton): nothing ran, so this form autotunes from now on.
        log.warning("int8_linear: the fixed %s tile does not fit this GPU's shared memory; autotuning", tiles)
        _UNFIT.add(form)
        return autotuned()
    if parts > 1:  # the tail launch, a program a part; at the Hopper tile its sums stored in quarters (no spills)
        subtile = 4 if fixed else tiles["SUBTILE"]
        while turn and subtile and tiles["BLOCK_N"] // subtile % whole_columns:  # (turned: whole columns a part)
            subtile //= 2
        tail_tiles = {**tiles, "PERSISTENT": False, "SUBTILE": subtile if subtile > 1 else 0}
        _int8_linear_kernel[(tail_programs,)](*args, sums, counts, whole, parts, **flags, **tail_tiles, SPLIT=True,
                                              enable_fp_fusion=False)


def int8_linear(q, s_x, w, s_w, bias=None, *, lora_down=None, lora_up=None, out=None, tiles=None, swiglu=False,
                turn_hidden=False, gelu_tanh=False, choices: Choices = DEFAULT):
    """bf16 [M, N] = (q wᵀ) * s_x[m] * s_w[n] + bias[n] (+ LoRA) by the math in this file's docstring; with swiglu,
    SiLU(gate) up of its interleaved column pairs, bf16 [M, N / 2]; with gelu_tanh, GELU of the rows; turn_hidden:
    those rows turned before their bf16 rounding (the math's turn_hidden). choices: which kernels run
    (kernels/choices.py)."""
    m, n = q.shape[0], w.shape[0] // 2 if swiglu else w.shape[0]
    if swiglu and (w.shape[0] % 2 or gelu_tanh):
        raise ValueError(f"int8_linear: swiglu takes interleaved gate and up rows, an even count, and no GELU; got "
                         f"{w.shape[0]} rows, gelu_tanh={gelu_tanh}")
    if turn_hidden and (not (swiglu or gelu_tanh) or n % 64):
        raise ValueError(f"int8_linear: turn_hidden turns SwiGLU's or GELU's rows by blocks of 64 columns, got {n} "
                         f"columns")
    out = torch.empty(m, n, dtype=torch.bfloat16, device=q.device) if out is None else out
    if out.shape != (m, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"int8_linear: out must be contiguous bf16 [{m}, {n}]")
    _launch(q, s_x, w, s_w, bias, lora_down, lora_up, out, None, None, tiles, SWIGLU if swiglu else BF16,
            turn=turn_hidden, gelu=gelu_tanh, choices=choices)
    return out


def int8_linear_gated(q, s_x, w, s_w, bias=None, *, residual, gate, row_map, lora_down=None, lora_up=None,
                      tiles=None, addend=None, next_norm=None, choices: Choices = DEFAULT):
    """residual (f32 [M, N], in place) += gate[row_map[m]] * ((q wᵀ) * s_x[m] * s_w[n] + bias[n] (+ LoRA) (+
    addend[m, n], bf16 [M, N])). next_norm: (stats [2, M] f32, "rms" or "layer", eps) filled with that norm's
    statistics of the updated rows (kernels/int8/row_stats.py): from the Hopper epilogue's parts, else a pass after.
    choices: which kernels run (kernels/choices.py)."""
    m, n = q.shape[0], w.shape[0]
    if residual.shape != (m, n) or residual.dtype != torch.float32 or not residual.is_contiguous():
        raise ValueError(f"int8_linear_gated: residual must be contiguous f32 [{m}, {n}]")
    if gate.dim() != 2 or gate.shape[1] != n or row_map.shape != (m,) or gate.numel() >= 2**31:
        raise ValueError(f"int8_linear_gated: gate must be [R, {n}] (under 2^31 values) and row_map [{m}]")
    if addend is not None and (addend.shape != (m, n) or addend.dtype != torch.bfloat16 or not addend.is_contiguous()):
        raise ValueError(f"int8_linear_gated: addend must be contiguous bf16 [{m}, {n}]")
    width = linear_hopper.PART_COLUMNS
    parts = torch.empty(2, n // width, m, device=q.device) if next_norm is not None and n % width == 0 else None
    if _launch(q, s_x, w, s_w, bias, lora_down, lora_up, residual, gate, row_map, tiles, GATED, addend, parts,
               choices=choices) and \
            parts is not None:
        stats_of_parts(parts, *next_norm[1:], out=next_norm[0], width=width)
    elif next_norm is not None:
        row_stats(residual, *next_norm[1:], out=next_norm[0])
    return residual
