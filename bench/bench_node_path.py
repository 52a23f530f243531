"""A Z-Image Turbo step at 1024x1024 as the engine runs it and as the sampler node runs it (the node path:
dit_core.sampling.ksampler.model_on_device under torch.inference_mode, the latent on the card and the text rows
on the host as the node has them, the graphed step
where the allocator allows it), on host/checkpoints.py's real-size random files (30 layers, BF16 and INT8
ConvRot), in one process under its allocator. Run it once as is and once with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
(ComfyUI's default): the rows say what each costs.

    python bench/bench_node_path.py [--runs 10] [--steps 8]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dit_core.families.z_image import ZImage  # noqa: E402
from dit_core.codecs.flux1_vae import SCALING, SHIFT  # noqa: E402
from dit_core.sampling.ksampler import ksample, model_on_device  # noqa: E402
from dit_core.gpu.step_graph import capture_refusal  # noqa: E402
from host import checkpoints  # noqa: E402


def median_ms(fn, runs: int) -> float:
    """Median wall ms of fn() to its last kernel's end, after two warm-ups (builds, tuning, captures)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--steps", type=int, default=8, help="the node path's sampler steps (the template's 8)")
    args = p.parse_args(argv)
    files = checkpoints.ensure(layers=30, device="cuda").root / "diffusion_models"
    caption = torch.randn(64, checkpoints.TE_HIDDEN, device="cuda")  # the set's text width; a short prompt's rows
    latent = torch.randn(16, 128, 128, device="cuda")
    print(f"# Z-Image step at 1024x1024, {torch.cuda.get_device_name()}, torch {torch.__version__}, allocator "
          f"{torch.cuda.get_allocator_backend()}; CUDA graphs: {capture_refusal() or 'on'}")
    print("| file | engine, eager (ms) | engine, graphed step (ms) | node path, a step of "
          f"{args.steps} (ms) |\n|---|---|---|---|")
    for name in (checkpoints.DIT_BF16, checkpoints.DIT_INT8):
        eager, graphed, node = timings(ZImage.load(files / name).to("cuda"), latent, caption, args)
        print(f"| {name} | {eager:.1f} | {graphed:.1f} | {node:.1f} |", flush=True)
        torch.cuda.empty_cache()


@torch.inference_mode()
def timings(dit: ZImage, latent: torch.Tensor, caption: torch.Tensor, args) -> tuple[float, float, float]:
    """ms of the engine's eager step, of its graphed step, and of a step of the node path (a whole sampler run
    over args.steps, the sampler on the card as the node runs it, the text rows from the host, divided by the
    steps), under inference mode."""
    eager = median_ms(lambda: dit.output(latent, 0.6429, caption), args.runs)
    step = dit.graphed()
    graphed = median_ms(lambda: step(latent, 0.6429, caption), args.runs)
    empty, host_caption = torch.zeros(1, 16, *latent.shape[1:], device=latent.device), caption[None].cpu()
    node = median_ms(lambda: ksample(model_on_device(dit.denoised, latent.device, step=step), 0, args.steps, 1.0,
                                     "res_multistep", "simple", empty, positive=host_caption,
                                     negative=host_caption * 0, shift=3.0, latent_shift=SHIFT,
                                     latent_scale=SCALING), max(2, args.runs // 4)) / args.steps
    step.clear()
    return eager, graphed, node


if __name__ == "__main__":
    main()
