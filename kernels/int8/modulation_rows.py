"""The modulation row a block of rows shares, read as one vector instead of gathered value by value.

Kernels that modulate rows by a table [R, N] through row_map [M] (int8_quant's modulated norm, int8_linear's
gated epilogue) gather table[row_map[m], n] per value. Packed sequences keep each modulation row's rows together
(FLUX.3 Klein's joint blocks: 512 text rows, then the image's), so nearly every tile's rows share one row: then one
vector load serves the tile. The per-value gather cost 3.3x the bandwidth of one modulation row in the quantizer
on the H200; it stays for tiles that straddle two rows.
"""
from __future__ import annotations

from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: each kernel file's reference() still imports
    triton = tl = None


@triton_jit
def shared_row(rmap, rmask):
    """The row every valid row of the block maps to (rmap [BLOCK_M] int32 or int64, rows below 2^30; rmask
    [BLOCK_M]), else -1."""
    lo = tl.min(tl.where(rmask, rmap, 1 << 30), axis=0)
    hi = tl.max(tl.where(rmask, rmap, -1), axis=0)
    return tl.where(lo == hi, lo, -1)
