"""FLUX.3 Klein (distilled) at 1024x1024, 16 steps, on random weights of the real size: the time of the whole
16-step transformer loop, ours INT8 ConvRot at step cache 0, 0.2 and 0.3 (and ours BF16 at 0) vs diffusers
0.42.1 Flux3Transformer2DModel in BF16 with its own Euler loop, and the same model with ComfyUI's INT8 ConvRot
linears (bench/kitchen_peer.py: stock ComfyUI's INT8 arithmetic), in one run. Each final latent is decoded by a
random FLUX.2 VAE of the real size on the GPU, and the table gives each image's PSNR against ours INT8 at
cache 0 and against diffusers. Issue 6's goal on the H200: <= 0.8 s at cache 0, <= 0.5 s at 0.3.

    python bench/bench_flux3_klein.py [--runs 3] [--caches 0,0.2,0.3] [--no-bf16] [--no-smooth-time-embedding]
    python bench/bench_flux3_klein.py --smoke   # the same code on the CPU, tiny (the kernels' references)
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
import traceback
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dit_core.gpu.block import GpuBlock  # noqa: E402
from dit_core.families.flux3_klein import Flux3Klein  # noqa: E402
from dit_core.sampling.klein import flux_noise, sample_klein  # noqa: E402
from dit_core.sampling.schedules import klein_sigmas  # noqa: E402
from dit_core.sampling.step_cache import StepCache  # noqa: E402
from dit_core.codecs.flux2_vae import Flux2VAE  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from gpu_profile import print_profile  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402
from kitchen_peer import KITCHEN, kitchen_int8  # noqa: E402
from step_variants import add_arguments as add_variant_arguments  # noqa: E402
from step_variants import variants  # noqa: E402

# reference/families/flux3_klein.md section 1: diffusers' class defaults are the real Klein (24 heads x 128 =
# 3072, 5 mode blocks per mode, 28 joint blocks, text rows of 20480, 128-channel packed latents at /16); the
# distilled model is the flow map. Section 8: AutoencoderKLFlux2's defaults are the real FLUX.2 VAE (norm
# groups 32).
REAL, REAL_VAE, REAL_GROUPS = {"flow_map": True}, {}, 32
# --smoke: hidden 64 = 2 heads of 32 (every block linear has a power-of-4 ConvRot group), 128-channel latents
# (the FLUX.2 VAE's packed latents), a tiny VAE.
TINY = {"in_channels": 128, "cond_in_channels": 128, "num_layers": 2, "num_single_layers": 2,
        "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 64,
        "axes_dims_rope": (8, 8, 8, 8), "flow_map": True}
TINY_VAE = {"block_out_channels": (16, 32, 32, 64), "layers_per_block": 1, "norm_num_groups": 4}
TINY_GROUPS = 4
DIFFUSERS = "diffusers BF16 (SDPA)"
INT8_0 = "ours INT8 ConvRot cache 0"
BF16_0 = "ours BF16 cache 0"


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def timed(fn, runs: int, dev: torch.device):
    """fn() once to warm up (kernel compilation, autotuning), then `runs` times: (median s, peak GB the runs
    added above what was allocated before them (nan on the CPU), last output, mean J a run or None). CUDA events on
    the GPU; joules from NVML's counter over the runs (bench/gpu_energy.py)."""
    cuda = dev.type == "cuda"
    out = fn()
    if cuda:
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    energy = energy_reader(dev)
    first = energy() if energy else None
    times = []
    for _ in range(runs):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize(dev)
            times.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(dev) - base) / 1e9 if cuda else float("nan")
    return statistics.median(times), peak, out, (energy() - first) / runs if energy else None


def weights_gb(obj, dev: torch.device) -> float:
    """GB of the distinct tensors on dev's kind of device reachable from obj (dataclasses, dicts, lists,
    tuples; a module's parameters and buffers)."""
    if isinstance(obj, torch.nn.Module):
        obj = list(obj.parameters()) + list(obj.buffers())
    seen, total, stack = set(), 0, [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            if o.device.type == dev.type and o.data_ptr() not in seen:
                seen.add(o.data_ptr())
                total += o.numel() * o.element_size()
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend(getattr(o, f) for f in o.__dataclass_fields__)
    return total / 1e9


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """dB between two images in 0..1 (inf when equal)."""
    mse = (a.double() - b.double()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


# --- the models ---------------------------------------------------------------------------------------------

def random_klein(config: dict, dev: torch.device, dtype: torch.dtype, smooth: bool):
    """diffusers' Flux3Transformer2DModel in dtype with every parameter random at sane scales: matrices normal
    with std fan_in^-0.5, the q/k RMSNorm gains 1 + 0.2 normal (kept in f32, as from_pretrained keeps them).
    smooth: both time embedders read only the slow half of the sinusoids (tests/families/
    test_flux3_klein_sampling.py's model): a random embedder swings the modulation by ~100% between steps
    0.004 apart, so that no step cache limit below ~0.9 ever skips; a trained one is smooth in sigma."""
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from diffusers.utils import logging as diffusers_logging
    torch.manual_seed(0)
    diffusers_logging.set_verbosity_error()  # its warning on .to(dtype): norm_q/norm_k go back to f32 below
    with torch.device(dev):
        model = Flux3Transformer2DModel(**config).to(dtype).eval()
    diffusers_logging.set_verbosity_warning()
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in model._keep_in_fp32_modules:
            module.float()
    for p in model.parameters():
        if p.dim() == 1:  # norm_q, norm_k: the only 1-D parameters (no biases, no affine norms)
            p.normal_(0, 0.2).add_(1.0)
        else:
            p.normal_(0, p.shape[-1] ** -0.5)
    if smooth:
        for te in (model.timestep_embedder, model.target_timestep_embedder):
            # [cos | sin] of the frequencies 10000^(-i/half), fastest first
            half = te.linear_1.weight.shape[1] // 2
            te.linear_1.weight[:, : half // 2] = 0
            te.linear_1.weight[:, half: half + half // 2] = 0
    return model


def random_vae(config: dict, groups: int, dev: torch.device) -> Flux2VAE:
    """Our FLUX.2 VAE on dev, from diffusers' AutoencoderKLFlux2 with random weights at scales that keep the
    image mostly inside 0..1 (conv weights std fan_in^-0.5, small biases, norm gains around 1; at the real
    size about 0.4% of the values clip) and random batch-norm statistics."""
    from diffusers import AutoencoderKLFlux2
    from tiny_models import flux2_vae_bfl_layout
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(**config).eval()
    g = torch.Generator().manual_seed(1)
    for name, p in vae.named_parameters():
        r = torch.randn(p.shape, generator=g)
        if "norm" in name:
            p.copy_(1.0 + 0.1 * r if name.endswith("weight") else 0.1 * r)
        elif name.endswith("bias"):
            p.copy_(0.05 * r)
        else:
            p.copy_(r / p[0].numel() ** 0.5)
    vae.decoder.conv_out.weight.mul_(0.5)
    vae.bn.running_mean.copy_(0.5 * torch.randn(vae.bn.running_mean.shape, generator=g))
    vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=g))
    return Flux2VAE.load(TensorSource(flux2_vae_bfl_layout(vae)), groups=groups).to(dev)


def place(model: Flux3Klein, dev: torch.device) -> Flux3Klein:
    """Ours where it runs. CUDA: Flux3Klein.to (GpuBlocks, the Triton kernels). CPU (--smoke): the same
    GpuBlocks, each kernel falling back to its plain-torch reference, so that the smoke run goes through the
    code the GPU runs."""
    if dev.type == "cuda":
        return model.to(dev)
    gpu = lambda blocks: tuple(GpuBlock.of(b, dev) for b in blocks)  # noqa: E731
    return replace(model, blocks=gpu(model.blocks), mode_blocks={m: gpu(b) for m, b in model.mode_blocks.items()},
                   options=model.default_options())


# --- the samplers -------------------------------------------------------------------------------------------

def diffusers_loop(model, noise: torch.Tensor, sigmas: torch.Tensor, text: torch.Tensor, dtype: torch.dtype):
    """The distilled modular pipeline's loop (Flux3DistilledLoopDenoiser and FlowMatchEulerDiscreteScheduler's
    step): latents in the model dtype, timestep sigma_i and target sigma_{i+1} cast to it, Euler in f32 on the
    raw velocity, cast back; no CFG. Returns the final latent as ours holds it, [128, h, w] f32."""
    c, h, w = noise.shape
    dev = noise.device
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.tensor([0]))
    img_ids = img_ids.float()
    img_ids[:, 1:3] *= 0.5  # Flux3PrepareLatentsStep image_rope_scale
    txt_ids = torch.zeros(text.shape[0], 4)
    txt_ids[:, 3] = torch.arange(text.shape[0])
    img_ids, txt_ids = img_ids.to(dev), txt_ids.to(dev)
    tokens, ctx, sig = noise.reshape(c, -1).t()[None].to(dtype), text[None].to(dtype), sigmas.to(dev)

    def run() -> torch.Tensor:
        x = tokens
        for i in range(len(sig) - 1):
            v = model(hidden_states=x, encoder_hidden_states=ctx, timestep=sig[i:i + 1].to(dtype),
                      img_ids=img_ids, txt_ids=txt_ids, target_timestep=sig[i + 1:i + 2].to(dtype),
                      return_dict=False)[0]
            x = (x.float() + (sig[i + 1] - sig[i]) * v.float()).to(dtype)
        return x[0].float().t().reshape(c, h, w)
    return run


def ours_loop(model: Flux3Klein, noise, sigmas, text, limit: float, kept: list, step=None):
    """sample_klein (f32 latents, as the node runs it) with a fresh StepCache(limit) a run, kept for the
    counts; step: model.graphed() for the CUDA-graph rows (what the sampler node runs on a GPU)."""
    def run() -> torch.Tensor:
        cache = StepCache(limit)
        kept.append(cache)
        return sample_klein(model, noise, sigmas, text, cache=cache, step=step)
    return run


def changes_line(cache: StepCache) -> str:
    """The first joint block's measured change per step, '*' where the step skipped."""
    out = []
    for i, c in enumerate(cache.changes):
        skipped = c is not None and i >= cache.start and c < cache.limit
        out.append("-" if c is None else f"{c:.3f}{'*' if skipped else ''}")
    return " ".join(out)


# --- main ---------------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024, help="image side in pixels (a multiple of 16)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--shift", type=float, default=16.0, help="klein_sigmas' shift (16: BFL's and ComfyUI's)")
    p.add_argument("--text-rows", type=int, default=512, help="text rows (prompts pad to a multiple of 80)")
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up run (median)")
    p.add_argument("--caches", default="0,0.2,0.3", help="our INT8 step cache limits (0 is always run)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="also ours BF16 at 0")
    p.add_argument("--smooth-time-embedding", action=argparse.BooleanOptionalAction, default=True,
                   help="zero the fast half of both time embedders' sinusoid inputs in both models (with "
                        "random embedders the step cache never skips)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="also print the kernels of ours INT8 at cache 0")
    add_variant_arguments(p)
    p.add_argument("--smoke", action="store_true", help="tiny model, 64x64, 3 steps, one run, on the CPU")
    args = p.parse_args(argv)
    caches = sorted({0.0, *(float(c) for c in args.caches.split(","))})
    if args.smoke:
        dev, config, vae_config, groups = torch.device("cpu"), TINY, TINY_VAE, TINY_GROUPS
        size, steps, text_rows, runs = 64, 3, 16, 1
        logging.getLogger("kernels").setLevel(logging.ERROR)  # each kernel's reference fallback: expected
        if "torchvision" not in sys.modules:  # the CPU host's CUDA torchvision wheel (as tests/conftest.py)
            from host.run_comfy import TorchvisionOpsShim
            sys.meta_path.insert(0, TorchvisionOpsShim())
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_flux3_klein: needs a CUDA GPU (or --smoke for the CPU check)")
        dev, config, vae_config, groups = torch.device("cuda"), REAL, REAL_VAE, REAL_GROUPS
        size, steps, text_rows, runs = args.size, args.steps, args.text_rows, args.runs
    dtype = torch.bfloat16
    from tiny_models import flux3_bfl_layout

    t0 = time.perf_counter()
    with torch.no_grad():
        ref = random_klein(config, dev, dtype, args.smooth_time_embedding)
        state = flux3_bfl_layout(ref.state_dict())
        vae = random_vae(vae_config, groups, dev)
    cfg = ref.config
    card = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (--smoke: the kernels' references)"
    width = cfg.num_attention_heads * cfg.attention_head_dim
    params = sum(t.numel() for t in ref.parameters()) / 1e9
    timer = "CUDA events" if dev.type == "cuda" else "perf_counter"
    print(f"# FLUX.3 Klein distilled, {size}x{size} ({(size // 16) ** 2} image + {text_rows} text rows), "
          f"{steps} steps at shift {args.shift:g}, no CFG; random weights, "
          f"{'tiny' if args.smoke else 'real size'}: {cfg.num_attention_heads}x{cfg.attention_head_dim} = "
          f"{width} wide, {cfg.num_layers} mode blocks a mode + {cfg.num_single_layers} joint blocks, text "
          f"rows of {cfg.joint_attention_dim}, {params:.3f} B parameters")
    print(f"# {card}, torch {torch.__version__}, triton {version('triton')}, diffusers "
          f"{version('diffusers')}; median of {runs} runs after a warm-up run ({timer}); setup "
          f"{time.perf_counter() - t0:.0f} s")
    if args.smooth_time_embedding:
        print("# --smooth-time-embedding (on): both models' time embedders (time and target) read only the "
              "slow half of their sinusoids (the fast half's weights zeroed), as tests/families/"
              "test_flux3_klein_sampling.py does, so that the modulation moves between steps as a trained "
              "embedder's does. As drawn, the first block's change is 0.9-1.3 every step and no limit below "
              "~0.9 skips (checked on the CPU at the real width, 2 joint blocks, 128x128). Skip counts here "
              "are of this smoothed random model; real weights will skip differently.", flush=True)
    else:
        print("# --no-smooth-time-embedding: random time embedders as drawn; expect no skipped steps.",
              flush=True)

    noise = flux_noise(args.seed, size, size, channels=cfg.in_channels)[0].to(dev)
    g = torch.Generator().manual_seed(args.seed + 1)
    text = torch.randn(text_rows, cfg.joint_attention_dim, generator=g).bfloat16().float().to(dev)
    sigmas = klein_sigmas(steps, args.shift)
    results = {}  # label -> {s, peak, latent, weights[, cache, skipped]}

    def measure(label: str, fn, weights: float, kept: list | None = None) -> None:
        """Time fn into results[label], with a line at once (a run cut short still reports)."""
        started = time.perf_counter()
        with torch.inference_mode():
            s, peak, latent, joules = timed(fn, runs, dev)
        results[label] = r = {"s": s, "peak": peak, "latent": latent, "weights": weights, "J": joules}
        if kept:
            # The timed runs (not the warm-up): the same inputs, so the same skips; a range if not.
            r["cache"], r["skipped"] = kept[-1], "-".join(map(str, sorted({c.skipped for c in kept[1:]})))
        print(f"{label}: {s:.3f} s / {steps} steps{', skipped ' + r['skipped'] if kept else ''} "
              f"(warm-up + {runs} runs in {time.perf_counter() - started:.0f} s)", flush=True)

    # One shot on the device: a failure is reported and the other contenders still run.
    try:
        measure(DIFFUSERS, diffusers_loop(ref, noise, sigmas, text, dtype), weights_gb(ref, dev))
    except Exception:  # noqa: BLE001
        print(f"{DIFFUSERS} FAILED:\n{traceback.format_exc()}", flush=True)
    try:
        with torch.no_grad():
            kitchen = kitchen_int8(ref, "cuda" if dev.type == "cuda" else "eager")
        measure(KITCHEN, diffusers_loop(kitchen, noise, sigmas, text, dtype), weights_gb(kitchen, dev))
    except Exception as e:  # noqa: BLE001 - (--smoke's tiny linears are narrower than a ConvRot group)
        print(f"{KITCHEN} FAILED: {e}" if args.smoke else f"{KITCHEN} FAILED:\n{traceback.format_exc()}",
              flush=True)
    kitchen = None
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    for mode, limits in (("int8", caches), ("bf16", [0.0] if args.bf16 else [])):
        if not limits:
            continue
        try:
            started = time.perf_counter()
            with torch.no_grad():
                ours = place(Flux3Klein.load(TensorSource(state), linears=mode), dev)
            print(f"ours {mode}: loaded in {time.perf_counter() - started:.0f} s", flush=True)
        except Exception:  # noqa: BLE001
            print(f"ours {mode} FAILED to load:\n{traceback.format_exc()}", flush=True)
            continue
        for limit in limits:
            label = f"ours {'INT8 ConvRot' if mode == 'int8' else 'BF16'} cache {limit:g}"
            try:
                kept = []
                measure(label, ours_loop(ours, noise, sigmas, text, limit, kept), weights_gb(ours, dev), kept)
                if args.profile and dev.type == "cuda" and mode == "int8" and limit == 0:
                    with torch.inference_mode():
                        print_profile(ours_loop(ours, noise, sigmas, text, 0.0, []))
            except Exception:  # noqa: BLE001
                print(f"{label} FAILED:\n{traceback.format_exc()}", flush=True)
            if dev.type != "cuda" or mode != "int8":
                continue
            try:
                kept, graphed = [], f"{label}, CUDA graphs"
                measure(graphed, ours_loop(ours, noise, sigmas, text, limit, kept, ours.graphed()),
                        weights_gb(ours, dev), kept)
                if args.profile and limit == 0:  # inside graphs the kernels run longer than eagerly (clocks)
                    with torch.inference_mode():
                        print_profile(ours_loop(ours, noise, sigmas, text, 0.0, [], ours.graphed()))
                same = label in results and torch.equal(results[graphed]["latent"], results[label]["latent"])
                print(f"{graphed}: latent equal to the eager run's bit for bit: {same}", flush=True)
            except Exception:  # noqa: BLE001
                print(f"{graphed} FAILED:\n{traceback.format_exc()}", flush=True)
            for name, options in variants(args, ours.options):  # the model given other options, graphed anew
                variant, other = f"{label}, {name}, CUDA graphs", replace(ours, options=options)
                try:
                    kept = []
                    measure(variant, ours_loop(other, noise, sigmas, text, limit, kept, other.graphed()),
                            weights_gb(other, dev), kept)
                except Exception:  # noqa: BLE001
                    print(f"{variant} FAILED:\n{traceback.format_exc()}", flush=True)
                finally:
                    other = None
        ours = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not results:
        sys.exit("bench_flux3_klein: every contender failed (above)")

    try:
        with torch.inference_mode():
            for r in results.values():
                r["image"] = vae.decode(r["latent"][None])
    except Exception:  # noqa: BLE001
        print(f"VAE decode FAILED (no PSNR):\n{traceback.format_exc()}", flush=True)
        for r in results.values():
            r["image"] = None
    report(results, steps, args.smoke, dev)
    print(f"total {time.perf_counter() - t0:.0f} s")


def report(results: dict, steps: int, smoke: bool, dev: torch.device) -> None:
    """The markdown table, the step cache's changes, the latents' fidelity, the goal."""
    none = {"s": None, "image": None, "latent": None}
    base, int8 = results.get(DIFFUSERS, none), results.get(INT8_0, none)

    def db(r: dict, other: dict) -> str:
        if r is other:
            return "-"
        if r["image"] is None or other["image"] is None:
            return "n/a"
        v = psnr(r["image"], other["image"])
        return "identical" if v == float("inf") else f"{v:.1f} dB"

    print(f"\n| model{' (smoke, CPU)' if smoke else ''} | s / {steps} steps | vs diffusers | skipped steps | "
          f"PSNR vs INT8 cache 0 | PSNR vs diffusers | weights GB | run peak GB above weights | J / {steps} steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        skipped = f"{r['skipped']} of {steps}" if "cache" in r and r["cache"].limit > 0 else "-"
        speed = "n/a" if base["s"] is None else f"{base['s'] / r['s']:.2f}x"
        peak = "-" if math.isnan(r["peak"]) else f"{r['peak']:.2f}"
        joules = "-" if r["J"] is None else f"{r['J']:.1f}"
        print(f"| {label} | {r['s']:.3f} | {speed} | {skipped} | {db(r, int8)} | {db(r, base)} | "
              f"{r['weights']:.2f} | {peak} | {joules} |")

    print("\nstep cache: the first joint block's relative change per step ('*': skipped)")
    for label, r in results.items():
        if "cache" in r and r["cache"].limit > 0:
            print(f"- {label}: {changes_line(r['cache'])}")
    pairs = [(INT8_0, DIFFUSERS), (BF16_0, DIFFUSERS), (INT8_0, BF16_0), (KITCHEN, DIFFUSERS), (INT8_0, KITCHEN)]
    fidelity = [f"{a} vs {b} {rel(results[a]['latent'], results[b]['latent']):.4f}" for a, b in pairs
                if a in results and b in results]
    if fidelity:
        print(f"\nfinal latents, relative Frobenius: {'; '.join(fidelity)}")
    if int8["image"] is not None:
        clipped = ((int8["image"] <= 0) | (int8["image"] >= 1)).float().mean().item()
        print(f"decoded images: random FLUX.2 VAE ({'tiny' if smoke else 'real size'}, f32 on the "
              f"{dev.type.upper()}), {100 * clipped:.1f}% of {INT8_0}'s values clipped to 0 or 1")
    if not smoke and int8["s"] is not None:
        # The sampler node's path on a GPU: the CUDA-graph rows where they ran.
        best = lambda label: results.get(f"{label}, CUDA graphs", results.get(label, none))["s"]  # noqa: E731
        at0, at3 = best(INT8_0), best("ours INT8 ConvRot cache 0.3")
        goal = f"goal (H200): <= 0.8 s at cache 0: {at0:.3f} s, {'met' if at0 <= 0.8 else 'NOT met'}"
        if at3 is not None:
            goal += f"; <= 0.5 s at cache 0.3: {at3:.3f} s, {'met' if at3 <= 0.5 else 'NOT met'}"
        print(goal)


if __name__ == "__main__":
    main()
