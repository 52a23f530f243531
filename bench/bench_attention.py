"""Attention at the joint blocks' shape: kernels/int8/attention.py (INT8 scores, Gluon) against the cuDNN bf16 SDPA
the blocks call, in time (CUDA graph), joules a call under sustained load, and error against f32 attention.

q and k are head-RMS-normed rows with random gains (as kernels/head_norm_rope.py makes them), v plain rows; all are
rows [M, heads x 128] (the QKV's layout), which SDPA reads as strided [1, heads, M, 128] views.

    python bench/bench_attention.py [--heads 24 30] [--stages 3 4] [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "kernels")]

from bench_int8_linear import median_ms  # noqa: E402
from energy_by_kernel import sustained  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402
from kernels.int8 import attention as ka  # noqa: E402


def rows(m: int, heads: int, seed: int, normed: bool) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, heads, ka.HEAD, device="cuda", generator=g)
    if normed:
        x = x * (1 + torch.rand(1, heads, ka.HEAD, device="cuda", generator=g))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
    return x.reshape(m, heads * ka.HEAD).to(torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, nargs="*", default=[24, 30], help="24: FLUX.3 Klein, 30: Z-Image")
    p.add_argument("--rows", type=int, default=4608)
    p.add_argument("--stages", type=int, nargs="*", default=[ka.STAGES], help="attention_int8's ring slots")
    p.add_argument("--seconds", type=float, default=1.0, help="sustained load a case, after as long a warm-up")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA GPU")
    energy = energy_reader(torch.device("cuda", torch.cuda.current_device()))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.rows} rows, heads x 128\n")
    print("| heads | attention | graph ms | TFLOP/s | J a call (sustained) | error vs f32 |\n" + "|---" * 6 + "|")
    for heads in args.heads:
        m = args.rows
        q, k, v = rows(m, heads, 1, True), rows(m, heads, 2, True), rows(m, heads, 3, False)
        if ka.unusable(q, heads):
            sys.exit(f"attention_int8 cannot run here: {ka.unusable(q, heads)}")
        view = lambda t: t.reshape(m, heads, ka.HEAD).transpose(0, 1).unsqueeze(0)  # noqa: E731
        qh, kh, vh = view(q), view(k), view(v)
        truth = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float())
        truth = truth[0].transpose(0, 1).reshape(m, -1)

        def cudnn():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qh, kh, vh)[0].transpose(0, 1).reshape(m, -1)
        cases = [("cuDNN bf16 SDPA (the blocks' call)", cudnn)]
        cq, ck = ka.codes(q, heads, True), ka.codes(k, heads, False)
        for stages in args.stages:
            def ours(stages=stages):
                return ka.attention_int8(q, k, v, heads, stages)
            cases.append((f"INT8 scores, {stages} slots, codes included", ours))
        made = ka.operands(q, k, v, heads)
        cases.append((f"INT8 scores, the kernel alone ({ka.STAGES} slots)", lambda: ka.launch(*made, heads)))
        cases.append(("q and k codes alone", lambda: (ka.codes(q, heads, True, out=cq),
                                                      ka.codes(k, heads, False, out=ck)) and None))
        flop = 4 * m * m * ka.HEAD * heads
        for name, call in cases:
            o = call()
            err = float("nan") if o is None else ((o.float() - truth).norm() / truth.norm()).item()
            ms = median_ms(call, 20, graph=True)
            joules = sustained(call, args.seconds, energy)[1] if energy is not None else float("nan")
            print(f"| {heads} | {name} | {ms:.4f} | {flop / ms / 1e9:.0f} | {joules:.4f} | "
                  f"{'-' if math.isnan(err) else f'{err:.2e}'} |", flush=True)


if __name__ == "__main__":
    main()
