"""Row statistics of a norm: what kernels/int8/quant.py's fused modulated norm needs before it rotates a row.

Issue 4. For rows x [M, K] (any float dtype, contiguous columns), in f32 (sums in f32, order unspecified; the
divisions and the square root correctly rounded):
  "rms"    mean = 0,          inv = 1/sqrt(sum(x^2) / K + eps)
  "layer"  mean = sum(x) / K, inv = 1/sqrt(sum((x - mean)^2) / K + eps)   (two passes: no cancellation)
written as stats [2, M] = (mean, inv). kernels/gated_residual.py's next_rms computes the RMS ones while it writes
the rows, which saves this launch. So does the Hopper gated product (kernels/int8/hopper_epilogues.py) for either
norm, by parts: for each run p of W columns (W = K / P) it writes
  parts[0, p, m] = s_p = sum(x[m, p W .. p W + W - 1]),   parts[1, p, m] = c_p = sum((x - s_p / W)^2) over that run
and stats_of_parts combines the P parts of each row in a fixed order (no cancellation: every term is a square):
  "layer"  mean = sum_p s_p / K,  inv = 1/sqrt(sum_p (c_p + W (s_p / W - mean)^2) / K + eps)
  "rms"    mean = 0,              inv = 1/sqrt(sum_p (c_p + W (s_p / W)^2) / K + eps)
equal to the two-pass statistics in exact arithmetic, within a few f32 ulps of them here.
"""
from __future__ import annotations

import torch

from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: reference() still imports (kernels/__init__.py falls back to it)
    triton = tl = None

NORMS = {None: 0, "rms": 1, "layer": 2}


def reference(x, norm, eps=1e-6):
    """The math above in plain torch: stats [2, M] f32."""
    x = x.float()
    mean = x.mean(-1) if norm == "layer" else torch.zeros(x.shape[0], device=x.device)
    inv = 1 / torch.sqrt((x - mean[:, None]).pow(2).mean(-1) + eps)
    return torch.stack([mean, inv])


def parts_reference(x, width: int) -> torch.Tensor:
    """The parts [2, K / width, M] f32 of rows x [M, K] (the math above; what the Hopper gated product writes)."""
    runs = x.float().reshape(x.shape[0], -1, width)
    sums = runs.sum(-1)
    return torch.stack([sums, (runs - (sums / width)[..., None]).pow(2).sum(-1)]).transpose(1, 2).contiguous()


def stats_of_parts_reference(parts, norm, eps=1e-6, width: int = 64):
    """stats_of_parts' math in plain torch (f32): stats [2, M] of the parts [2, P, M] of runs of `width`."""
    sums, centred = parts.float().unbind(0)
    k = sums.shape[0] * width
    mean = sums.sum(0) / k if norm == "layer" else torch.zeros_like(sums[0])
    return torch.stack([mean, 1 / torch.sqrt((centred + width * (sums / width - mean).pow(2)).sum(0) / k + eps)])


@triton_jit
def _row_stats_kernel(x_ptr, stride_x, stats_ptr, stride_stats, M, K, eps, NORM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, WHOLE_ROWS: tl.constexpr):
    # The statistics of BLOCK_M rows: mean (layer norm; 0 for RMS) to stats[0], 1/sqrt(.) to stats[1].
    # WHOLE_ROWS (BLOCK_K >= K): the rows are loaded once and stay in registers for the layer norm's second pass;
    # else the columns are walked BLOCK_K at a time (twice for the layer norm).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    kcols = tl.arange(0, BLOCK_K)
    base = x_ptr + rows[:, None].to(tl.int64) * stride_x
    if WHOLE_ROWS:
        cmask = rmask[:, None] & (kcols < K)[None, :]
        v = tl.load(base + kcols[None, :], mask=cmask, other=0.0).to(tl.float32)
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        if NORM == 2:
            mean = tl.math.div_rn(tl.sum(v, axis=1), K * 1.0)
            v = tl.where(cmask, v - mean[:, None], 0.0)
        squares = tl.sum(v * v, axis=1)
    else:
        total = tl.zeros([BLOCK_M], dtype=tl.float32)
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for c0 in range(0, K, BLOCK_K):
            cmask = rmask[:, None] & (c0 + kcols < K)[None, :]
            v = tl.load(base + c0 + kcols[None, :], mask=cmask, other=0.0).to(tl.float32)
            total += tl.sum(v, axis=1)
            squares += tl.sum(v * v, axis=1)
        mean = tl.math.div_rn(total, K * 1.0) if NORM == 2 else tl.zeros([BLOCK_M], dtype=tl.float32)
        if NORM == 2:
            squares = tl.zeros([BLOCK_M], dtype=tl.float32)
            for c0 in range(0, K, BLOCK_K):
                cmask = rmask[:, None] & (c0 + kcols < K)[None, :]
                v = tl.load(base + c0 + kcols[None, :], mask=cmask, other=0.0).to(tl.float32)
                v = tl.where(cmask, v - mean[:, None], 0.0)
                squares += tl.sum(v * v, axis=1)
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(squares, K * 1.0) + eps))
    tl.store(stats_ptr + rows, mean, mask=rmask)
    tl.store(stats_ptr + stride_stats + rows, inv, mask=rmask)


# Rows of up to half this many values (padded to a power of two) are held whole in registers, this many values a
# program (64 a thread at 8 warps): Z-Image's 3840 and FLUX.3's 3072 take 4 rows a program, 1152 programs at 4608.
WHOLE_ROW_VALUES = 16384


def launch_shape(k: int) -> dict:
    """The default launch for rows of k values: whole rows in registers where they fit, else 64 rows walking the
    columns 256 at a time. Whole rows were the fastest on the H200 at Z-Image's and FLUX.3's widths, ahead of
    programs walking 16 or 64 rows."""
    width = triton.next_power_of_2(k)
    if width <= WHOLE_ROW_VALUES // 2:
        return {"block_m": min(64, WHOLE_ROW_VALUES // width), "block_k": width, "num_warps": 8}
    return {"block_m": 64, "block_k": 256, "num_warps": 4}


def row_stats(x, norm, eps=1e-6, *, out=None, block_m=None, block_k=None, num_warps=None):
    """stats [2, M] f32 of rows x [M, K] by the math above; out: an [2, M] f32 buffer with contiguous rows,
    written fully. block_m, block_k, num_warps: the launch (tests, bench_int8_linear.py's sweep), by default
    launch_shape(K)'s; block_k >= K holds whole rows."""
    if norm not in ("rms", "layer"):
        raise ValueError(f"row_stats: norm must be 'rms' or 'layer', got {norm!r}")
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"row_stats: x must be rows [M, K], contiguous columns, got {tuple(x.shape)}")
    m, k = x.shape
    stats = out if out is not None else torch.empty(2, m, dtype=torch.float32, device=x.device)
    if stats.shape != (2, m) or stats.dtype != torch.float32 or stats.stride(1) != 1:
        raise ValueError(f"row_stats: out must be f32 [2, {m}] with contiguous rows")
    shape = {**launch_shape(k), **{name: v for name, v in (("block_m", block_m), ("block_k", block_k),
                                                            ("num_warps", num_warps)) if v is not None}}
    if m:
        _row_stats_kernel[(triton.cdiv(m, shape["block_m"]),)](
            x, x.stride(0), stats, stats.stride(0), m, k, eps, NORM=NORMS[norm], BLOCK_M=shape["block_m"],
            BLOCK_K=shape["block_k"], WHOLE_ROWS=shape["block_k"] >= k, num_warps=shape["num_warps"],
            enable_fp_fusion=False)
    return stats


@triton_jit
def _parts_kernel(parts_ptr, stats_ptr, stride_stats, M, P, eps, WIDTH: tl.constexpr, NORM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr):
    # BLOCK_M rows' P parts at once (P <= BLOCK_P), combined as the math above.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    p = tl.arange(0, BLOCK_P)
    inside = (rows < M)[:, None] & (p < P)[None, :]
    at = p[None, :] * M + rows[:, None]
    sums = tl.load(parts_ptr + at, mask=inside, other=0.0)
    centred = tl.load(parts_ptr + P * M + at, mask=inside, other=0.0)
    k = P * WIDTH * 1.0
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM == 2:
        mean = tl.math.div_rn(tl.sum(sums, axis=1), k)
    dev = tl.math.div_rn(sums, WIDTH * 1.0) - mean[:, None]
    squares = tl.sum(tl.where(inside, centred + WIDTH * (dev * dev), 0.0), axis=1)
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(squares, k) + eps))
    tl.store(stats_ptr + rows, mean, mask=rows < M)
    tl.store(stats_ptr + stride_stats + rows, inv, mask=rows < M)


def stats_of_parts(parts, norm, eps=1e-6, *, out, width: int = 64):
    """The norm's stats [2, M] (into out: f32 with contiguous rows) from the parts [2, P, M] f32 of runs of `width`
    columns, by the math above."""
    if norm not in ("rms", "layer"):
        raise ValueError(f"stats_of_parts: norm must be 'rms' or 'layer', got {norm!r}")
    _, p, m = parts.shape
    if parts.dtype != torch.float32 or not parts.is_contiguous() or out.shape != (2, m) or out.stride(1) != 1:
        raise ValueError(f"stats_of_parts: parts must be contiguous f32 [2, P, M] and out f32 [2, {m}]")
    if m:
        block_p = triton.next_power_of_2(p)
        block_m = max(1, min(64, 4096 // block_p))
        _parts_kernel[(triton.cdiv(m, block_m),)](parts, out, out.stride(0), m, p, eps, WIDTH=width,
                                                  NORM=NORMS[norm], BLOCK_M=block_m, BLOCK_P=block_p, num_warps=4,
                                                  enable_fp_fusion=False)
    return out
