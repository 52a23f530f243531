"""One Z-Image Turbo transformer step at 1024x1024 (4096 image rows + a 512-row caption) on random weights of the
real size: ours INT8 ConvRot (eager, replayed from a CUDA graph, and optionally with other MLP chunks) and ours BF16
vs diffusers 0.42.1 ZImageTransformer2DModel in BF16 with SDPA, and the same model with its blocks' linears run by
ComfyUI's own INT8 ConvRot linear (comfy-kitchen 0.2.40's CUDA int8_linear: stock ComfyUI's arithmetic), in one run.
Prints a markdown table (median ms over timed steps with CUDA events, peak memory of the step) and the fidelity of
each INT8 step against the BF16 steps (of the BF16 weights, and of the INT8 weights turned back to BF16: the INT8
arithmetic's own error) and the f32 step.

    python bench/bench_z_image_step.py [--steps 10] [--layers 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dit_core.families.z_image import ZImage  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402
from gpu_profile import print_profile  # noqa: E402
from kitchen_peer import KITCHEN, kitchen_int8  # noqa: E402
from step_variants import add_arguments as add_variant_arguments  # noqa: E402
from step_variants import variants  # noqa: E402


SAME_WEIGHTS = "ours BF16 of the INT8 weights"


def timed(fn, steps: int) -> tuple:
    """Median ms of fn() over `steps` runs after 3 warm-ups, the peak GPU memory it added (GB), the last output, and
    the mean joules a run (NVML's counter, bench/gpu_energy.py; None without it)."""
    for _ in range(3):
        out = fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    energy = energy_reader(torch.device("cuda", torch.cuda.current_device()))
    first = energy() if energy else None
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    joules = (energy() - first) / steps if energy else None
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 1e9, out, joules


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


def print_table(results: dict) -> None:
    """The markdown table of timed's results {label: (ms, peak GB, output, joules, weights GB)}, against the
    diffusers BF16 row where there is one."""
    base = results.get("diffusers BF16 (SDPA)", (None,))[0]
    print("| model | ms / step | vs diffusers | step peak GB (above weights) | weights GB | J / step |")
    print("|---|---|---|---|---|---|")
    for label, (ms, peak, _, joules, wgb) in results.items():
        energy = "-" if joules is None else f"{joules:.1f}"
        ratio = "-" if base is None else f"{base / ms:.2f}x"
        print(f"| {label} | {ms:.1f} | {ratio} | {peak:.2f} | {wgb:.2f} | {energy} |")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def random_reference(layers: int, vector_std: float):
    """diffusers' Z-Image in BF16 on the GPU with random weights at sane scales: matrices N(0, 1/fan_in), vectors
    (biases, norm gains around 1, pads) N(0, vector_std) (init leaves pads and gains at 0 and 1)."""
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = ZImageTransformer2DModel(n_layers=layers).to(torch.bfloat16).eval()
        for name, t in ref.named_parameters():
            t.data.normal_(0, vector_std if t.dim() == 1 or t.shape[0] == 1 else t.shape[-1] ** -0.5)
            if "norm" in name and t.dim() == 1:
                t.data.add_(1.0)
    return ref


def dequantized(model: ZImage) -> ZImage:
    """The model with every block's INT8 linears as BF16 weights (ZImage.load's 'bf16' of an INT8 file)."""
    blocks = lambda bs: tuple(b.dequantized(torch.bfloat16) for b in bs)  # noqa: E731
    return replace(model, context=blocks(model.context), noise=blocks(model.noise), blocks=blocks(model.blocks))


def fidelity_line(ref, outputs: dict, step) -> str:
    """Each output against the f32 step (diffusers' model cast to f32: the reference all are rounded from)."""
    with torch.no_grad():
        truth = step(ref.float(), torch.float32)
    int8, bf16, diffusers = outputs["ours INT8 ConvRot"], outputs["ours BF16"], outputs["diffusers BF16 (SDPA)"]
    same = outputs[SAME_WEIGHTS]
    line = (f"INT8 vs our BF16 {rel(int8, bf16):.4f}; INT8 vs our BF16 of the same INT8 weights {rel(int8, same):.4f}; "
            f"against the f32 step: ours INT8 {rel(int8, truth):.4f}, ours BF16 {rel(bf16, truth):.4f}, ours BF16 of "
            f"the INT8 weights {rel(same, truth):.4f}, diffusers BF16 {rel(diffusers, truth):.4f}")
    if KITCHEN in outputs:  # ComfyUI's INT8 arithmetic in the same model: the format's own error
        kitchen = outputs[KITCHEN]
        line += (f"; kitchen INT8 vs diffusers BF16 {rel(kitchen, diffusers):.4f}, against the f32 step "
                 f"{rel(kitchen, truth):.4f}, ours INT8 vs kitchen INT8 {rel(int8, kitchen):.4f}")
    return line


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--profile", action="store_true", help="also print the kernels of one INT8 step, by GPU time")
    add_variant_arguments(p)
    p.add_argument("--vector-std", type=float, default=0.5, help="std of the random biases/gains (timed model)")
    p.add_argument("--also-vector-std", type=float, nargs="*", default=[0.1],
                   help="fidelity (no timing) of models drawn with these vector stds too")
    args = p.parse_args(argv)
    from tiny_models import z_image_comfy_layout

    ref = random_reference(args.layers, args.vector_std)
    latent = torch.randn(16, args.size // 8, args.size // 8, device="cuda")
    caption = torch.randn(512, 2560, device="cuda")
    sigma = 0.6429
    rows = (args.size // 16) ** 2 + 512
    print(f"# Z-Image step, {args.size}x{args.size} ({rows} rows), {args.layers} layers, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; random vectors N(0, {args.vector_std})")

    def diffusers_step(model, dtype=torch.bfloat16):
        with torch.no_grad():
            return model(x=[latent[:, None].to(dtype)], t=torch.tensor([1 - sigma], device="cuda"),
                         cap_feats=[caption.to(dtype)], return_dict=False)[0][0][:, 0].float()

    def ours_models(state):
        """Ours INT8 (the BF16 weights quantized at load, as an INT8 ConvRot file holds them), ours BF16 of the BF16
        weights, and (untimed) ours BF16 of the INT8 weights: what the INT8 arithmetic alone changes."""
        int8 = ZImage.load(TensorSource(state), linears="int8")
        for label, host in (("ours INT8 ConvRot", int8), ("ours BF16", ZImage.load(TensorSource(state), "bf16")),
                            (SAME_WEIGHTS, dequantized(int8))):
            ours = host.to("cuda")
            yield label, ours, lambda: ours.output(latent, sigma, caption)
            del ours
            torch.cuda.empty_cache()

    results = {"diffusers BF16 (SDPA)": (*timed(lambda: diffusers_step(ref), args.steps),
                                         weights_gb(list(ref.parameters())))}
    try:  # a failure of the peer is reported; the other rows stand
        kitchen = kitchen_int8(ref)
        results[KITCHEN] = (*timed(lambda: diffusers_step(kitchen), args.steps),
                            weights_gb(list(kitchen.parameters()) + list(kitchen.buffers())))
    except Exception:  # noqa: BLE001
        print(f"{KITCHEN} FAILED:\n{traceback.format_exc()}", flush=True)
    kitchen = None
    torch.cuda.empty_cache()
    for label, ours, step in ours_models(z_image_comfy_layout(ref.state_dict())):
        if label == SAME_WEIGHTS:
            with torch.no_grad():
                same_weights = step()
            continue
        with torch.no_grad():
            results[label] = (*timed(step, args.steps), weights_gb(ours))
            if args.profile and label == "ours INT8 ConvRot":
                print_profile(step)
            if label == "ours INT8 ConvRot":  # the same step replayed from a CUDA graph (dit_core/gpu/step_graph.py)
                graphed = ours.graphed()
                replay = lambda: graphed(latent, sigma, caption)  # noqa: E731
                results[label + ", CUDA graph"] = (*timed(replay, args.steps), weights_gb(ours))
                same = torch.equal(results[label + ", CUDA graph"][2], results[label][2])
                print(f"CUDA graph replay equals the eager INT8 step bit for bit: {same}", flush=True)
                if args.profile:  # the kernels inside one replay: their time against the eager step's above
                    print("one replay of the CUDA graph:")
                    print_profile(replay)
                del graphed, replay
                # The same graphed step under each asked variant of the options (the model given them, captured
                # anew; the blocks shared).
                for name, options in variants(args, ours.options):
                    graphed = None
                    try:
                        graphed = replace(ours, options=options).graphed()
                        variant = f"{label}, {name}, CUDA graph"
                        results[variant] = (*timed(lambda: graphed(latent, sigma, caption), args.steps),
                                            weights_gb(ours))
                        diff = (results[variant][2] - results[label][2]).norm() / results[label][2].norm()
                        print(f"{name}: step relative to the default's {diff.item():.2e}", flush=True)
                    except Exception:  # noqa: BLE001 - a failing variant is a finding; the other rows stand
                        print(f"{name} FAILED:\n{traceback.format_exc()}", flush=True)
                    finally:
                        graphed = None
    print_table(results)
    outputs = {label: r[2] for label, r in results.items()} | {SAME_WEIGHTS: same_weights}
    print(f"\nfidelity (relative Frobenius), vectors N(0, {args.vector_std}): "
          f"{fidelity_line(ref, outputs, diffusers_step)}")
    for std in args.also_vector_std:
        del ref
        torch.cuda.empty_cache()
        ref = random_reference(args.layers, std)
        outputs = {"diffusers BF16 (SDPA)": diffusers_step(ref)}
        try:  # as above: without the peer, the other figures stand
            outputs[KITCHEN] = diffusers_step(kitchen_int8(ref))
        except Exception:  # noqa: BLE001
            print(f"{KITCHEN} FAILED:\n{traceback.format_exc(limit=1)}", flush=True)
        torch.cuda.empty_cache()
        for label, _, step in ours_models(z_image_comfy_layout(ref.state_dict())):
            with torch.no_grad():
                outputs[label] = step()
        print(f"fidelity (relative Frobenius), vectors N(0, {std}): {fidelity_line(ref, outputs, diffusers_step)}")


if __name__ == "__main__":
    main()
