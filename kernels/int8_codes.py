"""Steps 4-5 of kernels/int8_quant.py: row scales and INT8 codes from the rotated bf16 rows and each (row, group)'s
absmax, which the rotate pass stores.

Issue 4; reference/int8_convrot_format.md section 5. For rotated rows yb [M, K] (bf16) and gmax [M, K / g] (f32):
  s[m] = max(max_j gmax[m, j] / 127, 1e-30)                 (the division correctly rounded)
  q[m, k] = clamp(rint(bf16(yb[m, k] / bf16(s[m]))), -128, 127)   (ties to even)
Two ways to run it: a launch of its own after the rotate pass (`_codes_kernel`, a program a 16 x 256 tile), or by
the rotate pass itself (`codes_by_last_group`): the program that finishes a row block's last group (an arrival
counter a row block: kernels/arrival_counters.py) writes that row block's codes, reading the
rotated rows the other groups' programs just stored, from L2. The maximum is exact whatever the order the groups
arrive in, so both give the same codes bit for bit.
"""
from __future__ import annotations

import torch

from .arrival_counters import counted_last, counter_reset
from .rounding import round_half_even, round_to_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

CODES_ROWS, CODES_COLUMNS = 16, 256  # a tile of the codes: 0.047 against 0.055 ms with 32 rows (H200, K 9216)
_ROWS, _COLUMNS = (tl.constexpr(CODES_ROWS), tl.constexpr(CODES_COLUMNS)) if tl is not None else (None, None)


def reference(rotated: torch.Tensor, group_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]) of rotated bf16 rows [M, K] and their
    group maxima [M, K / g]."""
    amax = group_max.float().amax(-1)
    # A tensor divisor: CUDA torch divides by a Python scalar as a product with its reciprocal.
    s = (amax / torch.full_like(amax, 127.0)).clamp(min=1e-30)
    return (rotated / s.to(torch.bfloat16)[:, None]).round().clamp(-128, 127).to(torch.int8), s


@triton_jit
def _codes_tile(y_ptr, gmax_ptr, q_ptr, s_ptr, rows, col0, M, K, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                BLOCK_K: tl.constexpr, FROM_L2: tl.constexpr):
    """Codes of rows x [col0, col0 + BLOCK_K); the rows' scales stored too when col0 is 0. FROM_L2: the inputs were
    stored by other programs of this launch (read through L2, never a stale L1 line)."""
    cols = col0 + tl.arange(0, BLOCK_K)
    rmask = rows < M
    groups = tl.arange(0, GROUPS_P2)
    modifier: tl.constexpr = ".cg" if FROM_L2 else ""
    gmax = tl.load(gmax_ptr + rows[:, None] * GROUPS + groups[None, :],
                   mask=rmask[:, None] & (groups < GROUPS)[None, :], other=0.0, cache_modifier=modifier)
    s = tl.maximum(tl.math.div_rn(tl.max(gmax, axis=1), 127.0), 1e-30)
    if col0 == 0:
        tl.store(s_ptr + rows, s, mask=rmask)
    mask = rmask[:, None] & (cols < K)[None, :]
    offsets = rows[:, None].to(tl.int64) * K + cols[None, :]
    yb = tl.load(y_ptr + offsets, mask=mask, other=0.0, cache_modifier=modifier).to(tl.float32)
    code = round_half_even(round_to_bf16(tl.math.div_rn(yb, round_to_bf16(s)[:, None])))
    tl.store(q_ptr + offsets, tl.minimum(tl.maximum(code, -128.0), 127.0).to(tl.int8), mask=mask)


@triton_jit
def _codes_kernel(y_ptr, gmax_ptr, q_ptr, s_ptr, M, K, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # Steps 4-5 over a [BLOCK_M, BLOCK_K] tile of the rotated bf16 rows, once every group's absmax is known.
    _codes_tile(y_ptr, gmax_ptr, q_ptr, s_ptr, tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M),
                tl.program_id(1) * BLOCK_K, M, K, GROUPS, GROUPS_P2, BLOCK_K, False)


def launch_codes(rotated: torch.Tensor, group_max: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """The launch of its own: codes and scales of the rotated rows [M, K] and their group maxima [M, K / g]."""
    (m, k), groups = rotated.shape, group_max.shape[1]
    _codes_kernel[(triton.cdiv(m, CODES_ROWS), triton.cdiv(k, CODES_COLUMNS))](
        rotated, group_max, codes, scales, m, k, GROUPS=groups, GROUPS_P2=triton.next_power_of_2(groups),
        BLOCK_M=CODES_ROWS, BLOCK_K=CODES_COLUMNS, num_warps=4)


@triton_jit
def codes_by_last_group(y_ptr, gmax_ptr, q_ptr, s_ptr, count_ptr, block, M, K, GROUPS: tl.constexpr,
                        GROUPS_P2: tl.constexpr, BLOCK_M: tl.constexpr):
    """Called by each group's program once it has stored row block `block`'s rotated rows and maxima: the program
    counted last writes the block's codes and scales, and sets the counter back to 0 for the next launch."""
    if counted_last(count_ptr, block, GROUPS):
        for r0 in tl.static_range(0, BLOCK_M, _ROWS):
            rows = block * BLOCK_M + r0 + tl.arange(0, _ROWS)
            for c0 in range(0, K, _COLUMNS):
                _codes_tile(y_ptr, gmax_ptr, q_ptr, s_ptr, rows, c0, M, K, GROUPS, GROUPS_P2, _COLUMNS, True)
        counter_reset(count_ptr, block)
