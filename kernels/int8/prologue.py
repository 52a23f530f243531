"""Step 1 of the INT8 quantizers (kernels/int8/quant.py, quant_turned.py): the bf16 rows u the rotation takes, made
from the rows a producer left (a residual to norm and modulate, a product to activate, an attention output to gate).

Issue 4; the attention gate issues 36 and 38. For rows x [M, K], in f32 unless a rounding is named, u [M, K] is
rounded once to bf16, because the BF16 block feeds its linears bf16 rows:
   plain        u = bf16(x)
   norm "rms"   n = (x * 1/sqrt(mean(x^2) + eps)) * norm_weight   (the gain optional)
   norm "layer" n = (x - mean(x)) * 1/sqrt(mean((x - mean(x))^2) + eps)   (no affine)
                then, with modulation rows scale/shift [R, K] and row_map [M] (shift optional):
                u = bf16(n * (1 + scale[row_map[m]]) + shift[row_map[m]]); without scale u = bf16(n)
   "swiglu"     x [M, 2K] interleaved (gate j at column 2j, up j at 2j + 1, gluRows):
                u = bf16(silu(gate) * up), silu(a) = a / (1 + exp(-a))
   "gelu_tanh"  u = bf16(x * sigmoid(2c (x + 0.044715 x^3))), c = sqrt(2/pi)  (= 0.5 x (1 + tanh(...)))
   gate         plain rows x and gate rows g [M, n] (n divides K; bf16/f16/f32, rows any stride apart, columns
                contiguous), each gate value over K / n adjacent features, a factor f:
                u[m, c] = bf16(x[m, c] * (f * sigmoid(g[m, c // (K / n)]))),  sigmoid(a) = 1 / (1 + exp(-a))
                Krea 2's attention gate: n = K (QKV's last columns), f = 1; LTX-2.5's per-head gate: n = heads, f = 2
                (linear(x, head_gate)'s f32 rows). Neither the sigmoid nor the gated rows are written out, and u is
                rounded once (torch's bf16 `o * sigmoid(g)` rounds the sigmoid to bf16 first).
"""
from __future__ import annotations

import math

import torch

from ..rounding import round_to_bf16
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: rotation_input still imports
    triton = tl = None

ACTS = {None: 0, "swiglu": 1, "gelu_tanh": 2}


def gated_rows(x: torch.Tensor, gate: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    """The gate's u above in plain torch: bf16 [M, K]."""
    span = x.shape[1] // gate.shape[1]
    return (x.float() * (factor * torch.sigmoid(gate.float())).repeat_interleave(span, 1)).to(torch.bfloat16)


def checked_gate(gate: torch.Tensor, m: int, k: int, op: str) -> int:
    """The features each gate value covers (K / n), or a ValueError naming op and what is wrong."""
    if gate.dim() != 2 or gate.shape[0] != m or not 0 < gate.shape[1] <= k or k % gate.shape[1] \
            or gate.stride(1) != 1 or gate.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{op}: gate must be rows [{m}, n] (n dividing {k}, contiguous columns, bf16/f16/f32), got "
                         f"{gate.dtype} {tuple(gate.shape)}, strides {gate.stride()}")
    return k // gate.shape[1]


def rotation_input(x, *, norm=None, norm_weight=None, eps=1e-6, scale=None, shift=None, row_map=None,
                   act=None, stats=None, gate=None, gate_factor=1.0):
    """The math above in plain torch: the bf16 rows u [M, K] (stats: the norm's row statistics as
    kernels/int8/quant.py quantize_rows takes them)."""
    if gate is not None:
        return gated_rows(x, gate, gate_factor)
    x = x.float()
    if act == "swiglu":
        gate, up = x[:, 0::2], x[:, 1::2]
        return (gate / (1 + torch.exp(-gate)) * up).to(torch.bfloat16)
    if act == "gelu_tanh":
        return (x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x))).to(torch.bfloat16)
    if stats is not None:  # the row statistics as given: (mean, 1/sqrt(.)) of each row
        x = (x - stats[0].float()[:, None]) * stats[1].float()[:, None]
        x = x if norm_weight is None else x * norm_weight.float()
    elif norm == "rms":
        x = x * (1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        x = x if norm_weight is None else x * norm_weight.float()
    elif norm == "layer":
        x = x - x.mean(-1, keepdim=True)
        x = x * (1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    if scale is not None:
        rows = row_map.long()
        x = x * (1 + scale.float()[rows])
        x = x if shift is None else x + shift.float()[rows]
    return x.to(torch.bfloat16)


@triton_jit
def gate_values(g_ptr, at, mask, FACTOR: tl.constexpr):
    """f * sigmoid(g) above (f32), the gate read at g_ptr + at."""
    return FACTOR * tl.sigmoid(tl.load(g_ptr + at, mask=mask, other=0.0).to(tl.float32))


@triton_jit
def rotated_block(x_ptr, stride_x, rows, rmask, rmap, first, mean, inv, w_ptr, scale_ptr, shift_ptr, h, K,
                  g_rows, NORM, HAS_WEIGHT, HAS_SCALE, HAS_SHIFT, ACT, X_BF16, WIDTH, DOT_DTYPE, GATE_SPAN,
                  GATE_FACTOR):
    """u above for the WIDTH columns from `first` (bf16 values u [BLOCK_M, WIDTH], held in f32 or bf16), times
    H_WIDTH on the matrix cores: exact products, f32 sums [BLOCK_M, WIDTH]. GATE_SPAN (0: no gate): the features
    a gate value covers, the gate rows at g_rows [BLOCK_M] (pointers)."""
    cols = first + tl.arange(0, WIDTH)
    m2 = rmask[:, None]
    base = x_ptr + rows[:, None].to(tl.int64) * stride_x
    if ACT == 1:
        # gate j and up j sit side by side: one contiguous load of 2 WIDTH values, split in pairs.
        pairs = tl.load(base + 2 * first + tl.arange(0, 2 * WIDTH)[None, :], mask=m2, other=0.0)
        gate, up = tl.split(tl.reshape(pairs.to(tl.float32), (pairs.shape[0], WIDTH, 2)))
        # exp is approximate on the GPU (ex2.approx), so a correctly rounded division (div.rn: a dozen instructions
        # and a slow-path branch) buys no exactness; `/` lowers to div.full (2 ulp). Both within a bf16 step of torch.
        u = round_to_bf16(gate / (1.0 + tl.exp(-gate)) * up)
    elif NORM == 0 and not HAS_SCALE and ACT == 0 and X_BF16 and GATE_SPAN == 0:
        u = tl.load(base + cols[None, :], mask=m2, other=0.0)  # already bf16: nothing to round
    else:
        u = tl.load(base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
        if GATE_SPAN % WIDTH == 0 and GATE_SPAN > 0:  # a gate value a row over these columns (a head): a vector
            u = u * gate_values(g_rows, first // GATE_SPAN, rmask, GATE_FACTOR)[:, None]
        elif GATE_SPAN:
            u = u * gate_values(g_rows[:, None], (cols // GATE_SPAN)[None, :], m2, GATE_FACTOR)
        if ACT == 2:
            u = u * tl.sigmoid(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))
        if NORM == 2:
            u = u - mean[:, None]
        if NORM != 0:
            u = u * inv[:, None]
            if HAS_WEIGHT:
                u = u * tl.load(w_ptr + cols)[None, :]
        if HAS_SCALE == 2:  # one modulation row (one image): vectors, not a gather per value
            u = u * (1.0 + tl.load(scale_ptr + cols)[None, :])
            if HAS_SHIFT:
                u = u + tl.load(shift_ptr + cols)[None, :]
        elif HAS_SCALE:
            mod = rmap[:, None] * K + cols[None, :]
            u = u * (1.0 + tl.load(scale_ptr + mod, mask=m2, other=0.0))
            if HAS_SHIFT:
                u = u + tl.load(shift_ptr + mod, mask=m2, other=0.0)
        u = round_to_bf16(u)
    return tl.dot(u.to(DOT_DTYPE), h, input_precision="ieee", out_dtype=tl.float32)
