"""One LTX-2.5 transformer step at the t2v template's two stages (stage 1 640x352, stage 2 1280x704; 121 frames: 16
latent frames, 127 audio rows, the connectors' 1024 prompt rows a stream) on random weights of the real size (48
layers, 19 B in the transformer): diffusers 0.42.1 LTX2VideoTransformer3DModel configured as 2.5 in BF16 with SDPA,
then ours with INT8 ConvRot layers resident, then ours with its layers streamed within a GPU budget (16 GiB by
default, the issue's card), in one run. Prints one markdown table (median ms over timed steps with CUDA events, the
step's peak memory above the weights, device weights, joules), each stage's INT8 distance from diffusers' BF16 step
(video and audio velocity), and the streamed step's distance from the resident one.

    python bench/bench_ltx25_step.py [--steps 3] [--layers 48] [--stages 1,2] [--budget-gb 16] [--no-peer] [--tiny]
        [--profile] [--launches] [--sizes WxH,WxH]

--tiny runs a 1-layer model the kernels take (heads of 128 / 64, widths in ConvRot groups) at 64x64 / 128x128, 17
frames and 16 prompt rows: on a machine without CUDA the kernels' references run on the CPU (a smoke test of the
script, not a timing).

Memory on an H200: diffusers' BF16 model (38 GB) times both stages and is freed before ours is made from its tensors
(the blocks' linears quantized on the GPU); the streamed model's layers wait in page-locked host memory."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_h3_step import moved, timed_on  # noqa: E402
from bench_z_image_step import rel, weights_gb  # noqa: E402
from dit_core.families.ltx25 import LTX25  # noqa: E402
from kernels import Choices  # noqa: E402
from dit_core.families.ltx25_positions import Grid  # noqa: E402
from dit_core.gpu.streaming import pass_bytes  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402

GIB = 1 << 30
PEER, OURS, GRAPHED = "diffusers BF16 (SDPA)", "ours INT8 ConvRot", "ours INT8 ConvRot, CUDA graph"
EIGHT_BIT = "ours INT8 ConvRot, 8-bit attention, CUDA graph"
# --launches: other kernels or launches of the same math (Options fields; "kernels": kernels.Choices fields), each
# timed as a graphed step beside the defaults: the audio's branches after the video's (Options.concurrent_modes
# off); the q/k rows in blocks at every count (kernels.Choices rows_at_once_below and rows_in_pairs_from None);
# FlashAttention-3's forward for the unmasked attentions where fa3_fwd is installed (Choices.fa3_attention)
LAUNCHES = {"audio after video": {"concurrent_modes": False},
            "q/k rows in blocks at every count": {"kernels": {"rows_at_once_below": None, "rows_in_pairs_from": None}},
            "FA3 attention": {"kernels": {"fa3_attention": True}}}
# LTX-2.5 as the file ships it (reference/families/ltx25.md section 1; tests/tiny_models.py LTX25_TINY's switches)
RELEASE = dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
               rope_type="split", use_prompt_embeddings=False, ff_bias=False, use_prompt_adaln_single=True,
               use_keyframes_abs_pos_embedding=True)
# A model every GPU kernel takes (tests/families/test_ltx25_gpu.py's GPU_SIZES)
TINY = dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=128, cross_attention_dim=256,
            audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=2, audio_attention_head_dim=64,
            audio_cross_attention_dim=128)
STAGES = {1: (640, 352), 2: (1280, 704)}
TINY_STAGES = {1: (64, 64), 2: (128, 128)}
SIGMA_VIDEO, SIGMA_AUDIO = 0.725, 0.725  # a step of the template's stage 1 (one sigma for both streams)


def random_reference(layers: int, vector_std: float, device: torch.device, config: dict):
    """diffusers' LTX-2.5 in BF16 on device with random weights at sane scales: matrices N(0, 1/fan_in), vectors and
    tables N(0, vector_std) (the norms carry no gains)."""
    from graph_peers import torchvision_shim
    torchvision_shim()  # CPU torch beside the dev venv's CUDA torchvision wheel
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformer3DModel
    torch.manual_seed(0)
    with device:
        ref = LTX2VideoTransformer3DModel(num_layers=layers, **RELEASE, **config).to(torch.bfloat16).eval()
        for _, t in ref.named_parameters():
            if t.dim() == 2 and "scale_shift_table" not in _:
                t.data.normal_(0, t.shape[-1] ** -0.5)
            else:
                t.data.normal_(0, vector_std)
    return ref


@dataclasses.dataclass(frozen=True)
class StageInputs:
    grid: Grid
    video: torch.Tensor       # [rows, C]
    audio: torch.Tensor       # [M, C_audio]
    text_video: torch.Tensor  # [L, D]
    text_audio: torch.Tensor  # [L, D_audio]

    @property
    def rows(self) -> int:
        return self.grid.rows + self.audio.shape[0] + self.text_video.shape[0]


def stage_inputs(width: int, height: int, frames: int, text: int, config: dict, device) -> StageInputs:
    """Random rows of one stage: the video latent 1/32 of the pixels and (frames - 1)/8 + 1 frames, audio 25
    latents a second (at 24 fps), text rows for both streams."""
    grid = Grid((frames - 1) // 8 + 1, height // 32, width // 32, 24.0)
    audio_rows = math.ceil(frames / 24 * 25)
    g = torch.Generator().manual_seed(width)
    video = torch.randn(grid.rows, config.get("in_channels", 128), generator=g)
    audio = torch.randn(audio_rows, config.get("audio_in_channels", 128), generator=g)
    text_video = torch.randn(text, config.get("cross_attention_dim", 4096), generator=g)
    text_audio = torch.randn(text, config.get("audio_cross_attention_dim", 2048), generator=g)
    return StageInputs(grid, *(t.to(device) for t in (video, audio, text_video, text_audio)))


def peer_step(ref, s: StageInputs):
    """diffusers' step at sigma (both streams), the A<->V modulation at the other stream's sigma (our 'cross')."""
    def step():
        dev = s.video.device
        with torch.no_grad():
            v, a = ref(hidden_states=s.video[None].bfloat16(), audio_hidden_states=s.audio[None].bfloat16(),
                       encoder_hidden_states=s.text_video[None].bfloat16(),
                       audio_encoder_hidden_states=s.text_audio[None].bfloat16(),
                       timestep=torch.full((1, s.grid.rows), SIGMA_VIDEO * 1000.0, device=dev),
                       audio_timestep=torch.tensor([SIGMA_AUDIO * 1000.0], device=dev),
                       sigma=torch.tensor([SIGMA_VIDEO * 1000.0], device=dev),
                       audio_sigma=torch.tensor([SIGMA_AUDIO * 1000.0], device=dev), num_frames=s.grid.frames,
                       height=s.grid.height, width=s.grid.width, fps=s.grid.fps, audio_num_frames=s.audio.shape[0],
                       use_cross_timestep=True, return_dict=False)
        return v[0].float(), a[0].float()
    return step


def our_step(model: LTX25, s: StageInputs, forward=None):
    """forward: model.forward (the default) or its graphed twin (model.graphed())."""
    forward = forward or model.forward

    def step():
        with torch.no_grad():
            return forward(s.video, s.audio, s.text_video, s.text_audio, s.grid, SIGMA_VIDEO, SIGMA_AUDIO,
                           av_times="cross")
    return step


def quantized_state(ref) -> dict:
    """diffusers' model in the Comfy-Org file's names, the blocks' linears as INT8 ConvRot (group 256, or the
    largest that divides their inputs), quantized where the tensors are."""
    from tiny_models import int8_convrot_state, ltx25_comfy_layout
    from dit_core.weights import convrot_group_for
    out = {}
    for key, value in ltx25_comfy_layout(ref).items():
        if ".transformer_blocks." in key and key.endswith(".weight") and value.dim() == 2:
            out.update(int8_convrot_state({key: value.float()}, lambda _: True,
                                          group=convrot_group_for(value.shape[1])))
        else:
            out[key] = value
    return out


def our_models(state: dict, device: torch.device) -> tuple[LTX25, LTX25]:
    """(the model on the host, its GPU form on device) from the file's tensors. On the host as a node reads the file:
    resident and streamed layers are then made from the same host tensors (a layer's .on() dequantizes its head
    gates where they are; the GPU's f32 sums differ in the last bit). On the CPU the GPU form runs the kernels'
    references, as the tests run it."""
    loaded = moved(LTX25.load(TensorSource(state)), "cpu")
    defaults = LTX25.default_options()
    return loaded, loaded.to(device, options=defaults) if device.type == "cuda" else loaded.gpu_form(device, defaults)


def print_results(results: dict) -> None:
    """One markdown table of {(stage, label): (ms, peak GB, output, joules, weights GB)}, each stage's rows against
    its diffusers row (else its ours INT8 row)."""
    print("| stage | model | ms / step | vs diffusers | step peak GB (above weights) | weights GB | J / step |")
    print("|---|---|---|---|---|---|---|")
    for (stage, label), (ms, peak, _, joules, wgb) in results.items():
        base = results.get((stage, PEER), results[(stage, OURS)])[0]
        energy = "-" if joules is None else f"{joules:.1f}"
        print(f"| {stage} | {label} | {ms:.1f} | {base / ms:.2f}x | {peak:.2f} | {wgb:.2f} | {energy} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--stages", default="1,2", help="which stages: 1 (640x352), 2 (1280x704)")
    p.add_argument("--frames", type=int, default=121, help="pixel frames, 8n + 1")
    p.add_argument("--sizes", default="", help="the stages' WxH instead of the template's, e.g. 64x64,128x128 (a "
                   "smoke run of the real widths on the CPU)")
    p.add_argument("--text", type=int, default=1024, help="prompt rows a stream")
    p.add_argument("--budget-gb", type=float, default=16.0, help="the streamed rows' GPU budget (0: no such rows)")
    p.add_argument("--vector-std", type=float, default=0.1)
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip diffusers' steps (its random model "
                   "is still made: ours is made from its tensors)")
    p.add_argument("--attention-8bit", action="store_true", help="also the graphed step with the self-attentions' "
                   "products on 8 bits (Options.attention_8bit)")
    p.add_argument("--launches", action="store_true", help="also the graphed step with each of LAUNCHES' "
                   "options (Options, kernels.Choices)")
    p.add_argument("--profile", action="store_true", help="also print the kernels of one resident INT8 step of each "
                   "stage, by GPU time, and the last stage's host functions (bench/gpu_profile.py)")
    p.add_argument("--tiny", action="store_true", help="a smoke run: a model of GPU-kernel sizes at 64x64 / "
                   "128x128, 17 frames, 16 prompt rows; on the CPU where there is no CUDA")
    args = p.parse_args(argv)
    stages = [int(s) for s in args.stages.split(",")]
    if args.tiny:
        args.frames, args.text = 17, 16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TINY if args.tiny else {}
    sizes = TINY_STAGES if args.tiny else STAGES
    if args.sizes:
        sizes = {k: tuple(int(n) for n in wh.split("x")) for k, wh in zip((1, 2), args.sizes.split(","))}
    inputs = {k: stage_inputs(*sizes[k], args.frames, args.text, config, device) for k in stages}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (kernel references)"
    print(f"# LTX-2.5 step, {args.frames} frames, stages " + ", ".join(
        f"{k}: {sizes[k][0]}x{sizes[k][1]} ({s.grid.rows} video + {s.audio.shape[0]} audio + {s.text_video.shape[0]} "
        f"text rows)" for k, s in inputs.items()) + f"; {args.layers} layers{' (tiny sizes)' * args.tiny}, {name}, "
        f"torch {torch.__version__}; random vectors N(0, {args.vector_std})")

    results = {}
    ref = random_reference(args.layers, args.vector_std, device, config)
    if args.peer:
        for k, s in inputs.items():
            results[(k, PEER)] = (*timed_on(device, peer_step(ref, s), args.steps), weights_gb(tuple(ref.parameters())))
    state = quantized_state(ref)
    ref = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    loaded, ours = our_models(state, device)
    del state
    defaults = LTX25.default_options()
    for k, s in inputs.items():
        results[(k, OURS)] = (*timed_on(device, our_step(ours, s), args.steps), weights_gb(ours))
    if device.type == "cuda":  # the same step replayed from a CUDA graph (dit_core/gpu/step_graph.py)
        graphed = ours.graphed()
        for k, s in inputs.items():
            results[(k, GRAPHED)] = (*timed_on(device, our_step(ours, s, graphed), args.steps), weights_gb(ours))
        graphed.clear()
        if args.attention_8bit:  # the same, the self-attentions' products on 8 bits (Options.attention_8bit)
            eight = dataclasses.replace(ours, options=dataclasses.replace(defaults, attention_8bit=True))
            graphed = eight.graphed()
            for k, s in inputs.items():
                results[(k, EIGHT_BIT)] = (*timed_on(device, our_step(eight, s, graphed), args.steps),
                                           weights_gb(ours))
            graphed.clear()
            del eight
        for label, change in LAUNCHES.items() if args.launches else ():
            change = dict(change)
            kernels = dataclasses.replace(defaults.kernels or Choices(), **change.pop("kernels", {}))
            variant = dataclasses.replace(ours, options=dataclasses.replace(defaults, kernels=kernels, **change))
            graphed = variant.graphed()
            for k, s in inputs.items():
                results[(k, f"{GRAPHED}, {label}")] = (*timed_on(device, our_step(variant, s, graphed), args.steps),
                                                       weights_gb(ours))
            graphed.clear()
            del variant
        del graphed  # (and eight) hold the resident layers, which the streamed run below must not find on the card
    if args.profile and device.type == "cuda":
        from gpu_profile import print_profile
        for k, s in inputs.items():
            print(f"\n## kernels of one INT8 step, stage {k}")
            print_profile(our_step(ours, s), host=k == stages[-1])
    stream = None
    if args.budget_gb > 0:
        host = loaded
        del ours, loaded
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        most = max(s.rows for s in inputs.values())
        card = int(args.budget_gb * GIB) - pass_bytes(host.arch, most)
        used = torch.cuda.memory_allocated if device.type == "cuda" else lambda: 0
        # As on a card of budget_gb: the rest of the model and the largest stage's pass first, the layers get what
        # is left (tiny: two layers' bytes, so that they stream)
        budget = (lambda total: 2 * total // args.layers) if args.tiny else lambda total: card - used()
        form = (lambda layer, where: layer.on(where)) if device.type == "cpu" else None
        if form is None:
            streamed = host.to(device, budget_bytes=budget, options=defaults)
        else:  # the GPU form's layers through CPU slots
            from dit_core.gpu.streaming import StreamedBlocks
            streamed = dataclasses.replace(host.gpu_form(device, defaults, with_layers=False), blocks=StreamedBlocks(
                host.blocks, device, budget, form=form, slots=1))
        stream = f"ours INT8, layers streamed ({'tiny' if args.tiny else f'{args.budget_gb:g} GiB'} budget)"
        for k, s in inputs.items():
            results[(k, stream)] = (*timed_on(device, our_step(streamed, s), args.steps), used() / 1e9)
    print()
    print_results(dict(sorted(results.items(), key=lambda kv: kv[0][0])))
    print()
    for k in stages:
        ours_v, ours_a = results[(k, OURS)][2]
        if (k, PEER) in results:
            peer_v, peer_a = results[(k, PEER)][2]
            print(f"stage {k} fidelity (relative Frobenius of the velocity), ours INT8 vs diffusers BF16: video "
                  f"{rel(ours_v, peer_v):.4f}, audio {rel(ours_a, peer_a):.4f}")
        if (k, GRAPHED) in results:
            gv, ga = results[(k, GRAPHED)][2]
            print(f"stage {k} graphed vs eager: video {rel(gv, ours_v):.2e}, audio {rel(ga, ours_a):.2e} (0 expected)")
        if (k, EIGHT_BIT) in results:
            ev, ea = results[(k, EIGHT_BIT)][2]
            print(f"stage {k} 8-bit attention vs cuDNN's bf16: video {rel(ev, ours_v):.4f}, audio "
                  f"{rel(ea, ours_a):.4f}")
        if stream is not None:
            sv, sa = results[(k, stream)][2]
            print(f"stage {k} streamed vs resident: video {rel(sv, ours_v):.2e}, audio {rel(sa, ours_a):.2e} (the "
                  f"same kernels: 0 expected); streamed / resident time "
                  f"{results[(k, stream)][0] / results[(k, OURS)][0]:.2f}")


if __name__ == "__main__":
    main()
