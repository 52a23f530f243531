"""Rows to INT8 ConvRot codes: modulated norm or gated activation, regular Hadamard rotation, row scales.

Issue 4; reference/int8_convrot_format.md sections 3-5. For rows x [M, K] (M any, K a multiple of the group
g = 16, 64 or 256; 256 in ComfyUI's files), all arithmetic in f32 unless a rounding is named:
1. The rotation input u [M, K], rounded once to bf16, because the BF16 block feeds its linears bf16 rows:
   plain        u = bf16(x)
   norm "rms"   n = (x * 1/sqrt(mean(x^2) + eps)) * norm_weight   (the gain optional)
   norm "layer" n = (x - mean(x)) * 1/sqrt(mean((x - mean(x))^2) + eps)   (no affine)
                then, with modulation rows scale/shift [R, K] and row_map [M] (shift optional):
                u = bf16(n * (1 + scale[row_map[m]]) + shift[row_map[m]]); without scale u = bf16(n)
   "swiglu"     x [M, 2K] interleaved (gate j at column 2j, up j at 2j + 1, gluRows):
                u = bf16(silu(gate) * up), silu(a) = a / (1 + exp(-a))
   "gelu_tanh"  u = bf16(x * sigmoid(2c (x + 0.044715 x^3))), c = sqrt(2/pi)  (= 0.5 x (1 + tanh(...)))
2. y = u @ H per group of g features (H the regular Hadamard H4^(x log4 g) / sqrt(g), entries
   +-1/sqrt(g), exact in bf16): each product exact, the g products summed in f32 (order unspecified).
3. yb = bf16(y): rotated rows rounded to bf16 (kitchen's CUDA quantizer; dit_core.linear.int8_product).
4. s = max(max_k |yb| / 127, 1e-30), f32, the division correctly rounded.
5. q = clamp(rint(bf16(yb / bf16(s))), -128, 127): the quotient correctly rounded in f32, then to bf16
   (torch's bf16 division), then to an integer, ties to even: ComfyUI's rounding, so -128 occurs.
Returns codes int8 [M, K] and scales f32 [M]; steps 3-5 are dit_core.weights.quantize_rows on the rows yb. Row
statistics first (norms only, kernels/row_stats.py; none when the caller has them), then one launch where its
programs may wait for each other: a program a (row block, group) rotates its group in registers (kernels/
int8_rotate.py), stores the group's absmax, waits for the row block's other groups, and writes its codes; the bf16
rotated rows never leave the SM. Elsewhere two launches: steps 1-3 storing the bf16 rotated rows and the maxima,
then steps 4-5 over them (kernels/int8_codes.py); both give the same codes bit for bit. (Measured slower on the
H200, docs/benchmarks.md: a one-pass kernel, whole rows in registers, 1.2-2x; the codes written by the rotate
pass's program finishing a row block's last group, 2x a Z-Image step: those programs come last in the launch and
each writes 64 x K codes alone.)
"""
from __future__ import annotations

import torch

from .arrival_counters import kept, leave, ticket, wait_for_peers
from .int8_codes import codes_of, group_maxima, launch_codes, row_scales
from .int8_codes import reference as codes_reference
from .int8_rotate import ACTS, group_absmax, hadamard, hadamard_bf16, rotate_kernel, rotated_rows, rotation_input
from .row_stats import NORMS, row_stats

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

__all__ = ["ACTS", "hadamard", "quantize_rows", "reference", "rotation_input"]
# Steps 1-5 in one launch where its programs may wait for each other (_quantize_kernel), else two (the benches time
# both: bench/step_variants.py).
ONE_LAUNCH = True


def reference(x, group, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
              act=None, out=None, stats=None):
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M])."""
    u = rotation_input(x, norm=norm, norm_weight=norm_weight, eps=eps, scale=scale, shift=shift,
                       row_map=row_map, act=act, stats=stats)
    m, k = u.shape
    h = hadamard(group, torch.float32).to(u.device)
    yb = (u.float().reshape(m, k // group, group) @ h).reshape(m, k).to(torch.bfloat16)
    q, s = codes_reference(yb, yb.abs().reshape(m, k // group, group).amax(-1))
    return (q, s) if out is None else (out[0].copy_(q), out[1].copy_(s))


@triton_jit
def _quantize_kernel(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, h_ptr, stats_ptr, stride_stats, q_ptr,
                     s_ptr, gmax_ptr, count_ptr, M, K, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, ACT: tl.constexpr, X_BF16: tl.constexpr,
                     G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr,
                     GROUPS_P2: tl.constexpr, PHASE: tl.constexpr):
    # One launch (PHASE 0), a program a (row block, group) in ticket order, groups fastest: steps 1-3 in registers,
    # the group's absmax stored, a wait for the row block's other groups (kernels/arrival_counters.py), then steps
    # 4-5 from the registers: the bf16 rotated rows never leave the SM. Triton's CPU interpreter runs programs one
    # after another, where a wait never ends: there the same programs run twice, storing the maxima (PHASE 1), then
    # rotating again and storing the codes (PHASE 2).
    Q: tl.constexpr = G // SPLIT
    GROUPS = K // G
    hq = tl.arange(0, Q)
    h = tl.load(h_ptr + hq[:, None] * Q + hq[None, :]).to(DOT_DTYPE)
    if PHASE == 0:
        item = ticket(count_ptr, tl.num_programs(0))
    else:
        item = tl.program_id(0)
    block, group = item // GROUPS, item % GROUPS
    c0 = group * G
    rows, rmask, y0, y1, y2, y3 = rotated_rows(x_ptr, stride_x, w_ptr, scale_ptr, shift_ptr, map_ptr, stats_ptr,
                                               stride_stats, h, block, c0, M, K, NORM, HAS_WEIGHT, HAS_SCALE,
                                               HAS_SHIFT, ACT, X_BF16, SPLIT, BLOCK_M, DOT_DTYPE)
    if PHASE != 2:
        tl.store(gmax_ptr + rows * GROUPS + group, group_absmax(y0, y1, y2, y3), mask=rmask)
    if PHASE == 0:
        wait_for_peers(count_ptr, 1 + block, GROUPS)
    if PHASE != 1:
        s, r = row_scales(group_maxima(gmax_ptr, rows, rmask, GROUPS, GROUPS_P2))
        if group == 0:
            tl.store(s_ptr + rows, s, mask=rmask)
        base = q_ptr + rows[:, None].to(tl.int64) * K + c0 + hq[None, :]
        tl.store(base, codes_of(y0, r), mask=rmask[:, None])
        if SPLIT == 4:
            tl.store(base + Q, codes_of(y1, r), mask=rmask[:, None])
            tl.store(base + 2 * Q, codes_of(y2, r), mask=rmask[:, None])
            tl.store(base + 3 * Q, codes_of(y3, r), mask=rmask[:, None])
    if PHASE == 0:
        leave(count_ptr, 1 + block, GROUPS)


def checked(x, group, norm, norm_weight, scale, row_map, act, out, stats, name="quantize_rows"):
    """quantize_rows' arguments checked (a ValueError naming what is wrong): (M, K, codes, scales: out's or new)."""
    if norm not in NORMS or act not in ACTS or (act is not None and (norm is not None or scale is not None)):
        raise ValueError(f"{name}: norm must be one of {list(NORMS)} and act one of {list(ACTS)}, not both")
    if norm_weight is not None and norm != "rms":
        raise ValueError(f"{name}: norm_weight is the RMS norm's gain (the layer norm has no affine)")
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"{name}: x must be rows [M, K], contiguous columns, got {tuple(x.shape)}")
    if group not in (16, 64, 256):
        raise ValueError(f"{name}: ConvRot group must be 16, 64 or 256 (tl.dot tiles), got {group}")
    m, k = x.shape[0], x.shape[1] // 2 if act == "swiglu" else x.shape[1]
    if k % group or (act == "swiglu" and x.shape[1] % 2):
        raise ValueError(f"{name}: ConvRot group {group} does not divide the {k} features of x")
    if scale is not None and (row_map is None or scale.dim() != 2 or scale.shape[1] != k or scale.numel() >= 2**30):
        raise ValueError(f"{name}: modulation scale [R, K] (under 2^30 values: int32 offsets) needs row_map [M]")
    if stats is not None and (norm is None or stats.shape != (2, m) or stats.dtype != torch.float32
                              or stats.stride(1) != 1):
        raise ValueError(f"{name}: stats must be a norm's row statistics, f32 [2, {m}] with contiguous rows")
    codes, scales = out if out is not None else (torch.empty(m, k, dtype=torch.int8, device=x.device),
                                                  torch.empty(m, dtype=torch.float32, device=x.device))
    if (codes.shape, codes.dtype, scales.shape, scales.dtype) != ((m, k), torch.int8, (m,), torch.float32):
        raise ValueError(f"{name}: out must be (int8 [{m}, {k}], f32 [{m}])")
    return m, k, codes, scales


def quantize_rows(x, group, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
                  act=None, out=None, stats=None, one_launch=None, block_m=64, num_warps=4, num_stages=None,
                  row_programs=None):
    """Rows x [M, K] (x [M, 2K] for swiglu), bf16/f16/f32, to (codes int8 [M, K], scales f32 [M]) by this file's
    math. out: optional (codes, scales) work buffers, written fully. stats: the norm's row statistics [2, M] f32
    (mean, 1/sqrt(.)) when the kernel that wrote x computed them (gated_residual's next_rms): no statistics launch
    then. one_launch (None: ONE_LAUNCH): steps 1-5 in one launch where it may wait (a GPU with at least K / g SMs,
    counters made), else the rotate and codes launches. Launch (bench_int8_linear.py sweeps it): block_m, num_warps;
    for the two launches num_stages, row_programs (the rotate pass's programs along the rows, each walking row
    blocks; 0: one a row block). None: the H200 sweep's best, plain rows 3 stages and 16 programs (0.050 against
    0.054 ms at K 3840), normed or activated rows 2 stages and 0."""
    m, k, codes, scales = checked(x, group, norm, norm_weight, scale, row_map, act, out, stats)
    if m == 0:
        return codes, scales
    split, groups, blocks = (4 if group == 256 else 1), k // group, triton.cdiv(m, block_m)
    plain = norm is None and act is None
    num_stages, row_programs = num_stages or 2 + plain, 16 * plain if row_programs is None else row_programs
    if stats is None:  # mean, 1/sqrt(.): norms only
        stats = torch.empty(2, m, dtype=torch.float32, device=x.device)
        if norm is not None:
            row_stats(x, norm, eps, out=stats)
    group_max = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    row_map = row_map.to(torch.int32).contiguous() if row_map is not None else None
    # Contiguous f32, or stats standing in for a pointer the kernel never reads (its constexpr flag off).
    vectors = [stats if t is None else t.float().contiguous() for t in (norm_weight, scale, shift)]
    flags = {"NORM": NORMS[norm], "HAS_WEIGHT": norm_weight is not None,  # HAS_SCALE 2: one modulation row
             "HAS_SCALE": 0 if scale is None else 2 if scale.shape[0] == 1 else 1,
             "HAS_SHIFT": shift is not None and scale is not None, "ACT": ACTS[act],
             "X_BF16": x.dtype == torch.bfloat16, "G": group, "SPLIT": split, "BLOCK_M": block_m,
             # bf16 for the matrix cores; f32 on the CPU, whose interpreter multiplies bf16 as 16-bit ints (triton 3.9)
             "DOT_DTYPE": tl.bfloat16 if x.is_cuda else tl.float32, "num_warps": num_warps, "enable_fp_fusion": False}
    args = (x, x.stride(0), *vectors, row_map if row_map is not None else stats,
            hadamard_bf16(group // split, x.device), stats, stats.stride(0))
    if ONE_LAUNCH if one_launch is None else one_launch:
        counters = _counters(x.device, blocks, groups)
        if counters is not None or not x.is_cuda:  # the CPU interpreter: the kernel's two phases, one after the other
            for phase in (0,) if counters is not None else (1, 2):
                _quantize_kernel[(blocks * groups,)](*args, codes, scales, group_max, stats if counters is None
                                                     else counters, m, k, **flags, PHASE=phase,
                                                     GROUPS_P2=triton.next_power_of_2(groups))
            return codes, scales
    rotated = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)  # step 3's rows, read by the codes pass
    rotate_kernel[(min(row_programs or m, blocks), groups)](*args, rotated, group_max, m, k, **flags,
                                                            num_stages=num_stages)
    launch_codes(rotated, group_max, codes, scales)
    return codes, scales


def _counters(device: torch.device, blocks: int, groups: int):
    """The one launch's counters (a ticket, then one a row block) where its waits are safe: a GPU with at least as
    many SMs as a row block has groups (kernels/arrival_counters.py), the buffer made; else None."""
    if device.type != "cuda" or groups > torch.cuda.get_device_properties(device).multi_processor_count:
        return None
    return kept(device, 1 + blocks)
