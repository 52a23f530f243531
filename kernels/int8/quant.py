"""Rows to INT8 ConvRot codes: modulated norm or gated activation, regular Hadamard rotation, row scales.

Issue 4; reference/int8_convrot_format.md sections 3-5 (Hadamard matrix, rotation, quantization numerics).
For rows x [M, K] (M any, K a multiple of the group g = 16, 64 or 256; 256 in ComfyUI's files), all arithmetic
in f32 unless a rounding is named:
1. u [M, K] bf16, the rotation input, rounded once (kernels/int8/prologue.py: plain rows, a modulated norm,
   SwiGLU, GELU, or an attention's output gate).
2. y = u @ H per group of g features (H the regular Hadamard H4^(x log4 g) / sqrt(g), entries
   +-1/sqrt(g), exact in bf16): each product exact, the g products summed in f32 (order unspecified).
3. yb = bf16(y): rotated rows rounded to bf16 (kitchen's CUDA quantizer; dit_core.linear.int8_product).
4. s = max(max_k |yb| / 127, 1e-30), f32, the division correctly rounded.
5. q = clamp(rint(bf16(yb / bf16(s))), -128, 127): the quotient correctly rounded in f32, then to bf16
   (torch's bf16 division), then to an integer, ties to even: ComfyUI's rounding, so -128 occurs.
Returns codes int8 [M, K] and scales f32 [M]; steps 3-5 are dit_core.weights.quantize_rows on the rows yb. Here:
row statistics (norms only, kernels/int8/row_stats.py; none when the caller has them), steps 1-3 storing the bf16
rotated rows and each (row, group)'s absmax, steps 4-5 over them (kernels/int8/codes.py). quantize_rows sends other
rows to their own kernels: plain hidden rows on Hopper to quant_hopper.py; many plain bf16 rows of up to 16 groups,
and rows holding factors of the rotation (`turned`), to quant_turned.py or quant_turned_hopper.py. The
pass is bound by its instruction issue, not by DRAM: its fused, chunked and twice-run forms were slower on the
H200.
"""
from __future__ import annotations

import torch

from . import quant_hopper, quant_turned
from ..choices import DEFAULT, Choices
from .hadamard import hadamard, hadamard_bf16, radix4_rounded
from .codes import launch_codes, reference as codes_reference
from .prologue import ACTS, checked_gate, rotated_block, rotation_input  # (rotation_input: the tests')
from .modulation_rows import shared_row
from ..rounding import round_to_bf16
from .row_stats import NORMS, row_stats
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None

# Plain bf16 rows from this many rows: quant_turned's one pass, whole rows a program (faster than these passes on
# the H200 at a 1024^2 image's rows, no better at a few hundred), where a row is at most this many groups: Krea 2's
# gated OUT rows, 24 groups held as 32, took 0.20 ms against the rotate pass's 0.11 on an H100 at 4608 rows
# (LTX-2.5's 16 groups 0.059 against 0.054, its 8 groups 0.029 against 0.035).
WHOLE_ROWS_MIN_M = 2048
WHOLE_ROWS_MAX_GROUPS = 16


def reference(x, group, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
              act=None, out=None, stats=None, row_starts=None, turned=None, gate=None, gate_factor=1.0):
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]); row_starts (quantize_rows' launch hint)
    changes nothing here. turned: plain rows x that hold the factors of the rotation a producer took
    (kernels/int8/quant_turned.py's TURNED: "v", an attention's output; "hidden", UP's SwiGLU output)."""
    if turned:
        q, s = quant_turned.reference(x, turned)
        return (q, s) if out is None else (out[0].copy_(q), out[1].copy_(s))
    u = rotation_input(x, norm=norm, norm_weight=norm_weight, eps=eps, scale=scale, shift=shift,
                       row_map=row_map, act=act, stats=stats, gate=gate, gate_factor=gate_factor)
    m, k = u.shape
    h = hadamard(group, torch.float32).to(u.device)
    yb = (u.float().reshape(m, k // group, group) @ h).reshape(m, k).to(torch.bfloat16)
    q, s = codes_reference(yb, yb.abs().reshape(m, k // group, group).amax(-1))
    return (q, s) if out is None else (out[0].copy_(q), out[1].copy_(s))


@triton_jit
def _rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr, shift_ptr, h, K, g_rows,
                  NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, SPLIT, DOT_DTYPE, GATE_SPAN, GATE_FACTOR):
    """Steps 2-3 for the group at column c0: its g rotated columns as SPLIT blocks of Q, rounded to bf16
    (held in f32). g <= 64: one product with H_g (SPLIT 1; the three other outputs repeat it). g = 256: each
    64-column block through H_64, then the radix-4 butterfly (kernels/int8/hadamard.py)."""
    z0 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr, shift_ptr, h, K,
                       g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE, GATE_SPAN,
                       GATE_FACTOR)
    if SPLIT == 4:
        z1 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + Q, mean, inv, w_ptr, scale_ptr, shift_ptr, h,
                           K, g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE, GATE_SPAN,
                           GATE_FACTOR)
        z2 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + 2 * Q, mean, inv, w_ptr, scale_ptr, shift_ptr,
                           h, K, g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE,
                           GATE_SPAN, GATE_FACTOR)
        z3 = rotated_block(x_ptr, stride_x, rows, rmask, rmap, c0 + 3 * Q, mean, inv, w_ptr, scale_ptr, shift_ptr,
                           h, K, g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, Q, DOT_DTYPE,
                           GATE_SPAN, GATE_FACTOR)
        y0, y1, y2, y3 = radix4_rounded(z0, z1, z2, z3)
    else:
        y0 = round_to_bf16(z0)
        y1, y2, y3 = y0, y0, y0
    return y0, y1, y2, y3


@triton_jit
def _store_rotated(y_ptr, rows, rmask, cols, y, K):
    """Step 3's bf16 rows for one block of rotated columns (y already holds bf16 values: the cast is exact)."""
    tl.store(y_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], y.to(tl.bfloat16), mask=rmask[:, None])


@triton_jit
def _rotate_kernel(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, h_ptr, stats_ptr, stride_stats, y_ptr,
                   gmax_ptr, g_ptr, stride_g, M, K, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                   HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, ACT: tl.constexpr, X_BF16: tl.constexpr,
                   G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   GATE_SPAN: tl.constexpr, GATE_FACTOR: tl.constexpr):
    # Grid (row programs, groups): a program takes a group of BLOCK_M rows at a time through steps 1-3 (row blocks
    # strided by the row programs: one each by default; fewer let Triton load the next under this one's products),
    # storing the bf16 rotated rows and each (row, group)'s absmax to gmax [M, K / G] (no atomics, nothing to
    # clear). The codes pass reads these rows back: recomputing the prologue there cost 3-6x the bandwidth floor.
    # Many small programs keep many loads in flight: a program per row block walking all groups ran 2-3x slower.
    Q: tl.constexpr = G // SPLIT
    hq = tl.arange(0, Q)
    h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
    c0 = tl.program_id(1) * G
    for block in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        g_rows = g_ptr + rows.to(tl.int64) * stride_g  # (GATE_SPAN 0: never read)
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        inv = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if NORM == 2:  # an RMS norm's mean is 0 (kernels/int8/row_stats.py): neither read nor subtracted
            mean = tl.load(stats_ptr + rows, mask=rmask, other=0.0)
        if NORM != 0:
            inv = tl.load(stats_ptr + stride_stats + rows, mask=rmask, other=1.0)
        if HAS_SCALE == 3:  # every run starts on a row block: the block's first row names its modulation row
            first = tl.load(map_ptr + block * BLOCK_M)
            y0, y1, y2, y3 = _rotate_group(x_ptr, stride_x, rows, rmask, rows, c0, mean, inv, w_ptr,
                                           scale_ptr + first * K, shift_ptr + first * K, h, K, g_rows, NORM,
                                           HAS_WEIGHT, 2, HAS_SHIFT, ACT, X_BF16, Q, SPLIT, DOT_DTYPE, 0, 1.0)
        elif HAS_SCALE == 1:
            # Rows in runs of one modulation row (packed sequences): a block within a run reads that row as
            # vectors (HAS_SCALE 2 at the row's address), else each value is gathered (kernels/int8/modulation_rows.py).
            rmap = tl.load(map_ptr + rows, mask=rmask, other=0)  # int32: half the registers of the gather's offsets
            shared = shared_row(rmap, rmask)
            if shared >= 0:
                y0, y1, y2, y3 = _rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr,
                                               scale_ptr + shared * K, shift_ptr + shared * K, h, K, g_rows, NORM,
                                               HAS_WEIGHT, 2, HAS_SHIFT, ACT, X_BF16, Q, SPLIT, DOT_DTYPE, 0, 1.0)
            else:
                y0, y1, y2, y3 = _rotate_group(x_ptr, stride_x, rows, rmask, rmap, c0, mean, inv, w_ptr, scale_ptr,
                                               shift_ptr, h, K, g_rows, NORM, HAS_WEIGHT, 1, HAS_SHIFT, ACT, X_BF16,
                                               Q, SPLIT, DOT_DTYPE, 0, 1.0)
        else:  # no row map to read: rows stand in for it (plain rows may be gated)
            y0, y1, y2, y3 = _rotate_group(x_ptr, stride_x, rows, rmask, rows, c0, mean, inv, w_ptr, scale_ptr,
                                           shift_ptr, h, K, g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT,
                                           X_BF16, Q, SPLIT, DOT_DTYPE, GATE_SPAN, GATE_FACTOR)
        _store_rotated(y_ptr, rows, rmask, c0 + hq, y0, K)
        if SPLIT == 4:
            _store_rotated(y_ptr, rows, rmask, c0 + Q + hq, y1, K)
            _store_rotated(y_ptr, rows, rmask, c0 + 2 * Q + hq, y2, K)
            _store_rotated(y_ptr, rows, rmask, c0 + 3 * Q + hq, y3, K)
        top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
        tl.store(gmax_ptr + rows * (K // G) + tl.program_id(1), tl.max(top, axis=1), mask=rmask)


def checked(x, group, norm, norm_weight, scale, row_map, act, out, stats, gate=None, turned=None):
    """quantize_rows' arguments checked (a ValueError naming what is wrong): (M, K, codes, scales: out's or new)."""
    if norm not in NORMS or act not in ACTS or (act is not None and (norm is not None or scale is not None)):
        raise ValueError(f"quantize_rows: norm must be one of {list(NORMS)} and act one of {list(ACTS)}, not both")
    if gate is not None and (norm is not None or act is not None or scale is not None or turned):
        raise ValueError("quantize_rows: a gate takes plain rows (no norm, modulation, activation or turn)")
    if norm_weight is not None and norm != "rms":
        raise ValueError("quantize_rows: norm_weight is the RMS norm's gain (the layer norm has no affine)")
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"quantize_rows: x must be rows [M, K], contiguous columns, got {tuple(x.shape)}")
    if group not in (16, 64, 256):
        raise ValueError(f"quantize_rows: ConvRot group must be 16, 64 or 256 (tl.dot tiles), got {group}")
    m, k = x.shape[0], x.shape[1] // 2 if act == "swiglu" else x.shape[1]
    if k % group or (act == "swiglu" and x.shape[1] % 2):
        raise ValueError(f"quantize_rows: ConvRot group {group} does not divide the {k} features of x")
    if scale is not None and (row_map is None or scale.dim() != 2 or scale.shape[1] != k or scale.numel() >= 2**30):
        raise ValueError("quantize_rows: modulation scale [R, K] (under 2^30 values: int32 offsets) needs row_map [M]")
    if stats is not None and (norm is None or stats.shape != (2, m) or stats.dtype != torch.float32
                              or stats.stride(1) != 1):
        raise ValueError(f"quantize_rows: stats must be a norm's row statistics, f32 [2, {m}] with contiguous rows")
    codes, scales = out if out is not None else (torch.empty(m, k, dtype=torch.int8, device=x.device),
                                                  torch.empty(m, dtype=torch.float32, device=x.device))
    if (codes.shape, codes.dtype, scales.shape, scales.dtype) != ((m, k), torch.int8, (m,), torch.float32):
        raise ValueError(f"quantize_rows: out must be (int8 [{m}, {k}], f32 [{m}])")
    if gate is not None:
        checked_gate(gate, m, k, "quantize_rows")
    return m, k, codes, scales


def quantize_rows(x, group, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
                  act=None, out=None, stats=None, row_starts=None, turned=None, gate=None, gate_factor=1.0,
                  block_m=64, num_warps=4, num_stages=None, row_programs=None, choices: Choices = DEFAULT):
    """Rows x [M, K] (x [M, 2K] for swiglu), bf16/f16/f32, to (codes int8 [M, K], scales f32 [M]) by this file's
    math. out: (codes, scales) work buffers, written fully. stats: the norm's row statistics [2, M] f32 (mean,
    1/sqrt(.)) from the kernel that wrote x (gated_residual's next_rms): no statistics launch. row_starts:
    Sequence.starts; where each starts a row block, each block reads its modulation row as vectors (no gather).
    Launch: block_m, num_warps, num_stages, row_programs (programs along the rows, each walking row blocks; 0: one a
    row block); None: the H200 sweep's best. turned: plain rows holding factors of the rotation (quant_turned.TURNED:
    "v" from qkv_rope_linear's turn_v, "hidden" from linear's turn_hidden), by quant_turned's passes where they
    take them, else the passes below with the rest of the rotation. gate: plain rows times gate_factor *
    sigmoid(gate) (gate rows [M, n], each value over K / n features: kernels/int8/prologue.py), in the prologue of
    quant_turned's one pass or of the rotate pass. choices: hopper_quant, hopper_turned_quant, whole_rows,
    whole_rows_walking and codes_last_first (kernels/choices.py)."""
    m, k, codes, scales = checked(x, group, norm, norm_weight, scale, row_map, act, out, stats, gate, turned)
    if turned:
        if norm is not None or act is not None or group != quant_turned.GROUP or turned not in quant_turned.TURNED:
            raise ValueError(f"quantize_rows: turned rows are plain, in ConvRot groups of {quant_turned.GROUP}, "
                             f"turned as one of {list(quant_turned.TURNED)}; got groups of {group}, {turned!r}")
        x = x.to(torch.bfloat16).contiguous()
        if quant_turned.launched(x, group, turned, codes, scales, hopper=choices.hopper_turned_quant):
            return codes, scales
    if m == 0:
        return codes, scales
    plain = norm is None and act is None
    one_pass = plain and not turned and gate is None and choices.hopper_quant and quant_hopper.chosen(m, k)
    if one_pass and quant_hopper.unusable(x, group) is None and quant_hopper.launch(x, codes, scales):
        return codes, scales
    whole_rows = (plain and not turned and choices.whole_rows and m >= WHOLE_ROWS_MIN_M
                  and k <= WHOLE_ROWS_MAX_GROUPS * group)
    if whole_rows and x.dtype == torch.bfloat16 and x.is_contiguous() and quant_turned.fits(k, group):
        return quant_turned.quantize_turned(x, turned=None, out=(codes, scales), hopper=choices.hopper_turned_quant,
                                            gate=gate, gate_factor=gate_factor, row_programs=choices.whole_rows_walking)
    split, groups = (4 if group == 256 else 1), k // group
    aligned = row_starts is not None and all(first % block_m == 0 for first in row_starts)
    # (gated rows: 2 stages; 3 stage their gate's tiles too, past a consumer card's 99 KB of shared memory)
    num_stages = num_stages or 2 + (plain and gate is None)
    row_programs = 16 * plain if row_programs is None else row_programs
    if stats is None:  # mean, 1/sqrt(.): norms only
        stats = torch.empty(2, m, dtype=torch.float32, device=x.device)
        if norm is not None:
            row_stats(x, norm, eps, out=stats)
    rotated = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)  # step 3's rows, read by the codes pass
    group_max = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    row_map = row_map.to(torch.int32).contiguous() if row_map is not None else None
    # Contiguous f32, or stats standing in for a pointer the kernel never reads (its constexpr flag off).
    vectors = [stats if t is None else t.float().contiguous() for t in (norm_weight, scale, shift)]
    flags = {"NORM": NORMS[norm], "HAS_WEIGHT": norm_weight is not None,  # HAS_SCALE 2: one modulation row
             "HAS_SCALE": 0 if scale is None else 2 if scale.shape[0] == 1 else 3 if aligned else 1,
             "HAS_SHIFT": shift is not None and scale is not None, "ACT": ACTS[act],
             "X_BF16": x.dtype == torch.bfloat16, "G": group, "SPLIT": split, "BLOCK_M": block_m,
             "GATE_SPAN": 0 if gate is None else k // gate.shape[1], "GATE_FACTOR": float(gate_factor),
             # bf16 for the matrix cores; f32 on the CPU, whose interpreter multiplies bf16 as 16-bit ints (triton 3.9)
             "DOT_DTYPE": tl.bfloat16 if x.is_cuda else tl.float32, "num_warps": num_warps, "num_stages": num_stages,
             "enable_fp_fusion": False}
    h = quant_turned.rest_operand(turned, 64, x.device) if turned else \
        hadamard_bf16(group // split, x.device, halved=split == 4)
    gate_stride = 0 if gate is None else gate.stride(0)  # (not stats' stride, which follows the rows)
    row_map, gate = (stats if t is None else t for t in (row_map, gate))  # stats: a pointer never read
    _rotate_kernel[(min(row_programs or m, triton.cdiv(m, block_m)), groups)](
        x, x.stride(0), *vectors, row_map, h, stats, stats.stride(0), rotated, group_max, gate, gate_stride, m, k,
        **flags)
    launch_codes(rotated, group_max, codes, scales, choices.codes_last_first)
    return codes, scales
