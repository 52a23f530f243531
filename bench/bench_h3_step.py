"""One MiniMax H3 transformer step at the t2v template's size (864x480, 124 frames: 37 x 405 video rows, 2 x 207
audio rows, a 512-row prompt) on random weights of the real size (33 B): diffusers 0.42.1 MiniMaxH3Transformer3DModel
in BF16 with SDPA, then ours INT8 ConvRot resident and ours INT8 with its layers streamed within a GPU budget (16 GiB
by default, the issue's card), in one run. Prints a markdown table (median ms over timed steps with CUDA events,
peak memory of the step, device weights, joules) and the INT8 step's distance from diffusers' BF16 step.

    python bench/bench_h3_step.py [--steps 3] [--layers 50] [--budget-gb 16]

Memory on an H200: diffusers' BF16 model (66 GB) is timed and freed before ours is made from its tensors (the
INT8 quantization at load runs on the GPU); the streamed model's layers wait in page-locked host memory (33 GB)."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_z_image_step import print_table, rel, timed, weights_gb  # noqa: E402
from dit_core.families.minimax_h3 import MiniMaxH3, packed_layout, row_times  # noqa: E402
from dit_core.gpu.streaming import pass_bytes  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402

GIB = 1 << 30


def random_reference(layers: int, vector_std: float):
    """diffusers' H3 in BF16 on the GPU with random weights at sane scales: matrices N(0, 1/fan_in), norm gains
    1 + N(0, vector_std), other vectors N(0, vector_std)."""
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Transformer3DModel
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = MiniMaxH3Transformer3DModel(num_layers=layers).to(torch.bfloat16).eval()
        for name, t in ref.named_parameters():
            if t.dim() == 1:
                t.data.normal_(1.0 if "norm" in name else 0.0, vector_std)
            else:
                t.data.normal_(0, t.shape[-1] ** -0.5)
    return ref


def moved(obj, device):
    """A dataclass/tuple tree with every tensor on device (the host copy a streamed model stages from)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: moved(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple):
        return tuple(moved(item, device) for item in obj)
    return obj


def diffusers_timed(args, layout, video, audio, text, times, index) -> dict:
    """diffusers' step timed (timed's tuple under "result"), then its weights in the Comfy-Org file's layout, the
    model itself freed."""
    from tiny_models import minimax_h3_comfy_layout
    ref = random_reference(args.layers, args.vector_std)
    cuda = lambda t: t.cuda()  # noqa: E731

    def diffusers_step():
        with torch.no_grad():
            v, _ = ref(hidden_states=video[None].bfloat16(), audio_hidden_states=audio[None].bfloat16(),
                       encoder_hidden_states=text[None].bfloat16(), timestep=cuda(times),
                       timestep_indices=cuda(index), token_tags=cuda(layout.tags),
                       position_ids=cuda(layout.positions), video_indices=cuda(layout.video_rows),
                       audio_indices=cuda(layout.audio_rows), text_indices=cuda(torch.arange(layout.text)),
                       return_dict=False)
        return v[0].float()

    result = (*timed(diffusers_step, args.steps), weights_gb(list(ref.parameters())))
    state = minimax_h3_comfy_layout(ref)
    ref = None  # the tensors ours is made from stay in state; the rest goes
    torch.cuda.empty_cache()
    return {**state, "result": result}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--width", type=int, default=864)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--frames", type=int, default=124, help="pixel frames, 17n + 5")
    p.add_argument("--text", type=int, default=512, help="prompt rows")
    p.add_argument("--budget-gb", type=float, default=16.0, help="the streamed row's GPU budget (0: no such row)")
    p.add_argument("--vector-std", type=float, default=0.1)
    args = p.parse_args(argv)

    latent_frames, lh, lw = (args.frames - 5) // 17 * 5 + 2, args.height // 16, args.width // 16
    audio_latents = round(args.frames / 24 * 40)
    layout = packed_layout(args.text, latent_frames, lh, lw, audio_latents)
    g = torch.Generator().manual_seed(1)
    video = torch.randn(layout.video, 96, generator=g).cuda()
    audio = torch.randn(layout.audio, 32, generator=g).cuda()
    text = torch.randn(layout.text, 5120, generator=g).cuda()
    times, index = row_times(layout, 0.4, 1 - 0.55)
    print(f"# MiniMax H3 step, {args.width}x{args.height}x{args.frames} ({layout.video} video + {layout.audio} "
          f"audio + {layout.text} text rows), {args.layers} layers, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; random vectors N(0, {args.vector_std})")

    results, state = {}, diffusers_timed(args, layout, video, audio, text, times, index)
    results["diffusers BF16 (SDPA)"] = state.pop("result")
    loaded = MiniMaxH3.load(TensorSource(state), linears="int8")  # quantized on the GPU, as stored
    del state
    torch.cuda.empty_cache()

    def step(model):
        return lambda: model.output(video, audio, text, layout, times, index)[0]

    with torch.no_grad():
        ours = loaded.to("cuda")
        results["ours INT8 ConvRot"] = (*timed(step(ours), args.steps), weights_gb(ours))
        if args.budget_gb > 0:
            host = moved(loaded, "cpu")
            del ours, loaded
            torch.cuda.empty_cache()
            # As on a card of budget_gb: what the rest of the model and a pass over these rows take comes first
            # (asked once the rest is on the device), the layers get what is left.
            card = int(args.budget_gb * GIB) - pass_bytes(host.arch, layout.rows)
            streamed = host.to("cuda", budget_bytes=lambda total: card - torch.cuda.memory_allocated())
            label = f"ours INT8, layers streamed ({args.budget_gb:g} GiB budget)"
            results[label] = (*timed(step(streamed), args.steps), torch.cuda.memory_allocated() / 1e9)
    print_table(results)
    out = {label: r[2] for label, r in results.items()}
    print(f"\nfidelity (relative Frobenius of the video rows' velocity): ours INT8 vs diffusers BF16 "
          f"{rel(out['ours INT8 ConvRot'], out['diffusers BF16 (SDPA)']):.4f}")
    if args.budget_gb > 0:
        streamed_out = out[label]
        print(f"streamed vs resident: {rel(streamed_out, out['ours INT8 ConvRot']):.2e} (the same kernels: 0 "
              f"expected); resident / streamed speed {results[label][0] / results['ours INT8 ConvRot'][0]:.2f}")


if __name__ == "__main__":
    main()
