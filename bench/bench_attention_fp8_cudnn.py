"""What 8-bit attention could buy a FLUX.3 Klein step: cuDNN's FP8 attention against its bf16 one, at the joint
blocks' shape, in time and joules a call under sustained load.

Why: a graphed Klein step runs at the H200's 700 W limit, so it follows its joules, and attention (cuDNN bf16, 0.400
ms and 0.345 J a call, 38 calls a step) is about 29% of them. Our own INT8-scores kernel (Triton, fifteenth session)
lost to cuDNN's bf16 (0.548 ms, 0.390 J). Before an FA3-style FP8 kernel of our own is worth sessions, this measures
the prize: NVIDIA's own FP8 attention (cuDNN's FP8 forward graph, reached through JAX's `__cudnn$fmhaSoftmaxF8`
custom call: PyTorch has no FP8 SDPA) at the same shape, on the same card, in the same run. It is a probe, not a
peer of any node: nothing of JAX enters the engine.

Each case runs back to back for `--seconds` after as long a warm-up (the clocks settle at its own power); NVML's
energy counter over the span gives joules a call. Errors are relative Frobenius against the f32 attention of the
unquantized q, k, v (queries scaled so that the scores' spread is `--score-std`, a peakier softmax than random rows
give). FP8: per-tensor scales to e4m3's 448 for q, k, v and the output, P scaled by 448 (its largest value is 1).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/bench_attention_fp8_cudnn.py [--heads 24 30] [--seconds 1.5]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from energy_by_kernel import sustained  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402

E4M3_MAX = 448.0


def jax_sustained(call, seconds: float, energy, reps: int = 10):
    """(ms a call, J a call, mean W) of a JAX call dispatched `reps` at a time for `seconds` (after as long a warm-up);
    JAX dispatches asynchronously, so the GPU stays busy while the calls queue."""
    def run_for(span):
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < span:
            outs = [call() for _ in range(reps)]
            outs[-1][0].block_until_ready()
            calls += reps
        return calls
    run_for(seconds)
    first, start = energy(), time.perf_counter()
    calls = run_for(seconds)
    elapsed, joules = time.perf_counter() - start, energy() - first
    return elapsed / calls * 1e3, joules / calls, joules / elapsed


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def cases(heads: int, rows: int, score_std: float):
    """[(name, call, output as a torch f32 [1, heads, rows, 128] tensor, jax?)] and the f32 reference output."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, rows, 128, device="cuda") for _ in range(3))
    q *= score_std  # q.k / sqrt(128) then has std score_std
    truth = F.scaled_dot_product_attention(q, k, v)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))

    def torch_cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qb, kb, vb)

    to_jax = lambda t: jnp.asarray(t.cpu().float().numpy())  # noqa: E731 (once, outside the timing)
    jq, jk, jv = (to_jax(t) for t in (q, k, v))
    scale = 128 ** -0.5
    jbf = [t.astype(jnp.bfloat16) for t in (jq, jk, jv)]
    bf16 = jax.jit(lambda a, b, c: (cudnn_attention.dot_product_attention(a, b, c, scale=scale, qkv_layout="BNTH"),))

    amax = [float(jnp.abs(t).max()) for t in (jq, jk, jv)]
    fp8_in = [(t * (E4M3_MAX / m)).astype(jnp.float8_e4m3fn) for t, m in zip((jq, jk, jv), amax)]
    one = lambda x: jnp.full((1, 1, 1, 1), x, jnp.float32)  # noqa: E731
    scale_o = E4M3_MAX / amax[2]  # the output is a weighted mean of v's rows: |o| <= amax(v)
    params = {"descale_q": one(amax[0] / E4M3_MAX), "descale_k": one(amax[1] / E4M3_MAX),
              "descale_v": one(amax[2] / E4M3_MAX), "descale_s": one(1 / E4M3_MAX), "scale_s": one(E4M3_MAX),
              "scale_o": one(scale_o)}
    for key in ("amax_dQ", "amax_dK", "amax_dV", "amax_dP", "descale_o", "descale_dO", "descale_dP", "scale_dQ",
                "scale_dK", "scale_dV", "scale_dP"):  # the backward's, checked present by the API
        params[key] = one(1.0)
    fp8 = jax.jit(lambda a, b, c: cudnn_attention.dot_product_attention(
        a, b, c, fp8_params=params, scale=scale, qkv_layout="BNTH", use_fp8=True))

    from_jax = lambda x, s=1.0: torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda() / s  # noqa: E731
    return truth, [
        ("torch SDPA cuDNN bf16 (our path)", torch_cudnn, lambda: torch_cudnn().float(), False),
        ("JAX cuDNN bf16", lambda: bf16(*jbf), lambda: from_jax(bf16(*jbf)[0]), True),
        ("JAX cuDNN FP8 e4m3 (q, k, v, P, output)", lambda: fp8(*fp8_in),
         lambda: from_jax(fp8(*fp8_in)[0], scale_o), True),
    ]


def main() -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share the card
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, nargs="*", default=[24, 30], help="24: FLUX.3 Klein, 30: Z-Image")
    p.add_argument("--rows", type=int, default=4608)
    p.add_argument("--score-std", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=1.5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention_fp8_cudnn needs a CUDA GPU")
    energy = energy_reader(torch.device("cuda", torch.cuda.current_device()))
    if energy is None:
        sys.exit("bench_attention_fp8_cudnn needs NVML's energy counter (nvidia-ml-py)")
    import jax
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, jax {jax.__version__} "
          f"({jax.devices()[0]}); {args.seconds} s a case after as long a warm-up; scores' std {args.score_std}\n")
    print("| heads x 128, rows | attention | ms a call, sustained | J a call | mean W | TFLOP/s | error vs f32 |\n"
          + "|---" * 7 + "|")
    for heads in args.heads:
        truth, contenders = cases(heads, args.rows, args.score_std)
        flop = 4 * args.rows * args.rows * 128 * heads
        for name, call, output, is_jax in contenders:
            try:
                err = rel(output(), truth)
                ms, joules, watts = (jax_sustained if is_jax else sustained)(call, args.seconds, energy)
            except Exception as e:  # noqa: BLE001 (a probe: report what the stack refused and go on)
                print(f"| {heads}, {args.rows} | {name} | failed: {type(e).__name__}: {str(e)[:300]} | | | | |")
                continue
            print(f"| {heads}, {args.rows} | {name} | {ms:.4f} | {joules:.4f} | {watts:.0f} | "
                  f"{flop / ms / 1e9:.0f} | {err:.2e} |", flush=True)


if __name__ == "__main__":
    main()
