"""One Z-Image Turbo transformer step at 1024x1024 (4096 image rows + a 512-row caption) on random weights of the
real size: ours INT8 ConvRot and ours BF16 vs diffusers 0.42.1 ZImageTransformer2DModel in BF16 with SDPA, in one
run. Prints a markdown table (median ms over timed steps with CUDA events, peak memory of the step) and the
fidelity of the INT8 step against the BF16 step.

    python bench/bench_z_image_step.py [--steps 10] [--layers 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dit_core.families.z_image import ZImage  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402


def timed(fn, steps: int) -> tuple[float, float, torch.Tensor]:
    """Median ms of fn() over `steps` runs after 3 warm-ups, and the peak GPU memory it added (GB)."""
    for _ in range(3):
        out = fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 1e9, out


def weights_gb(model) -> float:
    seen, total = set(), 0
    stack = [model]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if obj.is_cuda and obj.data_ptr() not in seen:
                seen.add(obj.data_ptr())
                total += obj.numel() * obj.element_size()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dataclass_fields__"):
            stack.extend(getattr(obj, f) for f in obj.__dataclass_fields__)
    return total / 1e9


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def print_profile(step) -> None:
    """The GPU kernels of one step, grouped by name, most time first: where the milliseconds go."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--profile", action="store_true", help="also print the kernels of one INT8 step, by GPU time")
    args = p.parse_args(argv)
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    from tiny_models import z_image_comfy_layout

    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = ZImageTransformer2DModel(n_layers=args.layers).to(torch.bfloat16).eval()
        for name, t in ref.named_parameters():  # random weights at sane scales (init leaves pads/gains at 0/1)
            t.data.normal_(0, 0.5 if t.dim() == 1 or t.shape[0] == 1 else t.shape[-1] ** -0.5)
            if "norm" in name and t.dim() == 1:
                t.data.add_(1.0)
    latent = torch.randn(16, args.size // 8, args.size // 8, device="cuda")
    caption = torch.randn(512, 2560, device="cuda")
    sigma = 0.6429
    rows = (args.size // 16) ** 2 + 512
    print(f"# Z-Image step, {args.size}x{args.size} ({rows} rows), {args.layers} layers, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")

    def diffusers_step():
        with torch.no_grad():
            return ref(x=[latent[:, None].bfloat16()], t=torch.tensor([1 - sigma], device="cuda"),
                       cap_feats=[caption.bfloat16()], return_dict=False)[0][0][:, 0].float()

    results = {"diffusers BF16 (SDPA)": (*timed(diffusers_step, args.steps), weights_gb(list(ref.parameters())))}
    state = z_image_comfy_layout(ref.state_dict())
    for mode, label in (("int8", "ours INT8 ConvRot"), ("bf16", "ours BF16")):
        ours = ZImage.load(TensorSource(state), linears=mode).to("cuda")
        with torch.no_grad():
            results[label] = (*timed(lambda: ours.output(latent, sigma, caption), args.steps), weights_gb(ours))
            if args.profile and mode == "int8":
                print_profile(lambda: ours.output(latent, sigma, caption))
        del ours
        torch.cuda.empty_cache()
    base = results["diffusers BF16 (SDPA)"][0]
    print("| model | ms / step | vs diffusers | step peak GB (above weights) | weights GB |")
    print("|---|---|---|---|---|")
    for label, (ms, peak, _, wgb) in results.items():
        print(f"| {label} | {ms:.1f} | {base / ms:.2f}x | {peak:.2f} | {wgb:.2f} |")
    ref_out = results["diffusers BF16 (SDPA)"][2]
    print(f"\nfidelity: INT8 vs our BF16 {rel(results['ours INT8 ConvRot'][2], results['ours BF16'][2]):.4f}, "
          f"our BF16 vs diffusers BF16 {rel(results['ours BF16'][2], ref_out):.4f}, "
          f"INT8 vs diffusers {rel(results['ours INT8 ConvRot'][2], ref_out):.4f} (relative Frobenius)")


if __name__ == "__main__":
    main()
