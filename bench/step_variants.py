"""The engine switches a step benchmark times as extra rows: the same graphed INT8 run with one switch set."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-chunk", type=int, default=0, help="also ours INT8 graphed with the MLP in chunks "
                        "of this many rows (dit_core.gpu.block.CHUNK; 0: not)")
    parser.add_argument("--variant-serial-modes", action="store_true", help="also ours INT8 graphed with FLUX.3's "
                        "mode blocks one after another on one stream (flux3_klein.MODES_CONCURRENT off)")
    parser.add_argument("--variant-whole-tiles", action="store_true", help="also ours INT8 graphed with every GEMM "
                        "tile whole (kernels.split_tail.ENABLED off: no tail split)")
    parser.add_argument("--variant-triton-gemm", action="store_true", help="also ours INT8 graphed with the Triton "
                        "GEMMs where the Hopper ones run (kernels.int8_linear_hopper.ENABLED off)")
    parser.add_argument("--variant-codes-first-first", action="store_true", help="also ours INT8 graphed with the "
                        "codes pass taking its column blocks first to last (kernels.int8_codes.LAST_FIRST off)")
    parser.add_argument("--variant-uncarried", action="store_true", help="also ours INT8 graphed with FLUX.3's "
                        "blocks making their norm statistics by a pass of their own (flux3_klein's NormStats "
                        "carry off)")
    parser.add_argument("--variant-two-pass-quant", action="store_true", help="also ours INT8 graphed with plain "
                        "rows quantized by the Triton passes where the Hopper one-pass kernel runs "
                        "(kernels.int8_quant_hopper.ENABLED off)")
    parser.add_argument("--variant-unturned-v", action="store_true", help="also ours INT8 graphed with v not "
                        "turned in the QKV, OUT's rows quantized as plain rows (dit_core.gpu.block.TURN_V off)")
    parser.add_argument("--variant-unturned-hidden", action="store_true", help="also ours INT8 graphed with UP's "
                        "SwiGLU rows not turned, DOWN's rows quantized as plain rows (dit_core.gpu.block.TURN_HIDDEN "
                        "off)")
    parser.add_argument("--variant-int8-attention", action="store_true", help="also ours INT8 graphed with every "
                        "family's attention scores on the INT8 matrix cores (dit_core.gpu.block.INT8_ATTENTION)")
    parser.add_argument("--variant-cudnn-attention", action="store_true", help="also ours INT8 graphed with every "
                        "family's attention by cuDNN's bf16 SDPA (dit_core.gpu.block.INT8_ATTENTION empty)")
    parser.add_argument("--variant-group-m", type=int, nargs="*", default=[], help="also ours INT8 graphed with the "
                        "Hopper GEMMs walking the columns with this many row tiles together (int8_linear_hopper's "
                        "GROUP_M: the weights read from memory once a group)")


class _Uncarried:
    """block_gpu.NormStats' stand-in: no statistics carried between blocks."""

    @staticmethod
    def of(x):
        return None


def variants(args) -> list:
    """(name, module, attribute, value) of each asked variant."""
    from dit_core.gpu import block as block_gpu
    from dit_core.families import FAMILIES, flux3_klein
    from kernels import int8_codes, int8_linear_hopper, int8_quant_hopper, split_tail
    return [(f"MLP chunks of {args.variant_chunk} rows", block_gpu, "CHUNK", args.variant_chunk)] * bool(
        args.variant_chunk) + [("whole tiles", split_tail, "ENABLED", False)] * args.variant_whole_tiles + [
        ("mode blocks on one stream", flux3_klein, "MODES_CONCURRENT", False)] * args.variant_serial_modes + [
        ("Triton GEMMs", int8_linear_hopper, "ENABLED", False)] * args.variant_triton_gemm + [
        ("norm statistics uncarried", flux3_klein, "NormStats", _Uncarried)] * args.variant_uncarried + [
        ("codes first columns first", int8_codes, "LAST_FIRST", False)] * args.variant_codes_first_first + [
        ("plain rows by the Triton passes", int8_quant_hopper, "ENABLED", False)] * args.variant_two_pass_quant + [
        ("v not turned", block_gpu, "TURN_V", False)] * args.variant_unturned_v + [
        ("hidden rows not turned", block_gpu, "TURN_HIDDEN", False)] * args.variant_unturned_hidden + [
        ("attention INT8 scores", block_gpu, "INT8_ATTENTION", set(FAMILIES))] * args.variant_int8_attention + [
        ("attention cuDNN bf16", block_gpu, "INT8_ATTENTION", set())] * args.variant_cudnn_attention + [
        (f"Hopper GEMMs' GROUP_M {g}", int8_linear_hopper, "TILE", {**int8_linear_hopper.TILE, "GROUP_M": g})
        for g in args.variant_group_m]
