"""Which of the kernels of equal math run: a frozen value given to kernels.run (and to the launchers that take
it), chosen per model (dit_core/gpu/options.py), never a module switch. The defaults are what runs unless told.

Every choice picks between kernels of one math, for speed: their results agree bit for bit or but for the order of
f32 sums (tests/kernels/ says which).
"""
from __future__ import annotations

from dataclasses import dataclass

from .int8.linear_hopper import TILE


@dataclass(frozen=True)
class Choices:
    """hopper_gemm: int8_linear's forms and the fused QKV by kernels/int8/linear_hopper.py where it takes the call
    (else Triton's kernels). hopper_quant: plain hidden rows by kernels/int8/quant_hopper.py's one pass where
    `chosen` (else kernels/int8/quant.py's two passes). hopper_turned_quant: turned rows by
    kernels/int8/quant_turned_hopper.py (else kernels/int8/quant_turned.py's Triton kernel or the passes).
    split_tail: a GEMM's last partial wave of tiles split along K (kernels/int8/split_tail.py; else every tile whole).
    codes_last_first: the codes pass takes its column blocks last first (kernels/int8/codes.py). whole_rows: many
    plain bf16 rows by quant_turned's one pass, whole rows a program (from quant.WHOLE_ROWS_MIN_M rows of up to
    quant.WHOLE_ROWS_MAX_GROUPS groups; else the rotate and codes passes). group_m: the Hopper GEMMs' row tiles
    walking the columns together (the weights read from memory once a group). whole_rows_walking: the whole-rows pass's
    programs an SM walking the row blocks (quant_turned's row_programs; 0: a program a block): 4 by default, LTX-2.5's
    gated OUT rows at stage 2 in 95 us against 160 a program a block (H100, bench_quantizer_shapes.py --gated).
    rows_in_pairs_from: from this many rows, kernels/rows_norm_rope.py's rows walk the heads by rotary pairs (each
    value and angle read once; 16 rows a program; None, never: its blocked kernel): 8192, LTX-2.5's stage 2 graphed
    step 1.8% faster on an H100 (its video rows' calls a third faster), where at stage 1's 3520 rows the step was 5%
    slower. rows_at_once_below: under this many rows, or without rotary at any count, rows_norm_rope takes a row
    a program, its heads in one tile (None: never): 2048, LTX-2.5's audio rows (127) 3.6 times as fast on an H100,
    the prompt's keys (1024) twice, the video's prompt queries 1.3-2 times (no gathers). fa3_attention:
    kernels/attention.py's unmasked bf16 attention by FlashAttention-3's forward where the fa3_fwd package is
    installed and takes the heads (else SDPA; off until a GPU times it). The hopper_ choices take effect only where
    kernels.needs_hopper passes (kernels.run turns them off elsewhere)."""
    hopper_gemm: bool = True
    hopper_quant: bool = True
    hopper_turned_quant: bool = True
    split_tail: bool = True
    codes_last_first: bool = True
    whole_rows: bool = True
    group_m: int = TILE["GROUP_M"]
    whole_rows_walking: int = 4
    rows_in_pairs_from: int | None = 8192
    rows_at_once_below: int | None = 2048
    fa3_attention: bool = False


DEFAULT = Choices()
