"""The engine switches a step benchmark times as extra rows: the same graphed INT8 run with one switch set."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-chunk", type=int, default=0, help="also ours INT8 graphed with the MLP in chunks "
                        "of this many rows (dit_core.block_gpu.CHUNK; 0: not)")
    parser.add_argument("--variant-serial-modes", action="store_true", help="also ours INT8 graphed with FLUX.3's "
                        "mode blocks one after another on one stream (flux3_klein.MODES_CONCURRENT off)")
    parser.add_argument("--variant-tiles", action="store_true", help="also ours INT8 graphed at each of the Hopper "
                        "tiles of TILE_VARIANTS (kernels.int8_tiles.HOPPER_TILES with some forms' tiles replaced)")
    parser.add_argument("--variant-whole-tiles", action="store_true", help="also ours INT8 graphed with every GEMM "
                        "tile whole (kernels.split_tail.ENABLED off: no tail split)")


def tile_variants() -> dict:
    """Hopper tile sets worth a step's time beside the fixed ones: the bf16 rows stored by TMA (TMA 2: fewer stages
    fit beside the store's buffer), the fused QKV's rotary tables and rows by TMA (TMA 2), a program a tile or
    persistent (fits at 3 stages a head at a time)."""
    from kernels.int8_tiles import HOPPER_TILES, config
    stores_128 = {0: config(128, 256, 128, 8, 3, tma=2, persistent=True, subtile=2),
                  2: config(128, 256, 128, 8, 3, tma=2, persistent=True)}
    stores_64 = {0: config(128, 256, 64, 8, 3, tma=2, persistent=True),
                 2: config(128, 256, 64, 8, 6, tma=2, persistent=True)}
    qkv = {"qkv_rope": config(128, 256, 128, 8, 3, tma=2, persistent=True, subtile=2)}
    qkv_tma = {"qkv_rope": config(128, 256, 128, 8, 4, tma=2)}
    return {name: {**HOPPER_TILES, **tiles} for name, tiles in (
        ("bf16 rows stored by TMA (K 128, 3 stages)", stores_128), ("bf16 rows stored by TMA (K 64)", stores_64),
        ("QKV persistent (3 stages, a head at a time)", qkv), ("QKV's tables and rows by TMA", qkv_tma))}


def variants(args) -> list:
    """(name, module, attribute, value) of each asked variant."""
    from dit_core import block_gpu
    from dit_core.families import flux3_klein
    from kernels import int8_tiles, split_tail
    return [(f"MLP chunks of {args.variant_chunk} rows", block_gpu, "CHUNK", args.variant_chunk)] * bool(
        args.variant_chunk) + [("whole tiles", split_tail, "ENABLED", False)] * args.variant_whole_tiles + [
        ("mode blocks on one stream", flux3_klein, "MODES_CONCURRENT", False)] * args.variant_serial_modes + [
        (name, int8_tiles, "HOPPER_TILES", tiles) for name, tiles in tile_variants().items()] * args.variant_tiles
