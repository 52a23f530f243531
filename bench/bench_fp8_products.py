"""Krea 2's block linears from its scaled FP8 file (`krea2_turbo_fp8_scaled`: e4m3 weights, a scale a tensor) run two
ways at 1024^2 (4608 rows): requantized to INT8 ConvRot at load and run on our INT8 kernels (what the loader does
today: dit_core/weights/stored.py), or kept as stored and run as FP8 matrix products (torch._scaled_mm: the rows to
e4m3 with a scale a row, the weight's scale a tensor); BF16 products of the file's weights beside them. Median graph
ms of one call, the rows' quantization included (ours: the fused quantize_rows kernel; FP8's: torch's amax, divide and
cast, so also the FP8 product alone, the floor a fused quantizer would reach), and each output's distance from the f32
product of the file's weights (the rows have a few outlier channels, as DiT activations do). Issue 38: the FP8 file
runs whichever way is faster at equal or better fidelity.

    python bench/bench_fp8_products.py [--runs 30]
    python bench/bench_fp8_products.py --tiny   # small shapes, one untimed call each (kernel references on a CPU)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kernels")]

from dit_core.weights.convrot import convrot_group_for, quantize_convrot  # noqa: E402
from kernels import run  # noqa: E402  (the kernels on a GPU, their references elsewhere)

E4M3_MAX = 448.0
# (linear, K, N, calls a step): Krea 2 (reference/families/krea2.md), 28 blocks; QKV with the attention gate's rows
# (6144 q + 2 x 1536 k, v + 6144 gate), UP as gate and up together.
SHAPES = [("qkv + gate", 6144, 15360, 28), ("out", 6144, 6144, 28), ("up (gate, up)", 6144, 32768, 28),
          ("down", 16384, 6144, 28)]
TINY_SHAPES = [("qkv + gate", 256, 384, 1), ("down", 512, 256, 1)]


def fp8_scaled_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w as the scaled FP8 file stores it: e4m3 values and one f32 scale (amax / 448)."""
    scale = w.float().abs().amax() / E4M3_MAX
    return (w.float() / scale).to(torch.float8_e4m3fn), scale


def fp8_file_weight(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random weight of the file's form (fp8_scaled_weight)."""
    return fp8_scaled_weight(torch.randn(n, k, generator=g) / k ** 0.5)


def rows(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """bf16 rows with 1% of the channels 10x larger (the outlier channels DiT activations carry)."""
    x = torch.randn(m, k, generator=g)
    x[:, torch.randperm(k, generator=g)[: max(1, k // 100)]] *= 10
    return x.to(torch.bfloat16)


def fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 codes, f32 scales [M, 1]): a scale a row, amax / 448."""
    s = x.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / s).to(torch.float8_e4m3fn), s


def calls(m: int, k: int, n: int, device: torch.device) -> tuple[dict, torch.Tensor]:
    """{way: a no-argument call} of one linear, and the f32 product of the file's weights (the truth)."""
    g = torch.Generator().manual_seed(k + n)
    w8, w_scale = fp8_file_weight(n, k, g)
    x = rows(m, k, g)
    w = w8.float() * w_scale  # what the file means
    truth = x.float() @ w.t()
    group = convrot_group_for(k)
    codes, s_w = quantize_convrot(w, group)  # the loader's requantization (stored.py's _scaled_fp8)
    x, w8, codes, s_w, w_bf16 = (t.to(device) for t in (x, w8, codes, s_w, w.to(torch.bfloat16)))
    scale_b = w_scale.float().to(device).expand(1, n).contiguous()  # rowwise form of the tensor's one scale

    def int8():
        q, s_x = run("quantize_rows", x, group)
        return run("int8_linear", q, s_x, codes, s_w)

    def fp8():
        x8, s_x = fp8_rows(x)
        return torch._scaled_mm(x8, w8.t(), scale_a=s_x, scale_b=scale_b, out_dtype=torch.bfloat16)

    x8, s_x = fp8_rows(x)
    return {"bf16": lambda: x @ w_bf16.t(), "int8": int8, "fp8": fp8,
            "fp8 product": lambda: torch._scaled_mm(x8, w8.t(), scale_a=s_x, scale_b=scale_b,
                                                    out_dtype=torch.bfloat16)}, truth


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float().cpu() - b).norm() / b.norm()).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--rows", type=int, default=4608, help="M: 4096 image rows + a 512-row prompt")
    p.add_argument("--tiny", action="store_true", help="small shapes, one untimed call each")
    args = p.parse_args()
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.tiny:
        sys.exit("bench_fp8_products needs a CUDA GPU (or --tiny: the kernels' references on the CPU)")
    device = torch.device("cuda" if on_gpu else "cpu")
    m, shapes = (64, TINY_SHAPES) if args.tiny else (args.rows, SHAPES)
    if on_gpu and not args.tiny:
        from bench_int8_linear import median_ms
        timed = lambda fn: median_ms(fn, args.runs, True)  # noqa: E731
    else:
        timed = lambda fn: float("nan")  # noqa: E731
    name = torch.cuda.get_device_name() if on_gpu else "CPU (kernel references)"
    print(f"{name}, torch {torch.__version__}; {m} rows, graph ms (median of {args.runs})\n")
    ways = ("bf16", "int8", "fp8", "fp8 product")
    print("| linear | M x K x N | " + " | ".join(f"{w} ms" for w in ways) + " | error bf16 | error int8 | error fp8 |\n"
          + "|---" * (2 + len(ways) + 3) + "|")
    step = dict.fromkeys(ways, 0.0)
    for linear, k, n, per_step in shapes:
        ways_of, truth = calls(m, k, n, device)
        times = {w: timed(ways_of[w]) for w in ways}
        errors = {w: rel(ways_of[w](), truth) for w in ("bf16", "int8", "fp8")}
        for w in ways:
            step[w] += per_step * times[w]
        print(f"| {linear} | {m}x{k}x{n} | " + " | ".join(f"{times[w]:.4f}" for w in ways) + " | "
              + " | ".join(f"{errors[w]:.4f}" for w in ("bf16", "int8", "fp8")) + " |", flush=True)
    print("\nms a step (28 blocks): " + ", ".join(f"{w} {step[w]:.1f}" for w in ways))


if __name__ == "__main__":
    main()
