"""One Krea 2 transformer step at 1024x1024 (4096 image rows + 512 text rows of 12 tapped layers) on random weights
of the real size: ours INT8 ConvRot and ours BF16 (eager; attention by the GPU block's plain path: grouped-query
heads and the sigmoid gate) vs diffusers 0.42.1 Krea2Transformer2DModel in BF16 with SDPA, in one run; then ours
INT8 as our sampler steps (the text fusion run once a sampler run, where diffusers' forward runs it every step),
eager and replayed from a CUDA graph. Prints a markdown table (median ms over timed steps with CUDA events, peak
memory of the step, weights, joules) and the fidelity of each step against diffusers' model cast to f32.

The table's rows give both models 512 valid text rows. A real prompt is shorter: diffusers' pipeline pads every
prompt to 512 text rows and attends with a padding mask (its attention then leaves the mask-free kernels), while
our sampler keeps the prompt's rows only (the masked ones are never keys: exact). --prompt-tokens N (default 77)
times one step of each as its pipeline runs an N-token prompt, and the image rows' distance between the two.
--no-peer: ours INT8 alone (no diffusers), for the device runs that carry the server's packages.

    python bench/bench_krea2_step.py [--steps 5] [--layers 28] [--prompt-tokens 77] [--new-lengths] [--sampler-runs]
                                     [--no-peer]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_z_image_step import print_table, rel, timed, weights_gb  # noqa: E402
from dit_core.families.krea2 import Krea2  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from gpu_profile import print_host_profile, print_profile  # noqa: E402


def random_reference(layers: int, vector_std: float):
    """diffusers' Krea 2 in BF16 on the GPU with random weights at sane scales: matrices N(0, 1/fan_in), the
    modulation tables, zero-centred norm weights and biases N(0, vector_std)."""
    from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = Krea2Transformer2DModel(num_layers=layers).to(torch.bfloat16).eval()
        for name, t in ref.named_parameters():
            vector = t.dim() == 1 or "scale_shift_table" in name or "projector" in name
            t.data.normal_(0, vector_std if vector else t.shape[-1] ** -0.5)
    return ref


def random_state(layers: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The template file's tensors (tests/fixtures/real_size_shapes.json) in BF16 with tests/real_size.py's random
    values, the blocks past `layers` left out: our step without diffusers (--no-peer: the server's carry)."""
    from real_size import SHAPES, random_tensor
    shapes = json.loads(SHAPES.read_text())["krea2_turbo_int8_convrot.safetensors"]
    return {k: random_tensor(k, shape, device).bfloat16() for k, (shape, _) in shapes.items()
            if not k.startswith("blocks.") or int(k.split(".")[1]) < layers}


def first_steps(ours, graphed, latent, sigma, text, tokens: int) -> None:
    """Wall ms of the first two eager steps at each of two prompt lengths not run before: a new length is a new
    shape of every kernel and of the attention (the sampler's step at a new prompt). The second length's first
    step's host functions are printed. Then the graphed step's first calls at a third new length: the first call's
    excess over a replay is what capturing a new prompt's length costs (GraphedStep's "host_bound" policy weighs
    it against what the replays save)."""
    import time

    def wall_ms(call):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for n in (tokens + 1, tokens + 2):
        rows = ours.text_rows(text, torch.arange(512, device="cuda") < n)
        step = functools.partial(ours.velocity, latent, sigma, rows)
        if n == tokens + 2:
            print(f"\n## the first step at {n} prompt rows, host functions")
            print_host_profile(step)
            first = float("nan")
        else:
            first = wall_ms(step)
        print(f"{n} prompt rows, not run before: the first eager step {first:.1f} ms, the second {wall_ms(step):.1f} "
              f"ms, the third {wall_ms(step):.1f}", flush=True)
    n = tokens + 3
    rows = ours.text_rows(text, torch.arange(512, device="cuda") < n)
    graphed.clear()
    calls = [wall_ms(lambda: graphed(latent, sigma, rows)) for _ in range(4)]
    print(f"{n} prompt rows, not run before, CUDA graph: the first call (eager warm-up, capture, replay) "
          f"{calls[0]:.1f} ms, then {', '.join(f'{c:.1f}' for c in calls[1:])}", flush=True)


def sampler_runs(ours: Krea2, text: torch.Tensor, size: int, tokens: int) -> None:
    """The sampler node's work in process (nodes/krea2.py Krea2Sampler.sampling: ksample, 8 euler steps on the simple
    grid, cfg 1, the text fused once a conditioning by the host_bound graphed step), in inference mode as ComfyUI runs
    nodes: wall seconds of a prompt of a length not run before (a new prompt), of the same prompt with a new seed (the
    same conditioning tensor, as ComfyUI's cache hands it on), and of another new prompt of the same length; then the
    GPU kernels and the host functions of a new prompt's run, where its excess goes."""
    import time

    from dit_core.families.krea2 import SAMPLING_MU, latent_format
    from dit_core.sampling.ksampler import ksample
    from dit_core.sampling.schedules import flux_sigma_table
    step = ours.graphed(capture="host_bound")
    shift, scale = latent_format()
    channels = ours.arch.latents
    empty = torch.zeros(1, channels, size // 8, size // 8, device="cuda")

    def run(cond: torch.Tensor, seed: int):  # cond [1, L, taps, dim]: a prompt's conditioning
        fused = {}

        def denoise_with(x, sigma, c):
            if id(c) not in fused:
                fused[id(c)] = (c, torch.stack([step.text_rows(r, torch.float32) for r in c]))
            return ours.denoised(x, float(sigma), fused[id(c)][1], step=step)
        return lambda: ksample(denoise_with, seed, 8, 1.0, "euler", "simple", empty, positive=cond, negative=cond,
                               latent_shift=shift, latent_scale=scale, latent_channels=channels,
                               sigma_table=flux_sigma_table(SAMPLING_MU))

    def wall_s(call):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def prompt(n: int, offset: float = 0.0) -> torch.Tensor:  # another tensor of a length: another prompt
        return (text[:n] + offset)[None]

    print("\n## the sampler node's run in process (8 steps), seconds")
    with torch.inference_mode():
        for n in (tokens + 10, tokens + 20):
            cond = prompt(n)
            print(f"{n} prompt rows: a new length {wall_s(run(cond, 0)):.3f} s, the same prompt with a new seed "
                  f"{wall_s(run(cond, 1)):.3f}, another prompt of that length {wall_s(run(prompt(n, 0.01), 2)):.3f}",
                  flush=True)
        print(f"\n## a new length's run ({tokens + 30} prompt rows): kernels")
        print_profile(run(prompt(tokens + 30), 0))
        print(f"\n## a new length's run ({tokens + 40} prompt rows): host functions")
        print_host_profile(run(prompt(tokens + 40), 0))
    step.clear()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--vector-std", type=float, default=0.1)
    p.add_argument("--profile", action="store_true", help="also print the kernels of one INT8 step, by GPU time")
    p.add_argument("--prompt-tokens", type=int, default=77, help="also a step as each pipeline runs a prompt of this "
                   "many tokens (0: not)")
    p.add_argument("--attention-8bit", action="store_true", help="also the graphed INT8 step with both attention "
                   "products on 8 bits (Options.attention_8bit)")
    p.add_argument("--new-lengths", action="store_true", help="also the first eager steps at prompt lengths not "
                   "run before (what a new prompt costs beyond its step), the second's host functions profiled")
    p.add_argument("--norm-passes", action="store_true", help="also the graphed INT8 step with each norm's row "
                   "statistics made by a pass of their own (Options.carry_norms off: before the gated epilogues "
                   "wrote them)")
    p.add_argument("--sampler-runs", action="store_true", help="also the sampler node's 8-step run in process: a "
                   "new prompt length, the same prompt, another prompt of that length, and a new one's profiles")
    p.add_argument("--no-peer", action="store_true", help="ours alone, on random weights of the file's list (no "
                   "diffusers: the device's server carry); no fidelity lines")
    args = p.parse_args(argv)
    from tiny_models import krea2_original_layout

    g = args.size // 16
    latent = torch.randn(16, 2 * g, 2 * g, device="cuda")
    text = torch.randn(512, 12, 2560, device="cuda")
    sigma = 0.6546
    print(f"# Krea 2 step, {args.size}x{args.size} ({g * g} image + 512 text rows), {args.layers} layers, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; random vectors N(0, {args.vector_std})")
    tokens = latent.reshape(1, 16, g, 2, g, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, g * g, 64)
    ids = torch.zeros(512 + g * g, 3, device="cuda")
    ids[512:, 1:] = torch.cartesian_prod(torch.arange(g), torch.arange(g)).float().cuda()

    prompt = torch.arange(512, device="cuda") < args.prompt_tokens  # the prompt's rows; the rest its padding

    def diffusers_step(model, dtype=torch.bfloat16, mask=None):
        with torch.no_grad():
            out = model(hidden_states=tokens.to(dtype), encoder_hidden_states=text[None].to(dtype),
                        encoder_attention_mask=None if mask is None else mask[None],
                        timestep=torch.tensor([sigma], device="cuda"), position_ids=ids, return_dict=False)[0]
        return out[0].float().reshape(g, g, 16, 2, 2).permute(2, 0, 3, 1, 4).reshape(16, 2 * g, 2 * g)

    results, as_run = {}, {}  # as_run: a short prompt as each pipeline runs it: label -> timed's result
    if args.no_peer:
        ref, state = None, random_state(args.layers, torch.device("cuda"))
    else:
        ref = random_reference(args.layers, args.vector_std)
        results["diffusers BF16 (SDPA)"] = (*timed(lambda: diffusers_step(ref), args.steps),
                                            weights_gb(list(ref.parameters())))
        if args.prompt_tokens:
            as_run["diffusers BF16, 512 rows masked"] = timed(lambda: diffusers_step(ref, mask=prompt), args.steps)
        state = krea2_original_layout(ref.state_dict())  # on the GPU: the INT8 quantization at load runs there
    for mode, label in (("int8", "ours INT8 ConvRot"), ("bf16", "ours BF16"))[:1 if args.no_peer else 2]:
        ours = Krea2.load(TensorSource(state), linears=mode).to("cuda")
        step = functools.partial(ours.output, latent, sigma, text)
        with torch.no_grad():
            results[label] = (*timed(step, args.steps), weights_gb(ours))
            if args.profile and mode == "int8":
                print_profile(step, host=True)
            if mode == "int8":  # the step as our sampler runs it: the text fused once a run, then graphed
                txt = ours.text_rows(text)
                results[f"{label}, text fused once a run"] = (
                    *timed(functools.partial(ours.velocity, latent, sigma, txt), args.steps), weights_gb(ours))
                graphed = ours.graphed()
                results[f"{label}, text fused once, CUDA graph"] = (
                    *timed(lambda: graphed(latent, sigma, txt), args.steps), weights_gb(ours))
                if args.prompt_tokens:
                    short = ours.text_rows(text, prompt)
                    graphed.clear()
                    as_run[f"ours INT8, the prompt's {args.prompt_tokens} rows, CUDA graph"] = timed(
                        lambda: graphed(latent, sigma, short), args.steps)
                    del short
                if args.new_lengths:
                    first_steps(ours, graphed, latent, sigma, text, args.prompt_tokens)
                graphed.clear()
                if args.sampler_runs:
                    sampler_runs(ours, text, args.size, args.prompt_tokens)
                variants = {"norm statistics by passes of their own": ({"carry_norms": False}, args.norm_passes),
                            "8-bit attention": ({"attention_8bit": True}, args.attention_8bit)}
                for name, (change, asked) in variants.items():
                    if asked:  # the graphed step with other options, in the same run
                        graphed = dataclasses.replace(
                            ours, options=dataclasses.replace(ours.options, **change)).graphed()
                        results[f"{label}, text fused once, CUDA graph, {name}"] = (
                            *timed(lambda: graphed(latent, sigma, txt), args.steps), weights_gb(ours))
                        graphed.clear()
                del txt, graphed
        del ours, step
        torch.cuda.empty_cache()
    print_table(results)
    if ref is None:
        return
    if as_run:
        (theirs, _, theirs_out, _), (mine, _, ours_out, _) = as_run.values()
        print(f"\nA {args.prompt_tokens}-token prompt as each pipeline runs it: diffusers {theirs:.1f} ms (512 text "
              f"rows, masked), ours {mine:.1f} ms (the prompt's rows, graphed): {theirs / mine:.2f}x; ours against "
              f"diffusers' image rows: {rel(ours_out, theirs_out):.4f}")
    del state
    torch.cuda.empty_cache()
    truth = diffusers_step(ref.float(), torch.float32)
    out = {label: r[2] for label, r in results.items()}
    print(f"\nfidelity (relative Frobenius): INT8 vs our BF16 {rel(out['ours INT8 ConvRot'], out['ours BF16']):.4f}; "
          f"against the f32 step: ours INT8 {rel(out['ours INT8 ConvRot'], truth):.4f}, ours BF16 "
          f"{rel(out['ours BF16'], truth):.4f}, diffusers BF16 {rel(out['diffusers BF16 (SDPA)'], truth):.4f}")
    eight = out.get("ours INT8 ConvRot, text fused once, CUDA graph, 8-bit attention")
    if eight is not None:
        print(f"8-bit attention: against the f32 step {rel(eight, truth):.4f}, against our BF16 "
              f"{rel(eight, out['ours BF16']):.4f}")


if __name__ == "__main__":
    main()
