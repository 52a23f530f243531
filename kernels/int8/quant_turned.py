"""Plain rows to INT8 ConvRot codes in one pass, whole rows a program: rotation on the matrix cores, radix-4 step,
row scales, codes; for rows of up to MAX_K features, plain or with a factor of the rotation taken upstream (turned).

Issue 4; reference/int8_convrot_format.md sections 3-5 (Hadamard matrix, rotation, quantization). H_256 = H4
(x) H_64 (kernels/int8/hadamard.py) and H_64 = (H4 / 2) (x) (H4 / 2) (x) (H4 / 2) along the base-4 digits of a
column j = 16 d2 + 4 d1 + d0 of a 64-column block, so a 256-group u = [u0 u1 u2 u3] rotates as
  y_s = sum_a H4[a, s] z_a,   z_a = u_a (H_64 / 2)      (radix4_rounded; each z_a on the matrix cores)
The factors commute, so a producer may take some of them in its registers (TURNED: the digits it turns), and z_a is
then the rest (rest_operand):
  "v"       attention is linear in v, so the fused QKV turns d2 of v (qkv_rope_linear's turn_v, bf16(v ((H4 / 2) (x)
            I_16))) and the attention's output t holds t_a = u_a ((H4 / 2) (x) I_16) up to its bf16 rounding;
            z_a = t_a (I_4 (x) H_16 / 2): products of 16 columns, not 64. UP's GELU epilogue turns the same digit
            of the MLP's hidden rows before their one bf16 rounding (int8_linear's gelu_tanh with turn_hidden).
  "hidden"  UP's SwiGLU epilogue turns d2 and d1 of the MLP's hidden rows before their one bf16 rounding
            (int8_linear's turn_hidden, turned_f32); z_a = t_a (I_16 (x) H4 / 2).
For rows t [M, K] bf16 (K a multiple of 256):
  z_a as above, bf16 operands (exact products), f32 sums;  y = bf16(sum_a H4[a, s] z_a)
  s = max(max_k |y| / 127, 1e-30),  q = clamp(rint(bf16(y / bf16(s))), -128, 127)   (kernels/int8/codes.py)
Plain rows may come with an attention's gate (issues 36, 38): t = bf16(x f sigmoid(g)) first (kernels/int8/prologue.py).
Why: kernels/int8/quant.py's rotate pass writes and reads back the bf16 rotated rows: 7 bytes a value; this pass
reads t and writes codes, 3. A program takes ROWS whole rows; a row's groups' 64-column blocks stand as the rows of
the matrix-core product (so one row fills it), the four blocks of a group as four tensors, so the radix-4 step is
elementwise and the row's absmax is known before its codes leave registers.
"""
from __future__ import annotations

import functools

import torch

from . import quant_turned_hopper
from .hadamard import hadamard, radix4_rounded
from .codes import reference as codes_reference
from .prologue import checked_gate, gate_values, gated_rows
from .tiles import sm_count
from ..rounding import round_half_even, round_to_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = None

GROUP, BLOCK, TURN = 256, 64, 16  # the ConvRot group; its blocks (H_64's); turned rows' products (H_16's)
MAX_K = 8192  # whole rows in registers: beyond this a program's values spill (the callers then leave v unturned)


def fits(k: int, group: int) -> bool:
    """Whether rows of k features in ConvRot groups of `group` can take this pass (the callers turn v only then)."""
    return group == GROUP and k % GROUP == 0 and 0 < k <= MAX_K


# The base-4 digits of each 64-column block (j = 16 d2 + 4 d1 + d0) that a producer turns, in the order it turns them.
TURNED = {"v": (2,), "hidden": (2, 1)}


def _digits_last(x: torch.Tensor, digit: int) -> torch.Tensor:
    """x [..., 64 k] as [..., k, 4, 4 (the other two digits, high first), 4 (this digit)]: a view to turn along."""
    return torch.movedim(x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, 4, 4, 4), -1 - digit, -1)


def _digits_back(x: torch.Tensor, digit: int) -> torch.Tensor:
    return torch.movedim(x, -1, -1 - digit).reshape(*x.shape[:-4], -1)


def turned_digits(u: torch.Tensor, digits=TURNED["v"]) -> torch.Tensor:
    """u [..., K] in float64 with each 64 columns' listed digits turned (H4 / 2 along each), unrounded. Each factor
    is its own inverse, so this also turns rows back."""
    h4 = hadamard(4, torch.float64).to(u.device)
    x = u.double()
    for digit in digits:
        x = _digits_back(_digits_last(x, digit) @ h4, digit)
    return x


def turned_rows(u: torch.Tensor, digits=TURNED["v"]) -> torch.Tensor:
    """bf16 of turned_digits' rows, the products exact, the sums in float64: what turn_v does to v, and so to an
    attention's output."""
    return turned_digits(u, digits).to(torch.bfloat16)


def turned_f32(u: torch.Tensor, digits=TURNED["hidden"]) -> torch.Tensor:
    """u [..., K] f32 with the listed digits turned in f32 as the epilogues turn them, digit after digit: half =
    ((x0 + x1) + (x2 + x3)) / 2, out_s = half - x_(3 - s) (H4 = ones - 2 antidiagonal). Unrounded: UP's SwiGLU
    epilogue rounds the turned rows to bf16 once (int8_linear's turn_hidden)."""
    x = u.float()
    for digit in digits:
        x0, x1, x2, x3 = _digits_last(x, digit).unbind(-1)
        half = ((x0 + x1) + (x2 + x3)) * 0.5
        x = _digits_back(torch.stack([half - x3, half - x2, half - x1, half - x0], -1), digit)
    return x


@triton_jit
def _h4_halved_pair(x):
    """(H4 / 2) along a digit held in x's last two axes [.., 2 (its high bit), 2 (its low bit)]: turned_f32's sums."""
    lo0, lo1 = tl.split(x)
    x0, x2 = tl.split(lo0)
    x1, x3 = tl.split(lo1)
    half = ((x0 + x1) + (x2 + x3)) * 0.5
    return tl.join(tl.join(half - x3, half - x1), tl.join(half - x2, half - x0))


@triton_jit
def turned_hidden(act, BM: tl.constexpr, BH: tl.constexpr):
    """turned_f32 of f32 rows act [BM, BH] (BH a multiple of 64): digit d2, then d1 (kernels/int8/linear.py's
    SwiGLU epilogue; kernels/int8/hopper_epilogues.py's turned_hidden is the same on Hopper, in registers)."""
    x = tl.reshape(act, (BM, BH // 64, 2, 2, 2, 2, 4))  # [.., d2 high, d2 low, d1 high, d1 low, d0]
    x = _h4_halved_pair(tl.permute(x, (0, 1, 4, 5, 6, 2, 3)))  # [.., d1 high, d1 low, d0, d2 high, d2 low]
    x = _h4_halved_pair(tl.permute(x, (0, 1, 5, 6, 4, 2, 3)))  # [.., d2 high, d2 low, d0, d1 high, d1 low]
    return tl.reshape(tl.permute(x, (0, 1, 2, 3, 5, 6, 4)), (BM, BH))


@triton_jit
def turned_top(act, BM: tl.constexpr, BH: tl.constexpr):
    """turned_f32 of f32 rows act [BM, BH] (BH a multiple of 64) along digit d2 alone (TURNED["v"]: int8_linear's
    turned GELU rows)."""
    x = tl.reshape(act, (BM, BH // 64, 2, 2, 16))  # [.., d2 high, d2 low, d1 d0]
    x = _h4_halved_pair(tl.permute(x, (0, 1, 4, 2, 3)))  # [.., d1 d0, d2 high, d2 low]
    return tl.reshape(tl.permute(x, (0, 1, 3, 4, 2)), (BM, BH))


@functools.cache
def rest_operand(turned: str | None, span: int, device: torch.device) -> torch.Tensor:
    """The factors of H_span / 2 that a producer did not take (I_4 for a turned digit), in bf16 (entries 0 and +-2^-k:
    exact), contiguous on device: the products' operand for rows turned upstream (plain rows: H_span / 2)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    for digit in reversed(range(span.bit_length() // 2)):  # (16: digits 1, 0; 64: 2, 1, 0), the highest first
        factor = torch.eye(4, dtype=torch.float64) if digit in TURNED.get(turned, ()) else hadamard(4, torch.float64)
        h = torch.kron(h, factor)
    return (h / 2).to(torch.bfloat16).to(device).contiguous()


@functools.cache
def turn_matrix(device: torch.device) -> torch.Tensor:
    """(H4 / 2) (x) I_16 in bf16 (entries 0, +-1/2: exact), contiguous on device: turn_v's operand on the matrix
    cores (kernels/int8/qkv_rope_linear.py's Triton kernel)."""
    return torch.kron(hadamard(4, torch.float64), torch.eye(TURN, dtype=torch.float64)).to(device, torch.bfloat16)


def reference(t: torch.Tensor, turned: str | None = "v", gate: torch.Tensor | None = None,
              gate_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The math above in plain torch: (codes int8 [M, K], scales f32 [M]) of rows t [M, K] (turned: the digits that
    a producer took, TURNED's key; None: plain rows, gated where a gate is given)."""
    t = t if gate is None else gated_rows(t, gate, gate_factor)
    m, k = t.shape
    z = t.double().reshape(m, k // BLOCK, BLOCK) @ rest_operand(turned, BLOCK, t.device).double()
    y = torch.einsum("mgab,as->mgsb", z.reshape(m, k // GROUP, 4, BLOCK), hadamard(4, torch.float64).to(t.device) * 2)
    y = y.reshape(m, k).to(torch.bfloat16)
    return codes_reference(y, y.abs().reshape(m, k // GROUP, GROUP).amax(-1))


@triton_jit
def _store_codes(q_ptr, at, inside, y, r):
    """Codes of one 64-column block of each group: rint(bf16(y / bf16(s))) clamped, stored."""
    code = tl.minimum(tl.maximum(round_half_even(round_to_bf16(y * r)), -128.0), 127.0)
    tl.store(q_ptr + at, code.to(tl.int8), mask=inside)


@triton_jit
def _gated_block(t, g_rows, first, inside, BLOCK: tl.constexpr, GATE_SPAN: tl.constexpr, GATE_FACTOR: tl.constexpr):
    """One loaded 64-column block of each group t [ROWS, groups, 64] (first: each one's first column [1, groups, 1])
    times its gate: GATE_SPAN (0: no gate) the features a gate value covers, each row's gate row at g_rows
    [ROWS, 1, 1] (kernels/int8/prologue.py); bf16 values."""
    if GATE_SPAN % BLOCK == 0 and GATE_SPAN > 0:  # a gate value over each block (a head): [ROWS, groups, 1]
        t = round_to_bf16(t.to(tl.float32) * gate_values(g_rows, first // GATE_SPAN, inside, GATE_FACTOR))
    elif GATE_SPAN:
        at_gate = (first + tl.arange(0, BLOCK)[None, None, :]) // GATE_SPAN
        t = round_to_bf16(t.to(tl.float32) * gate_values(g_rows, at_gate, inside, GATE_FACTOR))
    return t


@triton_jit
def _block_product(t, h, ROWS: tl.constexpr, GROUPS_P2: tl.constexpr, BLOCK: tl.constexpr, SPAN: tl.constexpr,
                   DOT_DTYPE: tl.constexpr):
    """A block of each group t [ROWS, groups, 64] times h (rest_operand) along its last SPAN columns, on the matrix
    cores: the groups' blocks stand as the product's rows (ROWS x groups x 64 / SPAN of them); f32 [ROWS, groups,
    64]."""
    z = tl.dot(tl.reshape(t.to(DOT_DTYPE), (ROWS * GROUPS_P2 * (BLOCK // SPAN), SPAN)), h, input_precision="ieee",
               out_dtype=tl.float32)
    return tl.reshape(z, (ROWS, GROUPS_P2, BLOCK))


@triton_jit
def _codes_stored(z0, z1, z2, z3, q_ptr, s_ptr, at, inside, rows, M, BLOCK: tl.constexpr):
    """The four blocks' products of each group to codes and row scales: the radix-4 step, the row's absmax, codes."""
    y0, y1, y2, y3 = radix4_rounded(z0, z1, z2, z3)
    top = tl.maximum(tl.maximum(tl.abs(y0), tl.abs(y1)), tl.maximum(tl.abs(y2), tl.abs(y3)))
    s = tl.maximum(tl.math.div_rn(tl.max(tl.max(top, axis=2), axis=1), 127.0), 1e-30)
    tl.store(s_ptr + rows, s, mask=rows < M)
    r = tl.math.div_rn(1.0, round_to_bf16(s))[:, None, None]  # the quotient as a product: int8_codes' argument
    _store_codes(q_ptr, at, inside, y0, r)
    _store_codes(q_ptr, at + BLOCK, inside, y1, r)
    _store_codes(q_ptr, at + 2 * BLOCK, inside, y2, r)
    _store_codes(q_ptr, at + 3 * BLOCK, inside, y3, r)


@triton_jit
def _turned_codes_loop_kernel(t_ptr, h_ptr, q_ptr, s_ptr, g_ptr, stride_g, M, K, GROUP: tl.constexpr,
                              BLOCK: tl.constexpr, SPAN: tl.constexpr, GROUPS_P2: tl.constexpr, ROWS: tl.constexpr,
                              DOT_DTYPE: tl.constexpr, GATE_SPAN: tl.constexpr, GATE_FACTOR: tl.constexpr):
    """_turned_codes_kernel's math, a program walking row blocks (grid: a few programs an SM), each block's rows
    read while the block before is rotated and stored: twice the rows in flight a program, the loads under the
    products."""
    step = tl.num_programs(0) * ROWS
    groups = tl.arange(0, GROUPS_P2)
    first = groups[None, :, None] * GROUP
    cols = first + tl.arange(0, BLOCK)[None, None, :]
    hq = tl.arange(0, SPAN)
    h = tl.load(h_ptr + hq[:, None] * SPAN + hq[None, :]).to(DOT_DTYPE)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = rows[:, None, None].to(tl.int64) * K + cols
    inside = (rows < M)[:, None, None] & (groups < K // GROUP)[None, :, None]
    g_rows = g_ptr + rows[:, None, None].to(tl.int64) * stride_g
    t0 = tl.load(t_ptr + at, mask=inside, other=0.0)
    t1 = tl.load(t_ptr + at + BLOCK, mask=inside, other=0.0)
    t2 = tl.load(t_ptr + at + 2 * BLOCK, mask=inside, other=0.0)
    t3 = tl.load(t_ptr + at + 3 * BLOCK, mask=inside, other=0.0)
    for _ in range(tl.program_id(0) * ROWS, M, step):
        # the next block's rows asked for first (masked past M), then this block's math
        n_rows = rows + step
        n_at = n_rows[:, None, None].to(tl.int64) * K + cols
        n_inside = (n_rows < M)[:, None, None] & (groups < K // GROUP)[None, :, None]
        n0 = tl.load(t_ptr + n_at, mask=n_inside, other=0.0)
        n1 = tl.load(t_ptr + n_at + BLOCK, mask=n_inside, other=0.0)
        n2 = tl.load(t_ptr + n_at + 2 * BLOCK, mask=n_inside, other=0.0)
        n3 = tl.load(t_ptr + n_at + 3 * BLOCK, mask=n_inside, other=0.0)
        z0 = _block_product(_gated_block(t0, g_rows, first, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h, ROWS,
                            GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
        z1 = _block_product(_gated_block(t1, g_rows, first + BLOCK, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h,
                            ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
        z2 = _block_product(_gated_block(t2, g_rows, first + 2 * BLOCK, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h,
                            ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
        z3 = _block_product(_gated_block(t3, g_rows, first + 3 * BLOCK, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h,
                            ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
        _codes_stored(z0, z1, z2, z3, q_ptr, s_ptr, at, inside, rows, M, BLOCK)
        rows, at, inside = n_rows, n_at, n_inside
        g_rows = g_ptr + rows[:, None, None].to(tl.int64) * stride_g
        t0, t1, t2, t3 = n0, n1, n2, n3


@triton_jit
def _turned_codes_kernel(t_ptr, h_ptr, q_ptr, s_ptr, g_ptr, stride_g, M, K, GROUP: tl.constexpr,
                         BLOCK: tl.constexpr, SPAN: tl.constexpr, GROUPS_P2: tl.constexpr, ROWS: tl.constexpr,
                         DOT_DTYPE: tl.constexpr, GATE_SPAN: tl.constexpr, GATE_FACTOR: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    groups = tl.arange(0, GROUPS_P2)
    # [ROWS, groups, 64]: block a of each group at column g 256 + a 64 + j
    first = groups[None, :, None] * GROUP
    at = rows[:, None, None].to(tl.int64) * K + (first + tl.arange(0, BLOCK)[None, None, :])
    inside = (rows < M)[:, None, None] & (groups < K // GROUP)[None, :, None]
    g_rows = g_ptr + rows[:, None, None].to(tl.int64) * stride_g  # (GATE_SPAN 0: never read)
    hq = tl.arange(0, SPAN)
    h = tl.load(h_ptr + hq[:, None] * SPAN + hq[None, :]).to(DOT_DTYPE)
    z0 = _block_product(_gated_block(tl.load(t_ptr + at, mask=inside, other=0.0), g_rows, first, inside, BLOCK,
                                     GATE_SPAN, GATE_FACTOR), h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    z1 = _block_product(_gated_block(tl.load(t_ptr + at + BLOCK, mask=inside, other=0.0), g_rows, first + BLOCK,
                                     inside, BLOCK, GATE_SPAN, GATE_FACTOR), h, ROWS, GROUPS_P2, BLOCK, SPAN, DOT_DTYPE)
    z2 = _block_product(_gated_block(tl.load(t_ptr + at + 2 * BLOCK, mask=inside, other=0.0), g_rows,
                                     first + 2 * BLOCK, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h, ROWS, GROUPS_P2,
                        BLOCK, SPAN, DOT_DTYPE)
    z3 = _block_product(_gated_block(tl.load(t_ptr + at + 3 * BLOCK, mask=inside, other=0.0), g_rows,
                                     first + 3 * BLOCK, inside, BLOCK, GATE_SPAN, GATE_FACTOR), h, ROWS, GROUPS_P2,
                        BLOCK, SPAN, DOT_DTYPE)
    _codes_stored(z0, z1, z2, z3, q_ptr, s_ptr, at, inside, rows, M, BLOCK)


def quantize_turned(t: torch.Tensor, turned: str | None = "v", out=None, rows: int = 1, num_warps: int = 4,
                    hopper: bool = True, gate: torch.Tensor | None = None, gate_factor: float = 1.0,
                    row_programs: int = 0):
    """Rows t [M, K] bf16 (turned: the digits a producer took, TURNED's key, or None) to (codes int8 [M, K], scales
    f32 [M]) by the math above; out: optional (codes, scales), written fully. rows, num_warps: the launch shape. On
    Hopper, where `hopper` (kernels.Choices.hopper_turned_quant), rows whose v was turned take
    kernels/int8/quant_turned_hopper.py's kernel (H_16 in registers). gate (plain rows only): t times gate_factor *
    sigmoid(gate) first, gate rows [M, n] (kernels/int8/prologue.py). row_programs > 0: that many programs an SM,
    each walking row blocks with the next block's rows read under this one's math (_turned_codes_loop_kernel)."""
    m, k = t.shape
    if t.dtype != torch.bfloat16 or t.stride(-1) != 1 or t.stride(0) != k or not fits(k, GROUP):
        raise ValueError(f"quantize_turned: rows must be contiguous bf16 [M, K], K a multiple of {GROUP} up to "
                         f"{MAX_K}, got {t.dtype} {tuple(t.shape)}")
    if turned is not None and (turned not in TURNED or gate is not None):
        raise ValueError(f"quantize_turned: turned must be one of {list(TURNED)} or None (with a gate), got {turned!r}")
    gate_span = 0 if gate is None else checked_gate(gate, m, k, "quantize_turned")
    codes, scales = out if out is not None else (torch.empty(m, k, dtype=torch.int8, device=t.device),
                                                  torch.empty(m, dtype=torch.float32, device=t.device))
    if m and hopper and turned == "v" and quant_turned_hopper.unusable(t) is None and \
            quant_turned_hopper.launch(t, codes, scales):
        return codes, scales
    if m:
        span = TURN if turned else BLOCK  # (every turn takes d2: the products span d1 and d0)
        g = scales if gate is None else gate  # scales: a pointer never read
        looped = row_programs > 0
        kernel = _turned_codes_loop_kernel if looped else _turned_codes_kernel
        blocks = triton.cdiv(m, rows)
        grid = (min(blocks, row_programs * sm_count(t.device)) if looped else blocks,)
        # bf16 operands on the matrix cores; f32 on the CPU, whose interpreter multiplies bf16 as 16-bit ints
        kernel[grid](
            t, rest_operand(turned, span, t.device), codes, scales, g, g.stride(0), m, k, GROUP=GROUP, BLOCK=BLOCK,
            SPAN=span, GROUPS_P2=triton.next_power_of_2(k // GROUP), ROWS=rows,
            DOT_DTYPE=tl.bfloat16 if t.is_cuda else tl.float32, GATE_SPAN=gate_span, GATE_FACTOR=float(gate_factor),
            num_warps=num_warps, enable_fp_fusion=False)
    return codes, scales


def launched(t: torch.Tensor, group: int, turned: str, codes: torch.Tensor, scales: torch.Tensor,
             hopper: bool = True) -> bool:
    """Whether this file's passes took turned rows t (contiguous bf16 [M, K]) into (codes, scales): hidden rows, and
    v-turned rows too long for quantize_turned, on Hopper by kernels/int8/quant_turned_hopper.py's pass of any
    width (where `hopper`, as quantize_turned's), else rows that fit quantize_turned. False leaves them to
    kernels/int8/quant.py's passes, with rest_operand as the rotation."""
    fit = fits(t.shape[1], group)
    long = turned == "hidden" or not fit
    if t.shape[0] and hopper and long and quant_turned_hopper.unusable(t, turned, long=True) is None and \
            quant_turned_hopper.launch_long(t, codes, scales, turned):
        return True
    if not fit:
        return False
    quantize_turned(t, turned, out=(codes, scales), hopper=hopper)
    return True
