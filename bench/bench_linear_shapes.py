"""Each family's INT8 linears at their real 1024^2 shapes and forms (Z-Image, FLUX.3 Klein, Krea 2), the Hopper
kernels against the Triton ones in the same run: where a step's product time goes, shape by shape. The fused QKV
turns by its angles' factors as the blocks call it, and once more by cos and sin tables; FLUX.3's OUT and DOWN as its
parallel blocks call them (OUT rows, DOWN adding them under the gate), and once more as before (each adding into the
residual).

Forms as the blocks call them (dit_core/gpu/block.py): the fused QKV with head norm and rotary, UP with SwiGLU, OUT
and DOWN as bf16 rows (Z-Image: its sandwich norm follows) or adding into the f32 residual (FLUX.3 Klein). Random
codes; graph ms (median) of one call, TOPS = 2 M N K / t, and ms a step = calls a step x ms (Z-Image's caption
refiners run once per prompt, not a step). Needs a CUDA GPU; the Hopper column where int8_linear_hopper can run.

    python bench/bench_linear_shapes.py [--runs 30]
    python bench/bench_linear_shapes.py --once FORM M K N   # three calls, no timing: for ncu (device_session's ncu)
FORM: qkv, swiglu, gated, rows, or quantize (quantize_rows of plain bf16 rows [M, K]; N unused).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kernels")]

from bench_int8_linear import median_ms  # noqa: E402
from kernels import Choices  # noqa: E402
from kernels.int8.linear import int8_linear, int8_linear_gated  # noqa: E402
from kernels.int8.quant import quantize_rows  # noqa: E402
from dit_core.sequence import sequence_of  # noqa: E402
from kernels.int8.qkv_rope_linear import qkv_rope_linear  # noqa: E402

# (family, linear, form, M, K, N, calls a step); N is the product's width (UP: gate and up interleaved).
SHAPES = [("Z-Image", "qkv", "qkv", 4608, 3840, 11520, 30), ("Z-Image", "qkv", "qkv", 4096, 3840, 11520, 2),
          ("Z-Image", "out", "rows", 4608, 3840, 3840, 30), ("Z-Image", "up", "swiglu", 4608, 3840, 20480, 30),
          ("Z-Image", "down", "rows", 4608, 10240, 3840, 30)]
for _m, _calls, _rows in ((4608, 28, "joint"), (4096, 5, "image mode"), (512, 5, "text mode")):
    SHAPES += [(f"Klein {_rows}", "qkv", "qkv", _m, 3072, 9216, _calls),
               (f"Klein {_rows}", "up", "swiglu", _m, 3072, 18432, _calls),
               (f"Klein {_rows}", "out", "rows", _m, 3072, 3072, _calls),
               (f"Klein {_rows}", "down", "gated", _m, 9216, 3072, _calls)]
# Krea 2 (4096 image + 512 text rows, bench_krea2_step's step): QKV [q; k; v; gate] as plain bf16 rows (grouped-query
# heads and the gate take the plain path), OUT and DOWN adding into the residual under the gate.
SHAPES += [("Krea 2", "qkv", "rows", 4608, 6144, 15360, 28), ("Krea 2", "out", "gated", 4608, 6144, 6144, 28),
           ("Krea 2", "up", "swiglu", 4608, 6144, 32768, 28), ("Krea 2", "down", "gated", 4608, 16384, 6144, 28)]
# As before (not counted in a step): the fused QKV turned by cos and sin tables, not its angles' factors; FLUX.3's
# OUT adding into the residual in its own epilogue, and DOWN without the attention branch's rows to add
# (nor the next norm's statistics).
EARLIER = [("Z-Image", "qkv, tables", "qkv", 4608, 3840, 11520, 30),
           ("Klein joint", "qkv, tables", "qkv", 4608, 3072, 9216, 28),
           ("Klein joint", "out, gated", "gated", 4608, 3072, 3072, 28),
           ("Klein joint", "down, no addend", "gated", 4608, 9216, 3072, 28)]


def call_of(form: str, m: int, k: int, n: int, family: str = "Klein joint", earlier: bool = False,
            choices: Choices = Choices()):
    """A no-argument call of the linear in its form on random codes (the same for a shape every time), as the family's
    blocks make it: the QKV's rotary from its angles' factors, the joint blocks' gate rows by mode (text rows first),
    FLUX.3's DOWN adding the attention branch's rows and writing the next norm's statistics (earlier: the QKV from
    tables, DOWN without either). choices: which kernels run (kernels/choices.py)."""
    g = torch.Generator().manual_seed(m + k + n)
    q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).cuda()
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).cuda()
    s_x, s_w = torch.full((m,), 1e-3, device="cuda"), torch.full((n,), 1e-3, device="cuda")
    bias = torch.randn(n, generator=g).to("cuda", torch.bfloat16)
    if form == "qkv":
        heads, head = n // 3 // 128, 128
        axes, theta = ((32, 48, 48), 256.0) if family == "Z-Image" else ((32, 32, 32, 32), 10000.0)
        seq = sequence_of(torch.randint(0, 64, (m, len(axes)), generator=g) * 0.5, torch.zeros(m, dtype=torch.long),
                          axes, theta).to("cuda")
        angles, gains = None if earlier else seq.angles.as_args(), torch.ones(2, head, device="cuda")
        return lambda: qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, gains[0], gains[1], seq.cos, seq.sin,
                                       angles=angles, choices=choices)
    if form == "quantize":
        x = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
        return lambda: quantize_rows(x, 256, choices=choices)
    if form == "gated":
        residual, gate = torch.zeros(m, n, device="cuda"), torch.ones(3, n, device="cuda")
        row_map = (torch.arange(m, device="cuda") >= 512).int() if family == "Klein joint" else \
            torch.zeros(m, dtype=torch.int32, device="cuda")
        gate = gate if family == "Klein joint" else gate[:1]
        summed = not earlier and k == 9216  # FLUX.3's DOWN: the attention rows added, the next norm's statistics
        addend = torch.randn(m, n, generator=g).to("cuda", torch.bfloat16) if summed else None
        next_norm = (torch.empty(2, m, device="cuda"), "layer", 1e-6) if summed else None
        return lambda: int8_linear_gated(q, s_x, w, s_w, bias, residual=residual, gate=gate, row_map=row_map,
                                         addend=addend, next_norm=next_norm, choices=choices)
    return lambda: int8_linear(q, s_x, w, s_w, bias, swiglu=form == "swiglu", choices=choices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--once", nargs=4, metavar=("FORM", "M", "K", "N"), help="three calls of one linear, no timing")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_linear_shapes needs a CUDA GPU")
    if args.once:
        call = call_of(args.once[0], *map(int, args.once[1:]))
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, runs = {args.runs}\n")
    print("| family | linear (form) | M x K x N | calls a step | Hopper ms (TOPS) | Triton ms (TOPS) | Triton / Hopper "
          "| Hopper ms a step | Triton ms a step |\n" + "|---" * 9 + "|")
    totals = {}
    for earlier, (family, linear, form, m, k, n, calls) in [(False, s) for s in SHAPES] + [(True, s) for s in EARLIER]:
        times = [median_ms(call_of(form, m, k, n, family, earlier, Choices(hopper_gemm=hopper)), args.runs, True)
                 for hopper in (True, False)]
        tops = [2 * m * n * k / t / 1e9 for t in times]
        family_total = [0, 0] if earlier else totals.setdefault(family.split()[0], [0.0, 0.0])
        family_total[0] += calls * times[0]
        family_total[1] += calls * times[1]
        print(f"| {family} | {linear} ({form}) | {m}x{k}x{n} | {calls} | {times[0]:.4f} ({tops[0]:.0f}) | "
              f"{times[1]:.4f} ({tops[1]:.0f}) | {times[1] / times[0]:.2f} | {calls * times[0]:.2f} | "
              f"{calls * times[1]:.2f} |", flush=True)
    for family, (hopper, triton_ms) in totals.items():
        print(f"\n{family}: the products {hopper:.2f} ms a step on Hopper's kernels, {triton_ms:.2f} on Triton's")


if __name__ == "__main__":
    main()
