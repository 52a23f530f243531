"""Block streaming (issue 5) on one GPU: Z-Image INT8 at 1024x1024 and a synthetic H3-size stack (50 INT8 blocks of
~645 M parameters, ~32 GB) with 100/50/25/0% of the blocks resident, against a naive streamer (each streamed
block .to(cuda) synchronously when needed, the same resident set) in the same run. Prints a markdown table: ms per
step (median, CUDA events), peak GPU memory, the weights budget, bytes copied a step and the copy floor (those bytes
over the measured pinned host-to-device bandwidth).

    python bench/bench_streaming.py [--steps 5] [--h3-rows 4096] [--only z_image|h3]
    python bench/bench_streaming.py --smoke     # tiny sizes on the CPU: checks the script, times nothing useful
    python bench/bench_streaming.py --only z_image --trace 0   # why a sweep row is slow: see trace()
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dit_core.arch import Arch  # noqa: E402
from dit_core.gpu.block import GpuBlock, GpuLinear  # noqa: E402
from dit_core.families.z_image import ZImage  # noqa: E402
from dit_core.modulation import Modulation  # noqa: E402
from dit_core.sequence import sequence_of  # noqa: E402
from dit_core.gpu.staging import stage, staged_bytes  # noqa: E402
from dit_core.gpu.streaming import SLOTS, StreamedBlocks  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402

PERCENTS = (100, 50, 25, 0)


class NaiveBlocks:
    """The baseline: the same resident set; each other block copied with .to(device) when needed (pageable
    host memory, synchronous), then dropped."""

    def __init__(self, host_blocks, resident: list[bool], device: torch.device):
        self.blocks = [_moved(b, device) if r else b for b, r in zip(host_blocks, resident)]
        self.resident, self.device = resident, device

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self):
        for block, r in zip(self.blocks, self.resident):
            yield block if r else _moved(block, self.device)


def _moved(block: GpuBlock, device: torch.device) -> GpuBlock:
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return GpuBlock(tuple(GpuLinear(to(w.weight), to(w.scale), to(w.bias), w.group) if isinstance(w, GpuLinear)
                          else to(w) for w in block.w))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, steps: int, device: torch.device) -> tuple[float, float]:
    """Median ms of fn() over steps runs after one warm-up, and the peak memory allocated meanwhile (GB)."""
    fn()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0
    return statistics.median(times), peak


def h2d_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Pinned host-to-device bytes a second (median of 5 copies of nbytes)."""
    if device.type != "cuda":
        return float("inf")
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return nbytes / statistics.median(times[1:])


def budget_for(sizes: list[int], percent: int, slots: int = SLOTS) -> int:
    """Weights budget keeping percent of the blocks: everything at 100, else that share plus the slots."""
    if percent == 100:
        return sum(sizes)
    return sum(sizes) * percent // 100 + slots * max(sizes)


def copied_bytes(streamed: StreamedBlocks) -> int:
    """Bytes a pass copies: the streamed blocks, none when the slots hold them all across passes."""
    streamed_sizes = [s for s, r in zip(streamed._bytes, streamed.resident) if not r]
    return 0 if len(streamed_sizes) <= streamed.slot_count else sum(streamed_sizes)


def sweep(name: str, host_blocks: list[GpuBlock], step_with, steps: int, device, bandwidth: float) -> list[str]:
    """Rows of the table for one model: step_with(blocks) runs one step on those blocks."""
    sizes = [staged_bytes(b) for b in host_blocks]
    staged = [stage(b) for b in host_blocks]
    rows, resident_ms = [], None
    for percent in PERCENTS:
        budget = budget_for(sizes, percent)
        streamed = StreamedBlocks(staged, device, budget)
        with torch.no_grad():
            ms, peak = timed(lambda b=streamed: step_with(b), steps, device)
        resident_ms = resident_ms or ms
        copied = copied_bytes(streamed)
        floor = copied / bandwidth * 1e3
        naive = NaiveBlocks(host_blocks, streamed.resident, device)
        del streamed
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with torch.no_grad():
            naive_ms, naive_peak = timed(lambda b=naive: step_with(b), steps, device)
        del naive
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(f"| {name} | {percent}% | {budget / 1e9:.2f} | {ms:.1f} | {resident_ms / ms:.2f}x | {peak:.2f} "
                    f"| {copied / 1e9:.2f} | {floor:.1f} | {naive_ms:.1f} | {naive_peak:.2f} |")
        print(rows[-1], flush=True)
    return rows


def trace(host_blocks, step_with, percent: int, steps: int, device) -> None:
    """Where a streamed step's time goes, at one share resident: the step with 2 and 3 slots, the copies alone
    (the same slot protocol, no compute), and one profiled step's copies (mean time and bandwidth) and compute
    stream busy time."""
    sizes, staged = [staged_bytes(b) for b in host_blocks], [stage(b) for b in host_blocks]
    for slots in (2, 3):
        streamed = StreamedBlocks(staged, device, budget_for(sizes, percent, slots), slots=slots)
        with torch.no_grad():
            ms, _ = timed(lambda b=streamed: step_with(b), steps, device)
            copies_ms, _ = timed(lambda b=streamed: [None for _ in b], steps, device)
        print(f"trace {percent}% resident, {slots} slots: step {ms:.1f} ms, copies alone {copies_ms:.1f} ms",
              flush=True)
        if slots == 2 and device.type == "cuda":
            with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step_with(streamed)
                sync(device)
            copies = [e for e in prof.events() if "Memcpy HtoD" in e.name]
            kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                             if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name)
            busy, end = 0.0, float("-inf")  # union of kernel intervals (us)
            for a, b in kernels:
                busy += max(0.0, b - max(a, end))
                end = max(end, b)
            span = kernels[-1][1] - kernels[0][0]
            mean = statistics.mean(e.time_range.elapsed_us() for e in copies) if copies else 0.0
            print(f"  profiled: {len(copies)} copies of {mean / 1e3:.2f} ms mean "
                  f"({max(sizes) / (mean * 1e-6) / 1e9 if mean else 0:.1f} GB/s), kernels busy {busy / 1e3:.1f} "
                  f"of {span / 1e3:.1f} ms", flush=True)
        del streamed


def z_image(args, device, bandwidth) -> list[str]:
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    from tiny_models import Z_IMAGE_TINY, z_image_comfy_layout

    torch.manual_seed(0)
    size = {**Z_IMAGE_TINY, "n_layers": 4} if args.smoke else {"n_layers": 30}
    with torch.device(device):
        ref = ZImageTransformer2DModel(**size).to(torch.bfloat16).eval()
        for name, t in ref.named_parameters():  # random weights at sane scales
            t.data.normal_(0, 0.5 if t.dim() == 1 or t.shape[0] == 1 else t.shape[-1] ** -0.5)
            if "norm" in name and t.dim() == 1:
                t.data.add_(1.0)
    state = {k: v.cpu() for k, v in z_image_comfy_layout(ref.state_dict()).items()}
    del ref
    host = ZImage.load(TensorSource(state), linears="int8")
    del state
    base = replace(host, blocks=()).to(device)  # everything but the main blocks, placed once
    host_blocks = [GpuBlock.of(b, torch.device("cpu")) for b in host.blocks]
    px = 64 if args.smoke else args.size
    latent = torch.randn(base.arch.latents, px // 8, px // 8, device=device)
    caption = torch.randn(32 if args.smoke else 512, base.arch.text_dim, device=device)
    step = lambda blocks: replace(base, blocks=blocks).output(latent, 0.6429, caption)  # noqa: E731
    if args.trace is not None:
        return trace(host_blocks, step, args.trace, args.steps, device)
    return sweep(f"Z-Image INT8 {px}²", host_blocks, step, args.steps, device, bandwidth)


def h3_stack(args, device, bandwidth) -> list[str]:
    """50 INT8 blocks of hidden 5120 (40 heads of 128), SwiGLU ffn 35072: 4 h² + 3 h ffn = 643.6 M parameters."""
    hidden, heads, ffn, n = (256, 4, 512, 6) if args.smoke else (5120, 40, 35072, args.h3_blocks)
    a = Arch(family="h3-synthetic", hidden=hidden, layers=n, refiner=0, heads=heads, head=hidden // heads,
             ffn=ffn, latents=48, patch=(1, 2, 2), text_dim=hidden, freq_dim=256, time_hidden=hidden,
             time_dim=256, eps=1e-6, qk_eps=1e-6, final_eps=1e-6,
             rope_axes=tuple(hidden // heads * f // 8 for f in (2, 3, 3)), rope_theta=10000.0)
    g = torch.Generator(device=device).manual_seed(0)

    def lin(out: int, k: int) -> GpuLinear:
        w = torch.randint(-127, 128, (out, k), dtype=torch.int8, device=device, generator=g)
        return GpuLinear(w, torch.full((out,), 0.02 / k ** 0.5, device=device), None, 256)

    ones = lambda m: torch.ones(m, device=device)  # noqa: E731
    # Random bytes once (on the device: fast), then a host copy per block: each staged block has its own bytes.
    one = GpuBlock((lin(3 * hidden, hidden), lin(hidden, hidden), lin(2 * ffn, hidden), lin(hidden, ffn),
                    ones(hidden), ones(hidden), ones(a.head), ones(a.head), None, None))
    host_blocks = [_moved(one, torch.device("cpu")) for _ in range(n)]
    del one
    rows = 256 if args.smoke else args.h3_rows
    x0 = torch.randn(rows, hidden, device=device)
    mods = Modulation(*(0.1 * torch.randn(1, hidden, device=device) for _ in range(4)),
                      attn_shift=torch.zeros(1, hidden, device=device))
    pos = torch.stack(torch.meshgrid(torch.arange(rows // 1024 or 1), torch.arange(32), torch.arange(32),
                                     indexing="ij"), -1).reshape(-1, 3)[:rows]
    seq = sequence_of(pos, torch.zeros(rows, dtype=torch.long), a.rope_axes, a.rope_theta).to(device)

    def step(blocks):
        x = x0.clone()
        for block in blocks:
            x = block.forward(a, x, mods, seq)
        return x
    name = f"H3-size stack {n}x{sum(b.weight.numel() for b in host_blocks[0].w[:4]) / 1e6:.0f}M, {rows} rows"
    return sweep(name, host_blocks, step, args.steps, device, bandwidth)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--size", type=int, default=1024, help="Z-Image image size in pixels")
    p.add_argument("--h3-rows", type=int, default=4096)
    p.add_argument("--h3-blocks", type=int, default=50)
    p.add_argument("--only", choices=("z_image", "h3"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    p.add_argument("--trace", type=int, metavar="PERCENT", help="Z-Image: where the time goes at this share")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke and "torchvision" not in sys.modules:
        # CPU torch beside a CUDA torchvision wheel (the dev venv): the ops shim diffusers' import needs, as in tests
        from host.run_comfy import TorchvisionOpsShim
        sys.meta_path.insert(0, TorchvisionOpsShim())
    bandwidth = h2d_bandwidth(device)
    where = "CPU smoke run" if args.smoke else f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(f"# Block streaming, {where}; pinned H2D {bandwidth / 1e9:.1f} GB/s\n")
    print("| model | resident | budget GB | ms / step | vs resident | peak GB | copied GB / step | copy floor ms "
          "| naive ms / step | naive peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if args.only in (None, "z_image"):
        z_image(args, device, bandwidth)
    if args.only in (None, "h3"):
        h3_stack(args, device, bandwidth)


if __name__ == "__main__":
    main()
