"""Energy by kernel under sustained load: what a FLUX.3 Klein joint block's kernels cost in joules on the GPU.

Why: a graphed Klein step holds the H200 at its 700 W limit (device_session.sh's power samples: throttle reason SW
power cap, SM clock 1.3-1.8 GHz against 1.98), so a step's time follows its energy more than any kernel's latency.
Each case is one call as the block makes it (bench_linear_shapes.call_of; cuDNN attention; the quantizer's two passes),
captured 10 times in a CUDA graph and replayed for `--seconds` after as long a warm-up, so that the clocks settle where
that kernel's own power puts them. NVML's energy counter over the measured span gives joules a call; also ms a call at
that sustained power, the mean watts, the SM clock at the end, and integer or bf16 operations a joule.

    python bench/energy_by_kernel.py [--seconds 1.5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_linear_shapes import call_of  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402
from kernels.int8.quant import quantize_rows  # noqa: E402
from kernels.int8.row_stats import reference as stats_reference  # noqa: E402

M, WIDTH, FFN, HEADS = 4608, 3072, 9216, 24


def _attention():
    q, k, v = (torch.randn(1, HEADS, M, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def call():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    return call


def _normed_rows(carried: bool = False):
    """The QKV's input as the joint block makes it: LayerNorm of the f32 residual, each mode's shift and scale;
    carried: its statistics given (the block before wrote them), no statistics pass."""
    x = torch.randn(M, WIDTH, device="cuda")
    scale, shift = torch.randn(3, WIDTH, device="cuda") * 0.1, torch.randn(3, WIDTH, device="cuda") * 0.1
    row_map = (torch.arange(M, device="cuda") >= 512).int()
    stats = stats_reference(x, "layer", 1e-6) if carried else None
    return lambda: quantize_rows(x, 256, norm="layer", scale=scale, shift=shift, row_map=row_map, stats=stats,
                                 row_starts=(0, 512))


def _int_mm(k, n):
    """cuBLASLt's INT8 product (int32 out, no epilogue) at our products' shapes: its tiles' operations a joule."""
    x = torch.randint(-128, 128, (M, k), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
    return lambda: torch._int_mm(x, w.t())


def _bf16_linear(k, n):
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return lambda: F.linear(x, w)


# (name, call maker, operations a call: 2 M N K for the products, 4 M^2 D heads for attention, 0 for passes)
CASES = [("INT8 QKV + head norm + rotary", lambda: call_of("qkv", M, WIDTH, FFN), 2 * M * WIDTH * FFN),
         ("INT8 UP + SwiGLU", lambda: call_of("swiglu", M, WIDTH, 2 * FFN), 2 * M * WIDTH * 2 * FFN),
         ("INT8 OUT, bf16 rows", lambda: call_of("rows", M, WIDTH, WIDTH), 2 * M * WIDTH * WIDTH),
         ("INT8 DOWN, gated + addend", lambda: call_of("gated", M, FFN, WIDTH), 2 * M * FFN * WIDTH),
         ("cuDNN attention (bf16)", _attention, 4 * M * M * 128 * HEADS),
         ("quantizer: LayerNorm + modulation, K 3072", _normed_rows, 0),
         ("the same, statistics carried", lambda: _normed_rows(carried=True), 0),
         ("quantizer: plain rows, K 3072", lambda: call_of("quantize", M, WIDTH, 0), 0),
         ("quantizer: plain rows, K 9216", lambda: call_of("quantize", M, FFN, 0), 0),
         ("BF16 F.linear 3072 x 9216 (diffusers' QKV)", lambda: _bf16_linear(WIDTH, FFN), 2 * M * WIDTH * FFN),
         ("cuBLASLt INT8 _int_mm 3072 x 18432 (UP's shape, int32 out)", lambda: _int_mm(WIDTH, 2 * FFN),
          2 * M * WIDTH * 2 * FFN),
         ("cuBLASLt INT8 _int_mm 9216 x 3072 (DOWN's shape, int32 out)", lambda: _int_mm(FFN, WIDTH),
          2 * M * FFN * WIDTH)]


def sustained(call, seconds: float, energy, reps: int = 10):
    """(ms a call, J a call, mean W) of `call` replayed in a graph of `reps` for `seconds` (energy: joules so far)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            call()

    def replay_for(span):
        start, replays = time.perf_counter(), 0
        while time.perf_counter() - start < span:
            for _ in range(5):
                graph.replay()
            replays += 5
            torch.cuda.synchronize()
        return replays
    replay_for(seconds)  # the clocks settle at this kernel's power
    first, start = energy(), time.perf_counter()
    calls = replay_for(seconds) * reps
    elapsed, joules = time.perf_counter() - start, energy() - first
    return elapsed / calls * 1e3, joules / calls, joules / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("energy_by_kernel needs a CUDA GPU")
    energy = energy_reader(torch.device("cuda", torch.cuda.current_device()))
    if energy is None:
        sys.exit("energy_by_kernel needs NVML's energy counter (nvidia-ml-py)")
    import pynvml as nvml  # (energy_reader initialized it)
    handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    limit = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
    time.sleep(1.0)
    idle = nvml.nvmlDeviceGetPowerUsage(handle) / 1e3
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; power limit {limit:.0f} W, idle {idle:.0f} W; "
          f"{args.seconds} s a case after as long a warm-up\n")
    print("| kernel (FLUX.3 Klein joint block, 4608 rows) | ms a call, sustained | J a call | mean W | SM MHz | "
          "TOPS sustained | GOP a J |\n" + "|---" * 7 + "|")
    for name, make, ops in CASES:
        ms, joules, watts = sustained(make(), args.seconds, energy)
        clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        rate = f"{ops / ms / 1e9:.0f} | {ops / joules / 1e9:.0f}" if ops else "- | -"
        print(f"| {name} | {ms:.4f} | {joules:.4f} | {watts:.0f} | {clock} | {rate} |", flush=True)


if __name__ == "__main__":
    main()
