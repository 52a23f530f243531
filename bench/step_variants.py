"""The engine's options a step benchmark times as extra rows: the same graphed INT8 run with one option changed from
the recipe's defaults (dit_core/gpu/options.py, kernels/choices.py), the model given that value."""
from __future__ import annotations

import argparse
from dataclasses import replace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-chunk", type=int, default=0, help="also ours INT8 graphed with the MLP in chunks "
                        "of this many rows (Options.mlp_chunk; 0: not)")
    parser.add_argument("--variant-serial-modes", action="store_true", help="also ours INT8 graphed with FLUX.3's "
                        "mode blocks one after another on one stream (Options.concurrent_modes off)")
    parser.add_argument("--variant-whole-tiles", action="store_true", help="also ours INT8 graphed with every GEMM "
                        "tile whole (Choices.split_tail off)")
    parser.add_argument("--variant-triton-gemm", action="store_true", help="also ours INT8 graphed with the Triton "
                        "GEMMs where the Hopper ones run (Choices.hopper_gemm off)")
    parser.add_argument("--variant-codes-first-first", action="store_true", help="also ours INT8 graphed with the "
                        "codes pass taking its column blocks first to last (Choices.codes_last_first off)")
    parser.add_argument("--variant-uncarried", action="store_true", help="also ours INT8 graphed with the "
                        "blocks making their norm statistics by a pass of their own (Options.carry_norms "
                        "off)")
    parser.add_argument("--variant-two-pass-quant", action="store_true", help="also ours INT8 graphed with plain "
                        "rows quantized by the Triton passes where the Hopper one-pass kernel runs "
                        "(Choices.hopper_quant off)")
    parser.add_argument("--variant-unturned-v", action="store_true", help="also ours INT8 graphed with v not "
                        "turned in the QKV, OUT's rows quantized as plain rows (Options.turn_v off)")
    parser.add_argument("--variant-unturned-hidden", action="store_true", help="also ours INT8 graphed with UP's "
                        "SwiGLU rows not turned, DOWN's rows quantized as plain rows (Options.turn_hidden "
                        "off)")
    parser.add_argument("--variant-int8-attention", action="store_true", help="also ours INT8 graphed with every "
                        "family's attention scores on the INT8 matrix cores (Options.int8_attention on)")
    parser.add_argument("--variant-cudnn-attention", action="store_true", help="also ours INT8 graphed with every "
                        "family's attention by cuDNN's bf16 SDPA (Options.int8_attention off)")
    parser.add_argument("--variant-group-m", type=int, nargs="*", default=[], help="also ours INT8 graphed with the "
                        "Hopper GEMMs walking the columns with this many row tiles together (Choices.group_m: "
                        "the weights read from memory once a group)")


def variants(args, defaults) -> list:
    """(name, options) of each asked variant: the recipe's default options (a model's `default_options()`) with
    one field changed."""
    from kernels import Choices

    def chosen(**changes):  # the kernels' choices within the options (None: Choices' defaults)
        return replace(defaults, kernels=replace(defaults.kernels or Choices(), **changes))
    return [(f"MLP chunks of {args.variant_chunk} rows", replace(defaults, mlp_chunk=args.variant_chunk))] * bool(
        args.variant_chunk) + [("whole tiles", chosen(split_tail=False))] * args.variant_whole_tiles + [
        ("mode blocks on one stream", replace(defaults, concurrent_modes=False))] * args.variant_serial_modes + [
        ("Triton GEMMs", chosen(hopper_gemm=False))] * args.variant_triton_gemm + [
        ("norm statistics uncarried", replace(defaults, carry_norms=False))] * args.variant_uncarried + [
        ("codes first columns first", chosen(codes_last_first=False))] * args.variant_codes_first_first + [
        ("plain rows by the Triton passes", chosen(hopper_quant=False))] * args.variant_two_pass_quant + [
        ("v not turned", replace(defaults, turn_v=False))] * args.variant_unturned_v + [
        ("hidden rows not turned", replace(defaults, turn_hidden=False))] * args.variant_unturned_hidden + [
        ("attention INT8 scores", replace(defaults, int8_attention=True))] * args.variant_int8_attention + [
        ("attention cuDNN bf16", replace(defaults, int8_attention=False))] * args.variant_cudnn_attention + [
        (f"Hopper GEMMs' GROUP_M {g}", chosen(group_m=g)) for g in args.variant_group_m]
