"""Times OUT's INT8 rows with an attention's gate on CUDA: the gate in the quantizer's prologue
(kernels/int8/prologue.py) against torch's gate then the plain quantizer (what ran before), at Krea 2's and LTX-2.5's
OUT rows.

Krea 2: rows [M, 6144] bf16, the gate a bf16 view of QKV's last 6144 of 15360 columns, `o * torch.sigmoid(g)`.
LTX-2.5: rows [M, 32 x 128] (video) and [M, 32 x 64] (audio) bf16, the gate f32 [M, 32] a head,
`o * (2 * torch.sigmoid(g))[..., None]`. Each at the rows of a 1024^2 image (4608) and of a few hundred, through
quantize_rows' default (the whole-rows pass from 2048 rows of up to 16 groups: LTX-2.5's; the rotate pass for Krea 2's
24) and the rotate pass (Choices(whole_rows=False)); at 4608 rows also the whole-rows pass itself at 4 and 8 warps.
Median ms of --runs, eager and one CUDA-graph replay (bench_int8_linear.median_ms). Prints markdown.
Not collected by pytest (bench_*); on the device: python tests/kernels/bench_int8_quant_gate.py [--runs 100]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_int8_linear import median_ms  # noqa: E402
from kernels import Choices  # noqa: E402
from kernels.int8.quant import quantize_rows  # noqa: E402
from kernels.int8.quant_turned import quantize_turned  # noqa: E402

CASES = [("Krea 2", 6144, 0), ("LTX-2.5 video", 4096, 32), ("LTX-2.5 audio", 2048, 32)]  # name, K, heads (0: a feature)


def inputs(m: int, k: int, heads: int):
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    if heads == 0:
        qkv = torch.randn(m, 15360, device="cuda").to(torch.bfloat16)
        return x, qkv[:, 15360 - k:], 1.0, lambda: x * torch.sigmoid(qkv[:, 15360 - k:])
    g = torch.randn(m, heads, device="cuda")
    return x, g, 2.0, lambda: (x.view(m, heads, -1) * (2 * torch.sigmoid(g))[..., None].to(x.dtype)).view(m, k)


def main(runs: int) -> None:
    print("| OUT rows | M | quantizer | torch gate + quantizer ms (graph) | gate in the prologue ms (graph) |")
    print("|---|---|---|---|---|")
    for name, k, heads in CASES:
        for m in (4608, 300):
            x, gate, factor, torch_gate = inputs(m, k, heads)
            for label, choices in (("default", Choices()), ("rotate pass", Choices(whole_rows=False))):
                before = lambda: quantize_rows(torch_gate(), 256, choices=choices)  # noqa: E731
                fused = lambda: quantize_rows(x, 256, gate=gate, gate_factor=factor, choices=choices)  # noqa: E731
                times = [f"{median_ms(fn, runs, False):.4f} ({median_ms(fn, runs, True):.4f})"
                         for fn in (before, fused)]
                print(f"| {name} | {m} | {label} | {times[0]} | {times[1]} |")
            for warps in (4, 8) if m >= 2048 else ():  # the whole-rows pass, where the default takes it or not
                fn = lambda: quantize_turned(x, None, gate=gate, gate_factor=factor, num_warps=warps)  # noqa: E731
                print(f"| {name} | {m} | whole rows, {warps} warps | | {median_ms(fn, runs, False):.4f} "
                      f"({median_ms(fn, runs, True):.4f}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    main(parser.parse_args().runs)
