"""A GEMM's last, partial wave of tiles split along K (stream-K's tail), the parts' integer sums added exactly.

Issue 4. T output tiles on P SMs, one tile an SM at a time, take ceil(T / P) tile times; with T = W P + t and
0 < t <= P / 2 the last wave keeps t SMs busy and leaves the others idle: Z-Image's out and down projections at
1024^2 (540 tiles of 128 x 256 on 132 SMs) spend a fifth of their time in that wave. The GEMM's launch runs the W P
whole tiles; a second launch cuts each of the t tail tiles into S parts along K (S <= P / t, each a contiguous run
of K steps), a program a part, so the tail lasts about 1/S of a tile (where K is long enough: MIN_K_STEPS):
  part s of a tail tile:  sums_s = sum over its K steps of q w^T          (int32, stored to its own slot)
  the part counted last:  acc = its sums + the other parts' slots, then the GEMM's epilogue
Integer sums are exact and their order free, so the output equals the unsplit kernel's bit for bit whichever part
arrives last. The parts never wait for each other (no spinning: a part that is not last just ends).

The slots of int32 sums and the counters (one a tail tile) are kept buffers of kernels/int8/arrival_counters.py.
"""
from __future__ import annotations

import torch

from .arrival_counters import counted_last, kept
from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None

MAX_PARTS = 8  # past 8, the last part's reads of the other slots cost more than the shorter parts save
# Splitting pays only for long K: the last part's reads of the other parts' slots and the second launch cost
# about a short tile's time (on the H200 the GEMM gained at 72-80 K steps: Z-Image's w2, Klein's MLP output,
# and lost at 24-30: out, QKV).
MIN_K_STEPS = 64


def split_of(tiles: int, wave: int, k_steps: int, split: bool = True) -> tuple[int, int]:
    """(whole, parts): the first `whole` tiles run whole, each later one in `parts` parts along K; (tiles, 1) where
    there is no tail worth splitting (an exact number of waves, a tail over half a wave, under MIN_K_STEPS) or
    split is off (kernels.Choices.split_tail)."""
    waves, tail = divmod(tiles, wave) if wave > 0 else (0, 0)
    parts = min(wave // tail, MAX_PARTS, max(k_steps // 4, 2)) if tail else 1
    if not split or waves == 0 or tail > wave // 2 or k_steps < max(MIN_K_STEPS, 2) or parts < 2:
        return tiles, 1
    return tiles - tail, parts


def tail_split(m: int, n: int, k: int, tiles: dict, wave: int, absent: torch.Tensor, split: bool = True) -> tuple:
    """(sums, counters, whole, parts, tail programs) for an [m, n] output over k in `tiles`, on `wave` programs at a
    time: the tiles [0, whole) run whole in the GEMM's launch, the rest in a tail launch of `tail programs` programs
    (split_of's split where it finds one and the workspace is there, else every tile whole: absent, a tensor
    standing for the pointers never read, and no tail; split: split_of's)."""
    count = triton.cdiv(m, tiles["BLOCK_M"]) * triton.cdiv(n, tiles["BLOCK_N"])
    whole, parts = split_of(count, wave, triton.cdiv(k, tiles["BLOCK_K"]), split)
    sums = kept(absent.device, wave * tiles["BLOCK_M"] * tiles["BLOCK_N"], zeroed=False) if parts > 1 else None
    counters = kept(absent.device, wave) if parts > 1 else None
    if sums is None or counters is None:
        return absent, absent, count, 1, 0
    return sums, counters, whole, parts, (count - whole) * parts


@triton_jit
def item_of(item, whole, parts, k_steps, BLOCK_K: tl.constexpr):
    """The tail launch's program `item` -> (tile, tail: its index among the split tiles, part, K range [k_lo,
    k_hi))."""
    tail = item // parts
    part = item % parts
    return whole + tail, tail, part, part * k_steps // parts * BLOCK_K, (part + 1) * k_steps // parts * BLOCK_K


@triton_jit
def parts_stored(subtiles, sums_ptr, count_ptr, tail, part, parts, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This part's int32 sums (the tile's column subtiles, a tuple) stored to its slot and counted in: True for the
    part counted last (kernels/int8/arrival_counters.py; it adds the others' slots, others_added, then sets the counter
    back, counter_reset)."""
    for i in tl.static_range(len(subtiles)):
        tl.store(_slot(sums_ptr, tail, part, parts, i, len(subtiles), BLOCK_M, BLOCK_N), subtiles[i])
    return counted_last(count_ptr, tail, parts)


@triton_jit
def others_added(subtile, i, count: tl.constexpr, sums_ptr, tail, part, parts, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Subtile i of `count` plus the other parts' sums of it."""
    for other in range(0, parts):
        if other != part:  # .cg: from L2, where the other SMs' stores are, never a stale L1 line
            subtile += tl.load(_slot(sums_ptr, tail, other, parts, i, count, BLOCK_M, BLOCK_N), cache_modifier=".cg")
    return subtile


@triton_jit
def _slot(sums_ptr, tail, part, parts, i, count: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers to subtile i (of `count` column subtiles, each stored whole) of a part's slot."""
    cols: tl.constexpr = BLOCK_N // count
    base = sums_ptr + ((tail * parts + part).to(tl.int64) * count + i) * (BLOCK_M * cols)
    return base + tl.arange(0, BLOCK_M)[:, None] * cols + tl.arange(0, cols)[None, :]
