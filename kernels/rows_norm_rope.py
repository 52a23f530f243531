"""One linear's q or k rows: RMS by head or across a row's heads, split-half rotary by shared or per-head angles.

Issue 36; dit_core/block.py head_norm_rotary and dit_core/sequence.py rotate_halves are the host math. LTX-2.5's
attentions (dit_core/gpu/pieces.py) make q, k and v by separate linears, k often from other rows (the prompt's, the
other stream's), norm q and k across all heads (reference/families/ltx25.md section 3) and turn each head by its own
angles (section 4): kernels/head_norm_rope.py's fused [q | k | v] rows, head by head, take none of that. For rows x
[M, heads D] (bf16/f32, rows any stride apart, columns contiguous), an optional gain w and optional cos/sin
[M, r] (every head alike) or [M, heads, r] (each head its own), in f32:
  across (w [heads D]):  n = (x * 1/sqrt(mean(x^2 over the row's heads D values) + eps)) * w
  by head (w [D]):       n = (t * 1/sqrt(mean(t^2 over the head's D values) + eps)) * w     for each head t
  no gain:               n = x (no norm)
  then in each head, with its angles c, s (r = 0 or no cos: no rotary):
  out[j]     = n[j] c[j] - n[j + r] s[j]     j < r
  out[j + r] = n[j + r] c[j] + n[j] s[j]     j < r      (each product rounded, then the sum: no FMA)
  out[j]     = n[j]                          j >= 2r
  one rounding to bf16 at the end. Returned as [M, heads, D] bf16 (rows-major: SDPA's BSHD once transposed).
Angles by axis (index given): where a row's angles depend on it only through its coordinate on each axis (LTX-2.5's
split rotary), cos/sin are tables [T, F] (each axis's distinct coordinates x its frequencies), index [M, A] int32 each
row's table row on each axis, columns (axis, freq) [r] or [heads, r] int32 each angle's axis and frequency:
  c[row, head, j] = cos[index[row, axis[head, j]], freq[head, j]]      (likewise s)
the same values as the full tables, which stage 2 of LTX-2.5 would read at 115 MB each for each call.
"""
from __future__ import annotations

import torch

from .choices import DEFAULT, Choices
from .rounding import rounded_bf16
from .jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None


def by_rows(cos, sin, index, columns):
    """Angles by axis as every row's: cos/sin [M, r] or [M, heads, r] from tables [T, F], index [M, A] and columns
    (axis, freq) [r] or [heads, r]."""
    axis, freq = (c.long() for c in columns)
    at = index.long()[:, axis]  # [M, (heads,) r]: each angle's table row
    return cos[at, freq], sin[at, freq]


def reference(x, heads, head, weight, cos, sin, eps=1e-6, *, across=False, out=None, index=None, columns=None):
    """The math above in plain torch (the host block's operations, in its order): [M, heads, D] bf16."""
    t = x.float().reshape(x.shape[0], heads, head)
    if weight is not None:
        n = t.flatten(1) if across else t
        n = n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        t = n.view_as(t)
    if index is not None:
        cos, sin = by_rows(cos, sin, index, columns)
    if cos is not None and cos.shape[-1]:
        c, s = (a.float() if a.dim() == 3 else a.float()[:, None, :] for a in (cos, sin))
        r = c.shape[-1]
        a, b = t[..., :r], t[..., r:2 * r]
        t = torch.cat([a * c - b * s, b * c + a * s, t[..., 2 * r:]], dim=-1)
    return t.to(torch.bfloat16) if out is None else out.copy_(t)


@triton_jit
def _inverse_rms(squares, n, eps):
    # 1/sqrt(mean + eps) of sums of squares over n values, each step correctly rounded
    return tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(squares, n * 1.0) + eps))


@triton_jit
def _gained_turned_stored(x, xp, row, head, mask, head_mask, cols, partner, w_ptr, cos_ptr, sin_ptr, stride_cm,
                          stride_ch, out_ptr, HEADS, R, index_ptr, stride_i, axis_ptr, freq_ptr, NORM: tl.constexpr,
                          D: tl.constexpr, BY_AXIS: tl.constexpr):
    # A tile of normed values x and their rotary partners xp (columns `partner`: j +- r) at rows `row` of heads `head`
    # (one of them a scalar, the other a column of the tile's first axis): the gain, the rotary by the row's angles
    # (stride_cm: the tables' row stride; stride_ch: the columns' head stride, 0 where the heads share them), one
    # rounding, the store.
    # head_mask: the mask of what depends on the head and column alone (the gain, the angles' axis and frequency).
    turned = cols < 2 * R
    if NORM != 0:
        gain = w_ptr
        if NORM == 2:  # across: the head's slice of the row's gain
            gain = w_ptr + head * D
        x = x * tl.load(gain + cols[None, :], mask=head_mask, other=0.0)
        xp = xp * tl.load(gain + partner[None, :], mask=head_mask, other=0.0)
    amask = mask & turned[None, :]
    column = head * stride_ch + tl.where(cols < R, cols, cols - R)[None, :]
    if BY_AXIS:
        axis = tl.load(axis_ptr + column, mask=head_mask & turned[None, :], other=0)
        freq = tl.load(freq_ptr + column, mask=head_mask & turned[None, :], other=0)
        at = tl.load(index_ptr + row * stride_i + axis, mask=amask, other=0)
        slots = at.to(tl.int64) * stride_cm + freq
    else:
        slots = row * stride_cm + column
    c = tl.load(cos_ptr + slots, mask=amask, other=1.0)
    s = tl.load(sin_ptr + slots, mask=amask, other=0.0)
    x = tl.where((cols < R)[None, :], x * c - xp * s, tl.where(turned[None, :], x * c + xp * s, x))
    tl.store(out_ptr + (row * HEADS + head) * D + cols[None, :], rounded_bf16(x), mask=mask)


@triton_jit
def _rows_norm_rope_kernel(x_ptr, stride_x, w_ptr, cos_ptr, sin_ptr, stride_cm, stride_ch, out_ptr, M, HEADS, R, eps,
                           index_ptr, stride_i, axis_ptr, freq_ptr,
                           NORM: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                           BY_AXIS: tl.constexpr, ROW_AT_ONCE: tl.constexpr, BLOCK_H: tl.constexpr):
    # Grid (row blocks,): a program takes BLOCK_M rows through every head. NORM 2 (across) first walks the heads
    # for each row's sum of squares, then head by head: norm, rotary, store. Each value's rotary partner (j +- r) is
    # a second load of the same row, which the first one brought into L1. ROW_AT_ONCE: a program takes one row, all
    # its heads in one [BLOCK_H, BLOCK_D] tile (every load of the row issued at once, the sum from registers).
    cols = tl.arange(0, BLOCK_D)
    partner = tl.where(cols < R, cols + R, tl.where(cols < 2 * R, cols - R, cols))
    if ROW_AT_ONCE:
        row = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, BLOCK_H)[:, None]
        mask = (heads < HEADS) & (cols < D)[None, :]
        src = x_ptr + row * stride_x + heads * D
        x = tl.load(src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        if NORM == 2:
            inv = _inverse_rms(tl.sum(tl.sum(x * x, axis=1), axis=0), HEADS * D, eps)
            x, xp = x * inv, xp * inv
        if NORM == 1:
            inv = _inverse_rms(tl.sum(x * x, axis=1), D, eps)[:, None]
            x, xp = x * inv, xp * inv
        _gained_turned_stored(x, xp, row, heads, mask, mask, cols, partner, w_ptr, cos_ptr, sin_ptr, stride_cm,
                              stride_ch, out_ptr, HEADS, R, index_ptr, stride_i, axis_ptr, freq_ptr, NORM, D, BY_AXIS)
    else:
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
        mask = (rows < M) & (cols < D)[None, :]
        base = x_ptr + rows * stride_x
        if NORM == 2:
            squares = tl.zeros([BLOCK_M], dtype=tl.float32)
            for head in tl.range(0, HEADS):
                x = tl.load(base + head * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                squares += tl.sum(x * x, axis=1)
            inv = _inverse_rms(squares, HEADS * D, eps)[:, None]
        for head in tl.range(0, HEADS):
            src = base + head * D
            x = tl.load(src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            xp = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32)
            if NORM == 1:  # by head: this head's own statistics
                inv = _inverse_rms(tl.sum(x * x, axis=1), D, eps)
                inv = inv[:, None]
            if NORM != 0:
                x, xp = x * inv, xp * inv
            _gained_turned_stored(x, xp, rows, head, mask, (cols < D)[None, :], cols, partner, w_ptr, cos_ptr,
                                  sin_ptr, stride_cm, stride_ch, out_ptr, HEADS, R, index_ptr, stride_i, axis_ptr,
                                  freq_ptr, NORM, D, BY_AXIS)


@triton_jit
def _pairs_turned_stored(a, b, rows, rmask, head, j, jmask, inv, w_ptr, cos_ptr, sin_ptr, stride_cm, stride_ch,
                         out_ptr, HEADS, R, i0, i1, i2, i3, axis_ptr, freq_ptr, NORM: tl.constexpr, D: tl.constexpr,
                         BY_AXIS: tl.constexpr):
    # A head's rotary pairs (a: columns j < R, b: j + R) of rows `rows`: the norm's 1/sqrt, the gain, one angle's cos
    # and sin for both, one rounding each, the stores.
    mask = rmask[:, None] & jmask[None, :]
    if NORM != 0:
        gain = w_ptr
        if NORM == 2:  # across: the head's slice of the row's gain
            gain = w_ptr + head * D
        a = (a * inv) * tl.load(gain + j, mask=jmask, other=0.0)[None, :]
        b = (b * inv) * tl.load(gain + R + j, mask=jmask, other=0.0)[None, :]
    column = head * stride_ch + j
    if BY_AXIS:  # the row's table row on each column's axis: its index vectors, no gather
        axis = tl.load(axis_ptr + column, mask=jmask, other=0)[None, :]
        freq = tl.load(freq_ptr + column, mask=jmask, other=0)[None, :]
        at = tl.where(axis == 0, i0[:, None], tl.where(axis == 1, i1[:, None],
                                                       tl.where(axis == 2, i2[:, None], i3[:, None])))
        slots = at.to(tl.int64) * stride_cm + freq
    else:
        slots = rows[:, None] * stride_cm + column[None, :]
    c = tl.load(cos_ptr + slots, mask=mask, other=1.0)
    s = tl.load(sin_ptr + slots, mask=mask, other=0.0)
    dest = out_ptr + (rows[:, None] * HEADS + head) * D + j[None, :]
    tl.store(dest, rounded_bf16(a * c - b * s), mask=mask)
    tl.store(dest + R, rounded_bf16(b * c + a * s), mask=mask)


@triton_jit
def _tail_values(x_ptr, stride_x, rows, rmask, head, R, D: tl.constexpr, BLOCK_T: tl.constexpr):
    # A head's columns past the pairs (2R..D), f32, and their mask
    t = 2 * R + tl.arange(0, BLOCK_T)
    mask = rmask[:, None] & (t < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + head * D + t[None, :], mask=mask, other=0.0)
    return x.to(tl.float32), t, mask


@triton_jit
def _tail_squares(x_ptr, stride_x, rows, rmask, head, R, D: tl.constexpr, BLOCK_T: tl.constexpr):
    x, _, _ = _tail_values(x_ptr, stride_x, rows, rmask, head, R, D, BLOCK_T)
    return tl.sum(x * x, axis=1)


@triton_jit
def _tail_stored(x_ptr, stride_x, rows, rmask, head, inv, w_ptr, out_ptr, HEADS, R, NORM: tl.constexpr,
                 D: tl.constexpr, BLOCK_T: tl.constexpr):
    # A head's columns past the pairs (2R..D): normed, gained, rounded, stored
    x, t, mask = _tail_values(x_ptr, stride_x, rows, rmask, head, R, D, BLOCK_T)
    if NORM != 0:
        gain = w_ptr
        if NORM == 2:  # across: the head's slice of the row's gain
            gain = w_ptr + head * D
        x = (x * inv) * tl.load(gain + t, mask=t < D, other=0.0)[None, :]
    tl.store(out_ptr + (rows[:, None] * HEADS + head) * D + t[None, :], rounded_bf16(x), mask=mask)


@triton_jit
def _pairs_kernel(x_ptr, stride_x, w_ptr, cos_ptr, sin_ptr, stride_cm, stride_ch, out_ptr, M, HEADS, R, eps,
                  index_ptr, stride_i, axis_ptr, freq_ptr, NORM: tl.constexpr, D: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, AXES: tl.constexpr):
    # Grid (row blocks,): a program takes BLOCK_M rows through every head by rotary pairs: each value loaded once,
    # each angle's cos and sin once for its pair (the blocked kernel loads a value's partner again and an angle for
    # each of the two). NORM 2 (across) first walks the heads for each row's sum of squares. Angles by axis: the
    # rows' indexes on up to 4 axes read as vectors once.
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    j = tl.arange(0, BLOCK_R)
    jmask = j < R
    mask = rmask[:, None] & jmask[None, :]
    base = x_ptr + rows[:, None] * stride_x + j[None, :]
    i0 = tl.zeros([BLOCK_M], dtype=tl.int32)
    i1, i2, i3 = i0, i0, i0
    if AXES > 0:
        i0 = tl.load(index_ptr + rows * stride_i, mask=rmask, other=0)
    if AXES > 1:
        i1 = tl.load(index_ptr + rows * stride_i + 1, mask=rmask, other=0)
    if AXES > 2:
        i2 = tl.load(index_ptr + rows * stride_i + 2, mask=rmask, other=0)
    if AXES > 3:
        i3 = tl.load(index_ptr + rows * stride_i + 3, mask=rmask, other=0)
    inv = tl.zeros([BLOCK_M, 1], dtype=tl.float32) + 1.0
    if NORM == 2:
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for head in tl.range(0, HEADS):
            a = tl.load(base + head * D, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(base + head * D + R, mask=mask, other=0.0).to(tl.float32)
            squares += tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)
            if BLOCK_T:
                squares += _tail_squares(x_ptr, stride_x, rows, rmask, head, R, D, BLOCK_T)
        inv = _inverse_rms(squares, HEADS * D, eps)[:, None]
    for head in tl.range(0, HEADS):
        a = tl.load(base + head * D, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(base + head * D + R, mask=mask, other=0.0).to(tl.float32)
        if NORM == 1:  # by head: this head's own statistics
            squares = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)
            if BLOCK_T:
                squares += _tail_squares(x_ptr, stride_x, rows, rmask, head, R, D, BLOCK_T)
            inv = _inverse_rms(squares, D, eps)[:, None]
        _pairs_turned_stored(a, b, rows, rmask, head, j, jmask, inv, w_ptr, cos_ptr, sin_ptr, stride_cm, stride_ch,
                             out_ptr, HEADS, R, i0, i1, i2, i3, axis_ptr, freq_ptr, NORM, D, AXES > 0)
        if BLOCK_T:
            _tail_stored(x_ptr, stride_x, rows, rmask, head, inv, w_ptr, out_ptr, HEADS, R, NORM, D, BLOCK_T)


def rows_norm_rope(x, heads, head, weight, cos, sin, eps=1e-6, *, across=False, out=None, index=None, columns=None,
                   block_m=None, num_warps=None, row_at_once=False, choices: Choices = DEFAULT):
    """[M, heads, head] bf16 from rows x [M, heads head] by the math in this file's docstring (weight None: no norm;
    cos/sin None: no rotary). across: the norm over a row's heads (weight [heads head]), else by head (weight
    [head]). out: an optional contiguous [M, heads, head] bf16 buffer. index, columns: cos/sin are angles by axis
    (tables [T, F], index [M, A] int32, columns (axis, freq) [r] or [heads, r] int32). block_m, num_warps: the
    launch; by default 16 rows on 4 warps, by axis a row on one warp (LTX-2.5's stage-1 video rows 11-14% faster so
    than 4 rows on 2 warps on an H100: tests/kernels/bench_rows_norm_rope.py). row_at_once: a program a row, its
    heads in one tile (by default a warp for each 512 values of a row, 2 to 16, a power of 2), where block_m rows
    walk the heads one by one. From choices.rows_in_pairs_from rows (kernels/choices.py): block_m rows walk the heads
    by rotary pairs (_pairs_kernel; 16 rows on 4 warps by default; angles by axis of up to 4 axes), not row_at_once;
    under choices.rows_at_once_below rows, or without rotary at any count: row_at_once."""
    m, d = x.shape[0], head
    if x.dim() != 2 or x.shape[1] != heads * d or x.stride(-1) != 1:
        raise ValueError(f"rows_norm_rope: x must be rows [M, {heads} heads x {d}] with contiguous columns, got "
                         f"{tuple(x.shape)}")
    if weight is not None and weight.numel() != (heads * d if across else d):
        raise ValueError(f"rows_norm_rope: the gain must have {heads * d if across else d} values "
                         f"({'across heads' if across else 'by head'}), got {weight.numel()}")
    by_axis = index is not None
    pairs_from, at_once_below = choices.rows_in_pairs_from, choices.rows_at_once_below
    row_at_once = row_at_once or (at_once_below is not None and (m < at_once_below or cos is None))
    pairs = pairs_from is not None and m >= pairs_from and not row_at_once and (not by_axis or index.shape[1] <= 4)
    block_m = 1 if row_at_once else block_m or (1 if by_axis and not pairs else 16)
    at_once_warps = min(triton.next_power_of_2(max(heads * d // 512, 2)), 16)
    num_warps = num_warps or (at_once_warps if row_at_once else 1 if by_axis and not pairs else 4)
    if by_axis:
        axis, freq = columns
        r = axis.shape[-1]
        if (cos.dim() != 2 or sin.shape != cos.shape or index.dim() != 2 or index.shape[0] != m
                or axis.shape not in ((r,), (heads, r)) or freq.shape != axis.shape or 2 * r > d):
            raise ValueError(f"rows_norm_rope: angles by axis must be tables [T, F], index [{m}, A] and columns [r] "
                             f"or [{heads}, r] with 2r <= {d}, got {tuple(cos.shape)}, {tuple(index.shape)}, "
                             f"{tuple(axis.shape)}")
    else:
        r = 0 if cos is None else cos.shape[-1]
        if cos is not None and (cos.shape not in ((m, r), (m, heads, r)) or sin.shape != cos.shape or 2 * r > d):
            raise ValueError(f"rows_norm_rope: cos/sin must be [{m}, r] or [{m}, {heads}, r] with 2r <= {d}, got "
                             f"{tuple(cos.shape)}")
    if out is None:
        out = torch.empty(m, heads, d, dtype=torch.bfloat16, device=x.device)
    if out.shape != (m, heads, d) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"rows_norm_rope: out must be contiguous bf16 [{m}, {heads}, {d}]")
    if m == 0:
        return out
    cos, sin = (out if t is None else t.float().contiguous() for t in (cos, sin))  # out: never read without rotary
    weight = out if weight is None else weight.float().contiguous()  # (never read without a norm)
    if by_axis:
        index, axis, freq = (t.to(torch.int32).contiguous() for t in (index, axis, freq))
        stride_cm, stride_ch = cos.stride(0), r if axis.dim() == 2 else 0
    else:
        index, axis, freq = out, out, out  # (never read)
        per_head = r and cos.dim() == 3  # shared angles: every head reads the row's
        stride_cm, stride_ch = cos.stride(0) if r else 0, cos.stride(1) if per_head else 0
    if pairs:
        _pairs_kernel[(triton.cdiv(m, block_m),)](
            x, x.stride(0), weight, cos, sin, stride_cm, stride_ch, out, m, heads, r, eps, index,
            index.stride(0) if by_axis else 0, axis, freq, NORM=0 if weight is out else 2 if across else 1, D=d,
            BLOCK_R=triton.next_power_of_2(max(r, 1)), BLOCK_T=0 if 2 * r == d else triton.next_power_of_2(d - 2 * r),
            BLOCK_M=block_m, AXES=index.shape[1] if by_axis else 0, num_warps=num_warps, enable_fp_fusion=False)
        return out
    _rows_norm_rope_kernel[(triton.cdiv(m, block_m),)](
        x, x.stride(0), weight, cos, sin, stride_cm, stride_ch, out, m, heads, r, eps, index,
        index.stride(0) if by_axis else 0, axis, freq, NORM=0 if weight is out else 2 if across else 1, D=d,
        BLOCK_D=triton.next_power_of_2(d), BLOCK_M=block_m, BY_AXIS=by_axis, ROW_AT_ONCE=row_at_once,
        BLOCK_H=triton.next_power_of_2(heads) if row_at_once else 1, num_warps=num_warps, enable_fp_fusion=False)
    return out
