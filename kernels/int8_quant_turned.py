"""Plain rows to INT8 ConvRot codes in one pass, whole rows a program: rotation on the matrix cores, radix-4 step,
row scales, codes; for rows of up to MAX_K features (attention outputs), with or without v turned upstream.

Issue 4; reference/int8_convrot_format.md sections 3-5. H_256 = H4 (x) H_64 (kernels/hadamard.py) and H_64 = (H4 / 2)
(x) H_16 along the digits of a column j = 16 d + e of a 64-column block, so a 256-group u = [u0 u1 u2 u3] rotates as
  y_s = sum_a H4[a, s] z_a,   z_a = u_a (H_64 / 2)      (radix4_rounded; each z_a on the matrix cores)
turned: attention is linear in v, so the fused QKV may take d's factor into v (qkv_rope_linear's turn_v: v' =
bf16(v ((H4 / 2) (x) I_16)) per 64 columns, in registers, no cost measured); the attention's output t then holds
t_a = u_a ((H4 / 2) (x) I_16) up to its bf16 rounding, and z_a = t_a (I_4 (x) H_16 / 2): products of 16 columns, not
64. Either way, for rows t [M, K] bf16 (K a multiple of 256):
  z_a as above, bf16 operands (exact products), f32 sums;  y = bf16(sum_a H4[a, s] z_a)
  s = max(max_k |y| / 127, 1e-30),  q = clamp(rint(bf16(y / bf16(s))), -128, 127)   (kernels/int8_codes.py)
Why: kernels/int8_quant.py's rotate pass writes and reads back the bf16 rotated rows: 7 bytes a value; this pass
reads t and writes codes, 3. A program takes ROWS whole rows; a row's groups' 64-column blocks stand as the rows of
the matrix-core product (so one row fills it), the four blocks of a group as four tensors, so the radix-4 step is
elementwise and the row's absmax is known before its codes leave registers.
"""
from __future__ import annotations

import functools

import torch

from . import int8_quant_turned_hopper
from .hadamard import hadamard, hadamard_bf16, radix4_rounded
from .int8_codes import reference as codes_reference
from .rounding import round_half_even, round_to_bf16

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

GROUP, BLOCK, TURN = 256, 64, 16  # the ConvRot group; its blocks (H_64's); turned rows' products (H_16's)
MAX_K = 8192  # whole rows in registers: beyond this a program's values spill (the callers then leave v unturned)


def fits(k: int, group: int) -> bool:
    """Whether rows of k features in ConvRot groups of `group` can take this pass (the callers turn v only then)."""
    return group == GROUP and k % GROUP == 0 and 0 < k <= MAX_K


def turned_digit(u: torch.Tensor) -> torch.Tensor:
    """u [..., K] in float64 with each 64 columns' digit d turned: u ((H4 / 2) (x) I_16), unrounded. The factor is
    its own inverse, so this also turns rows back."""
    h4 = hadamard(4, torch.float64).to(u.device)
    blocks = u.double().reshape(*u.shape[:-1], u.shape[-1] // BLOCK, 4, TURN)
    return torch.einsum("...ae,as->...se", blocks, h4).reshape(u.shape)


def turned_rows(u: torch.Tensor) -> torch.Tensor:
    """bf16(u ((H4 / 2) (x) I_16)), the products exact, the sums in float64: what turn_v does to v, and so to an
    attention's output."""
    return turned_digit(u).to(torch.bfloat16)


@functools.cache
def turn_matrix(device: torch.device) -> torch.Tensor:
    """(H4 / 2) (x) I_16 in bf16 (entries 0, +-1/2: exact), contiguous on device: turn_v's operand on the matrix
    cores (kernels/qkv_rope_linear.py's Triton kernel)."""
    return torch.kron(hadamard(4, torch.float64), torch.eye(TURN, dtype=torch.float64)).to(device, torch.bfloat16)


def reference(t: torch.Tensor, turned: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]) of rows t [M, K] (turned: d's factor
    already taken, turned_rows)."""
    m, k = t.shape
    span = TURN if turned else BLOCK
    z = t.double().reshape(m, k // span, span) @ (hadamard(span, torch.float64) / 2).to(t.device)
    y = torch.einsum("mgab,as->mgsb", z.reshape(m, k // GROUP, 4, BLOCK), hadamard(4, torch.float64).to(t.device) * 2)
    y = y.reshape(m, k).to(torch.bfloat16)
    return codes_reference(y, y.abs().reshape(m, k // GROUP, GROUP).amax(-1))


@triton_jit
def _store_codes(q_ptr, at, inside, y, r):
    """Codes of one 64-column block of each group: rint(bf16(y / bf16(s))) clamped, stored."""
    code = tl.minimum(tl.maximum(round_half_even(round_to_bf16(y * r)), -128.0), 127.0)
    tl.store(q_ptr + at, code.to(tl.int8), mask=inside)


@triton_jit
def _block_turned(t_ptr, at, inside, h, ROWS: tl.constexpr, GROUPS_P2: tl.constexpr, BLOCK: tl.constexpr,
                  SPAN: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """One 64-column block of each group [ROWS, groups, 64] times (H_SPAN / 2) along its last SPAN columns, on the
    matrix cores: the groups' blocks stand as the product's rows (ROWS x groups x 64 / SPAN of them)."""
    t = tl.load(t_ptr + at, mask=inside, other=0.0).to(DOT_DTYPE)
    z = tl.dot(tl.reshape(t, (ROWS * GROUPS_P2 * (BLOCK // SPAN), SPAN)), h, input_precision="ieee",
               out_dtype=tl.float32)
    return tl.reshape(z, (ROWS, GROUPS_P2, BLOCK))


@triton_jit
def _turned_codes_kernel(t_ptr, h_ptr, q_ptr, s_ptr, M, K, GROUP: tl.constexpr, BLOCK: tl.constexpr,
                         SPAN: tl.constexpr, GROUPS_P2: tl.constexpr, ROWS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    groups = tl.arange(0, GROUPS_P2)
    cols = tl.arange(0, BLOCK)
    # [ROWS, groups, 64]: block a of each group at column g 256 + a 64 + j
    at = rows[:, None, None].to(tl.int64) * K + (groups[None, :, None] * GROUP + cols[None, None, :])
    inside = (rows < M)[:, None, None] & (groups < K // GROUP)[None, :, None]
    hq = tl.arange(0, SPAN)
    h = tl.load(h_ptr + hq[:, None] * SPAN + hq[None, :]).to(DOT_DTYPE)
    z0 = _block_turned(t_ptr, at, inside, h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    z1 = _block_turned(t_ptr, at + BLOCK, inside, h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    z2 = _block_turned(t_ptr, at + 2 * BLOCK, inside, h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    z3 = _block_turned(t_ptr, at + 3 * BLOCK, inside, h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    y0, y1, y2, y3 = radix4_rounded(z0, z1, z2, z3)
    top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
    s = tl.maximum(tl.math.div_rn(tl.max(tl.max(top, axis=2), axis=1), 127.0), 1e-30)
    tl.store(s_ptr + rows, s, mask=rows < M)
    r = tl.math.div_rn(1.0, round_to_bf16(s))[:, None, None]  # the quotient as a product: int8_codes' argument
    _store_codes(q_ptr, at, inside, y0, r)
    _store_codes(q_ptr, at + BLOCK, inside, y1, r)
    _store_codes(q_ptr, at + 2 * BLOCK, inside, y2, r)
    _store_codes(q_ptr, at + 3 * BLOCK, inside, y3, r)


def quantize_turned(t: torch.Tensor, turned: bool = True, out=None, rows: int = 1, num_warps: int = 4):
    """Rows t [M, K] bf16 (turned: an attention's output whose v was turned, turned_rows) to (codes int8 [M, K],
    scales f32 [M]) by the math above; out: optional (codes, scales), written fully. rows, num_warps: the launch
    shape. On Hopper, turned rows take kernels/int8_quant_turned_hopper.py's kernel (H_16 in registers)."""
    m, k = t.shape
    if t.dtype != torch.bfloat16 or t.stride(-1) != 1 or t.stride(0) != k or not fits(k, GROUP):
        raise ValueError(f"quantize_turned: rows must be contiguous bf16 [M, K], K a multiple of {GROUP} up to "
                         f"{MAX_K}, got {t.dtype} {tuple(t.shape)}")
    codes, scales = out if out is not None else (torch.empty(m, k, dtype=torch.int8, device=t.device),
                                                  torch.empty(m, dtype=torch.float32, device=t.device))
    span = TURN if turned else BLOCK
    if m and turned and int8_quant_turned_hopper.unusable(t) is None and int8_quant_turned_hopper.launch(t, codes,
                                                                                                       scales):
        return codes, scales
    if m:
        # bf16 operands on the matrix cores; f32 on the CPU, whose interpreter multiplies bf16 as 16-bit ints
        _turned_codes_kernel[(triton.cdiv(m, rows),)](
            t, hadamard_bf16(span, t.device, halved=True), codes, scales, m, k, GROUP=GROUP, BLOCK=BLOCK, SPAN=span,
            GROUPS_P2=triton.next_power_of_2(k // GROUP), ROWS=rows, DOT_DTYPE=tl.bfloat16 if t.is_cuda else tl.float32,
            num_warps=num_warps, enable_fp_fusion=False)
    return codes, scales
