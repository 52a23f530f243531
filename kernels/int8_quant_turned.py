"""Attention outputs already turned by H_64 to INT8 ConvRot codes in one pass: the radix-4 step, row scales, codes.

Issue 4; reference/int8_convrot_format.md sections 3-5. H_256 = H4 (x) H_64 (kernels/hadamard.py), so a 256-group
u = [u0 u1 u2 u3] (64 columns each) rotates as y_s = sum_a H4[a, s] (u_a H_64) / 2. Attention is linear in v, so
turning each 64 columns of v by H_64 (kernels/qkv_rope_linear.py's turn_v: v' = bf16(v H_64), in its epilogue) turns
the attention's output the same way: its rows t arrive with t_a = bf16(u_a H_64), up to the attention's bf16
rounding, and what is left of kernels/int8_quant.py's math is, for rows t [M, K] bf16 (K a multiple of 256):
  y = bf16(sum_a H4[a, s] t_a / 2)            (radix4_rounded: halving is exact; f32 sums)
  s = max(max_k |y| / 127, 1e-30),  q = clamp(rint(bf16(y / bf16(s))), -128, 127)   (kernels/int8_codes.py)
Why: the rotate pass reads x, writes and reads back the bf16 rotated rows and writes codes, 7 bytes a value; this
pass reads t and writes codes, 3 (H200, 4608 x 3840: the two passes 0.039 ms, docs/benchmarks.md). A program takes
ROWS whole rows: the groups along one axis (padded to a power of two: masked, never read), the four 64-column blocks
as four tensors, so the radix-4 step is elementwise and the row's absmax is known before its codes leave registers.
"""
from __future__ import annotations

import torch

from .hadamard import radix4_rounded
from .int8_codes import reference as codes_reference
from .rounding import round_half_even, round_to_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

GROUP, BLOCK = 256, 64  # the ConvRot group this pass finishes; the columns H_64 turned
MAX_K = 8192  # whole rows in registers: beyond this a program's values spill (the callers then leave v unturned)


def fits(k: int, group: int) -> bool:
    """Whether rows of k features in ConvRot groups of `group` can take this pass (the callers turn v only then)."""
    return group == GROUP and k % GROUP == 0 and 0 < k <= MAX_K


def reference(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]) of turned rows t [M, K]."""
    m, k = t.shape
    blocks = t.float().reshape(m, k // GROUP, 4, BLOCK) / 2
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32)
    y = torch.einsum("mgab,as->mgsb", blocks.double(), h4.double().to(t.device)).reshape(m, k).to(torch.bfloat16)
    return codes_reference(y, y.abs().reshape(m, k // GROUP, GROUP).amax(-1))


@triton_jit
def _store_codes(q_ptr, at, inside, y, r):
    """Codes of one 64-column block of each group: rint(bf16(y / bf16(s))) clamped, stored."""
    code = tl.minimum(tl.maximum(round_half_even(round_to_bf16(y * r)), -128.0), 127.0)
    tl.store(q_ptr + at, code.to(tl.int8), mask=inside)


@triton_jit
def _turned_codes_kernel(t_ptr, q_ptr, s_ptr, M, K, GROUP: tl.constexpr, BLOCK: tl.constexpr,
                         GROUPS_P2: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    groups = tl.arange(0, GROUPS_P2)
    cols = tl.arange(0, BLOCK)
    # [ROWS, groups, 64]: block a of each group at column g 256 + a 64 + j
    at = rows[:, None, None].to(tl.int64) * K + (groups[None, :, None] * GROUP + cols[None, None, :])
    inside = (rows < M)[:, None, None] & (groups < K // GROUP)[None, :, None]
    # f32 halves of bf16 values (exact), as radix4_rounded takes them
    t0 = tl.load(t_ptr + at, mask=inside, other=0.0).to(tl.float32) * 0.5
    t1 = tl.load(t_ptr + at + BLOCK, mask=inside, other=0.0).to(tl.float32) * 0.5
    t2 = tl.load(t_ptr + at + 2 * BLOCK, mask=inside, other=0.0).to(tl.float32) * 0.5
    t3 = tl.load(t_ptr + at + 3 * BLOCK, mask=inside, other=0.0).to(tl.float32) * 0.5
    y0, y1, y2, y3 = radix4_rounded(t0, t1, t2, t3)
    top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
    s = tl.maximum(tl.math.div_rn(tl.max(tl.max(top, axis=2), axis=1), 127.0), 1e-30)
    tl.store(s_ptr + rows, s, mask=rows < M)
    r = tl.math.div_rn(1.0, round_to_bf16(s))[:, None, None]  # the quotient as a product: int8_codes' argument
    _store_codes(q_ptr, at, inside, y0, r)
    _store_codes(q_ptr, at + BLOCK, inside, y1, r)
    _store_codes(q_ptr, at + 2 * BLOCK, inside, y2, r)
    _store_codes(q_ptr, at + 3 * BLOCK, inside, y3, r)


def quantize_turned(t: torch.Tensor, out=None, rows: int = 1, num_warps: int = 4):
    """Turned rows t [M, K] bf16 (attention outputs of a v turned by H_64) to (codes int8 [M, K], scales f32 [M])
    by the math above; out: optional (codes, scales), written fully. rows, num_warps: the launch shape."""
    m, k = t.shape
    if t.dtype != torch.bfloat16 or t.stride(-1) != 1 or t.stride(0) != k or not fits(k, GROUP):
        raise ValueError(f"quantize_turned: rows must be contiguous bf16 [M, K], K a multiple of {GROUP} up to "
                         f"{MAX_K}, got {t.dtype} {tuple(t.shape)}")
    codes, scales = out if out is not None else (torch.empty(m, k, dtype=torch.int8, device=t.device),
                                                  torch.empty(m, dtype=torch.float32, device=t.device))
    if m:
        _turned_codes_kernel[(triton.cdiv(m, rows),)](t, codes, scales, m, k, GROUP=GROUP, BLOCK=BLOCK,
                                                      GROUPS_P2=triton.next_power_of_2(k // GROUP), ROWS=rows,
                                                      num_warps=num_warps, enable_fp_fusion=False)
    return codes, scales
