"""Steps 4-5 of kernels/int8/quant.py: row scales and INT8 codes from the rotated bf16 rows and each (row, group)'s
absmax, which the rotate pass stores.

Issue 4; reference/int8_convrot_format.md section 5 (quantization numerics). For rotated rows yb [M, K] (bf16)
and gmax [M, K / g] (f32):
  s[m] = max(max_j gmax[m, j] / 127, 1e-30)                 (the division correctly rounded)
  q[m, k] = clamp(rint(bf16(yb[m, k] / bf16(s[m]))), -128, 127)   (ties to even)
The quotient is taken as a product with the row's reciprocal r = f32(1 / bf16(s)), which rounds to the same bf16 as
the correctly rounded quotient for every bf16 yb: with yb = Y 2^a and bf16(s) = S 2^b (Y, S odd, at most 8 bits),
yb / bf16(s) is never a bf16 midpoint (M 2^c, M odd of 9 bits: Y = M S would need 9 bits or more), and lies at
least 2^-17 of its size from every midpoint, while both f32 results are within 2^-23 of it (tests/kernels/
test_int8_quant.py checks every case exhaustively; below 2^-126 both round to the code 0).
A launch of its own after the rotate pass, a program a 16 x 256 tile. (Written by the rotate pass's program that
finishes a row block's last group instead, bit-equal, a Z-Image step took 2x as long on the H200: those programs
run last in the launch and each writes its row block's 64 x K codes alone.)
"""
from __future__ import annotations

import torch

from ..rounding import round_half_even, round_to_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None

CODES_ROWS, CODES_COLUMNS = 16, 256  # a tile of the codes: 16 rows ~15% faster than 32 on the H200


def reference(rotated: torch.Tensor, group_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]) of rotated bf16 rows [M, K] and their
    group maxima [M, K / g]."""
    amax = group_max.float().amax(-1)
    # A tensor divisor: CUDA torch divides by a Python scalar as a product with its reciprocal.
    s = (amax / torch.full_like(amax, 127.0)).clamp(min=1e-30)
    return (rotated / s.to(torch.bfloat16)[:, None]).round().clamp(-128, 127).to(torch.int8), s


@triton_jit
def _codes_kernel(y_ptr, gmax_ptr, q_ptr, s_ptr, M, K, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, LAST_FIRST: tl.constexpr):
    # Steps 4-5 over a [BLOCK_M, BLOCK_K] tile of the rotated bf16 rows, once every group's absmax is known; the
    # rows' scales stored by the tiles of the first columns. LAST_FIRST: the column blocks go last first, as the
    # rotate pass wrote them first to last (its groups along the grid's slower axis), so where the rotated rows
    # outgrow L2 (K 9216: 85 MB) the ones it wrote last are still there when read.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col0 = ((tl.num_programs(1) - 1 - tl.program_id(1)) if LAST_FIRST else tl.program_id(1)) * BLOCK_K
    cols = col0 + tl.arange(0, BLOCK_K)
    rmask = rows < M
    groups = tl.arange(0, GROUPS_P2)
    gmax = tl.load(gmax_ptr + rows[:, None] * GROUPS + groups[None, :],
                   mask=rmask[:, None] & (groups < GROUPS)[None, :], other=0.0)
    s = tl.maximum(tl.math.div_rn(tl.max(gmax, axis=1), 127.0), 1e-30)
    if col0 == 0:
        tl.store(s_ptr + rows, s, mask=rmask)
    mask = rmask[:, None] & (cols < K)[None, :]
    offsets = rows[:, None].to(tl.int64) * K + cols[None, :]
    yb = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # bf16(yb / bf16(s)) as bf16(yb * (1 / bf16(s))): equal for every bf16 yb and s (see above), and a product
    # where the correctly rounded division is a dozen instructions an element.
    code = round_half_even(round_to_bf16(yb * tl.math.div_rn(1.0, round_to_bf16(s))[:, None]))
    tl.store(q_ptr + offsets, tl.minimum(tl.maximum(code, -128.0), 127.0).to(tl.int8), mask=mask)


def launch_codes(rotated: torch.Tensor, group_max: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                 last_first: bool = True) -> None:
    """Codes and scales of the rotated rows [M, K] and their group maxima [M, K / g]; last_first: the kernel's
    LAST_FIRST (kernels.Choices.codes_last_first)."""
    (m, k), groups = rotated.shape, group_max.shape[1]
    _codes_kernel[(triton.cdiv(m, CODES_ROWS), triton.cdiv(k, CODES_COLUMNS))](
        rotated, group_max, codes, scales, m, k, GROUPS=groups, GROUPS_P2=triton.next_power_of_2(groups),
        BLOCK_M=CODES_ROWS, BLOCK_K=CODES_COLUMNS, LAST_FIRST=last_first, num_warps=4)
