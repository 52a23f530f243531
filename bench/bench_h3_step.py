"""One MiniMax H3 transformer step at the t2v template's size (864x480, 124 frames: 37 x 405 video rows, 2 x 207
audio rows, a 512-row prompt) on random weights of the real size (33 B): diffusers 0.42.1 MiniMaxH3Transformer3DModel
in BF16 with SDPA, then ours INT8 ConvRot resident (and with other Options as extra rows) and ours INT8 with its
layers streamed within a GPU budget (16 GiB by default, the issue's card), in one run. Prints a markdown table
(median ms over timed steps with CUDA events, peak memory of the step, device weights, joules), the INT8 step's
distance from diffusers' BF16 step, and which tensors the resident weights are (a byte account).

    python bench/bench_h3_step.py [--steps 3] [--layers 50] [--budget-gb 16] [--no-peer] [--profile]
        [--options int8_attention=True] [--variant-int8-attention ...] [--tiny]

--tiny runs the same rows at a model the kernels take (heads of 128, widths in ConvRot groups) and a few dozen rows:
on a machine without CUDA the kernels' references run on the CPU (a smoke test of the script, not a timing).

Memory on an H200: diffusers' BF16 model (66 GB) is timed and freed before ours is made from its tensors (the
INT8 quantization at load runs on the GPU); the streamed model's layers wait in page-locked host memory (33 GB)."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_z_image_step import rel, timed  # noqa: E402
from dit_core.families.minimax_h3 import MiniMaxH3, packed_layout, row_times  # noqa: E402
from dit_core.gpu.streaming import pass_bytes  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from kernels import Choices  # noqa: E402
from step_variants import add_arguments as add_variant_arguments  # noqa: E402
from step_variants import variants  # noqa: E402

GIB = 1 << 30
PEER, OURS = "diffusers BF16 (SDPA)", "ours INT8 ConvRot"
# A model every GPU kernel takes (test_minimax_h3.py's GPU_SIZES): attention 768 wide over a residual of 512.
TINY = dict(num_attention_heads=6, attention_head_dim=128, hidden_size=512, num_refiner_layers=1, ffn_dim=1024,
            in_channels=24, audio_in_channels=32, text_dim=256, freq_dim=256, time_embed_hidden_dim=512,
            time_embed_dim=256, rope_freq_dim=16)
BLOCK_PARTS = ("QKV", "OUT", "UP", "DOWN", "norm1", "norm2", "q/k norms", "k norm", "post-attn norm", "post-mlp norm")


def random_reference(layers: int, vector_std: float, device: torch.device, config: dict):
    """diffusers' H3 in BF16 on device with random weights at sane scales: matrices N(0, 1/fan_in), norm gains
    1 + N(0, vector_std), other vectors N(0, vector_std)."""
    from graph_peers import torchvision_shim
    torchvision_shim()  # CPU torch beside the dev venv's CUDA torchvision wheel
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Transformer3DModel
    torch.manual_seed(0)
    with torch.device("meta"):  # made without memory, then held in BF16: in f32 the 33 B model (132 GB) fits no H100
        ref = MiniMaxH3Transformer3DModel(num_layers=layers, **config)
    ref = ref.to(torch.bfloat16).to_empty(device=device).eval()
    # its buffers (the rotary's inv_freq) as a model made for real holds them: computed in f32, held in BF16
    for name, b in MiniMaxH3Transformer3DModel(num_layers=1, **config).to(torch.bfloat16).named_buffers():
        ref.get_buffer(name).copy_(b)
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


def tensors(obj, path: str = ""):
    """(path, tensor) of every tensor in a dataclass/tuple tree; a layer's index reads [i], a block's linear its
    part name (QKV, OUT, ...)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(obj, tuple):
        named = path.endswith(".w") and len(obj) == len(BLOCK_PARTS)  # a block's weights
        for i, item in enumerate(obj):
            yield from tensors(item, f"{path[:-2]}.{BLOCK_PARTS[i]}" if named else f"{path}[i]")


def byte_account(model) -> list[tuple[str, int, int]]:
    """(part, dtype, tensors, bytes) of the model's weights, most bytes first: tensors of one path (less the layer
    index) and dtype summed, each storage counted once (the q/k norms are rows of one tensor)."""
    seen, parts = set(), defaultdict(lambda: [0, 0])
    for path, t in tensors(model):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            continue
        seen.add(key)
        part = parts[f"{path} {str(t.dtype).removeprefix('torch.')}"]
        part[0] += 1
        part[1] += t.untyped_storage().nbytes()
    return sorted(((name, n, b) for name, (n, b) in parts.items()), key=lambda p: -p[2])


def kind(name: str) -> str:
    """The part of the model a byte_account row belongs to."""
    path, dtype = name.rsplit(" ", 1)
    if path.startswith("blocks"):
        if ".modulation." in path:
            return f"layers' modulation linears ({dtype})"
        if dtype == "int8":
            return "layers' INT8 codes"
        return "layers' scales" if path.endswith(".scale") else f"layers' other ({dtype})"
    return "token refiner" if path.startswith("refiners") else "embedders, time, final layer"


def print_account(model) -> None:
    rows = byte_account(model)
    total = sum(b for _, _, b in rows)
    kinds = defaultdict(int)
    for name, _, b in rows:
        kinds[kind(name)] += b
    print(f"\n## resident weights: {total / 1e9:.2f} GB\n\nby part: " + "; ".join(
        f"{k} {b / 1e9:.2f} GB" for k, b in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print("\n| tensor (all layers) | dtype | count | GB | share |\n|---|---|---|---|---|")
    for name, n, b in rows:
        path, dtype = name.rsplit(" ", 1)
        print(f"| {path} | {dtype} | {n} | {b / 1e9:.3f} | {100 * b / total:.1f}% |")


def timed_on(device: torch.device, fn, steps: int) -> tuple:
    """timed()'s (ms, peak GB, output, joules) on a GPU; on the CPU wall-clock ms after one warm-up, no peak."""
    if device.type == "cuda":
        return timed(fn, steps)
    fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2], 0.0, out, None


def profiled(device: torch.device, call) -> None:
    """The kernels of one call by GPU time (bench/gpu_profile.py); on the CPU its operators by CPU time."""
    if device.type == "cuda":
        from gpu_profile import print_profile
        print_profile(call)
        return
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def parsed_options(texts: list[str], defaults) -> list:
    """(name, options) of each --options text "field=value,field=value" (values as Python literals; "kernels.field":
    a kernels.Choices field) over the recipe's defaults."""
    fields = {f.name for f in dataclasses.fields(defaults)} | {f"kernels.{f.name}" for f in dataclasses.fields(Choices)}
    out = []
    for text in texts:
        changes, kernels = {}, {}
        for item in filter(None, text.split(",")):
            key, _, value = (part.strip() for part in item.partition("="))
            if key not in fields:
                raise SystemExit(f"bench_h3_step: --options {text!r}: no Options field {key!r}; fields are "
                                 f"{', '.join(sorted(fields))}")
            try:
                (kernels if key.startswith("kernels.") else changes)[key.removeprefix("kernels.")] = \
                    ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise SystemExit(f"bench_h3_step: --options {text!r}: {value!r} is not a Python literal (True, "
                                 f"4096, ...)") from None
        if kernels:
            changes["kernels"] = dataclasses.replace(defaults.kernels or Choices(), **kernels)
        out.append((text, dataclasses.replace(defaults, **changes)))
    return out


def print_table(results: dict) -> None:
    """The markdown table of results {label: (ms, peak GB, output, joules, weights GB)}, against the diffusers row
    when there is one, else against ours INT8."""
    base_label = PEER if PEER in results else OURS
    base = results[base_label][0]
    print(f"| model | ms / step | vs {base_label} | step peak GB (above weights) | weights GB | J / step |")
    print("|---|---|---|---|---|---|")
    for label, (ms, peak, _, joules, wgb) in results.items():
        energy = "-" if joules is None else f"{joules:.1f}"
        print(f"| {label} | {ms:.1f} | {base / ms:.2f}x | {peak:.2f} | {wgb:.2f} | {energy} |")


def weights_gb(model) -> float:
    return sum(b for _, _, b in byte_account(model)) / 1e9


def work_line(a, rows: int, results: dict) -> str:
    """The step's arithmetic (the layers' linears and attention; embedders, refiner and modulation left out) and
    the rate each timed row would need were its whole step that work: where the time can go."""
    params = a.hidden * a.qkv_width + a.inner * a.hidden + a.hidden * 2 * a.ffn + a.ffn * a.hidden
    linears, attention = 2 * rows * params * a.layers, 4 * rows * rows * a.inner * a.layers
    rates = "; ".join(f"{label} {(linears + attention) / ms / 1e9:.0f}" for label, (ms, *_) in results.items())
    return (f"work a step: linears {linears / 1e12:.1f} TFLOP, attention {attention / 1e12:.1f} TFLOP (at cuDNN's "
            f"634 TFLOP/s {attention / 634e9:.0f} ms); whole step as TFLOP/s: {rates}")


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """A step's random rows at a clip's size: the latent's frames and sides, the audio latents a channel, the packed
    layout, the video, audio and text rows (as the model's input projections take them), each row's time."""
    latent: tuple[int, int, int]  # F, LH, LW
    audio_latents: int
    layout: object
    video: torch.Tensor
    audio: torch.Tensor
    text: torch.Tensor
    times: torch.Tensor
    index: torch.Tensor


def step_inputs(config: dict, width: int, height: int, frames: int, text_rows: int, device) -> StepInputs:
    """StepInputs of a width x height x frames clip (pixel frames 17n + 5) with text_rows prompt rows, mid-way through
    sampling (video at sigma 0.4, audio at 0.45), for the model config (TINY's or the release's)."""
    latent = (frames - 5) // 17 * 5 + 2, height // 16, width // 16
    audio_latents = round(frames / 24 * 40)
    layout = packed_layout(text_rows, *latent, audio_latents)
    g = torch.Generator().manual_seed(1)
    widths = 4 * config.get("in_channels", 24), config.get("audio_in_channels", 32), config.get("text_dim", 5120)
    video, audio, text = (torch.randn(n, w, generator=g).to(device)
                          for n, w in zip((layout.video, layout.audio, layout.text), widths))
    return StepInputs(latent, audio_latents, layout, video, audio, text, *row_times(layout, 0.4, 1 - 0.55))


def peer_timed(args, device, layout, video, audio, text, times, index, state_on=None) -> dict:
    """The file-layout state of diffusers' random model; with the peer its step timed first (under "result"), the
    model itself freed. state_on: where the state goes (by default where the model ran; "cpu": as a file's tensors
    are, the card's memory then free for ours: the 33 B model's BF16 state and its INT8 twin do not fit an H100
    together)."""
    from tiny_models import minimax_h3_comfy_layout
    ref = random_reference(args.layers, args.vector_std, device, TINY if args.tiny else {})
    on = lambda t: t.to(device)  # noqa: E731
    result = None

    def diffusers_step():
        with torch.no_grad():
            v, _ = ref(hidden_states=video[None].bfloat16(), audio_hidden_states=audio[None].bfloat16(),
                       encoder_hidden_states=text[None].bfloat16(), timestep=on(times),
                       timestep_indices=on(index), token_tags=on(layout.tags),
                       position_ids=on(layout.positions), video_indices=on(layout.video_rows),
                       audio_indices=on(layout.audio_rows), text_indices=on(torch.arange(layout.text)),
                       return_dict=False)
        return v[0].float()

    if args.peer:
        result = (*timed_on(device, diffusers_step, args.steps), weights_gb(tuple(ref.parameters())))
    if state_on is not None:
        ref = ref.to(state_on)  # (its card memory given back below)
    state = minimax_h3_comfy_layout(ref)
    ref = None  # the tensors ours is made from stay in state; the rest goes
    if device.type == "cuda":
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
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip diffusers' step (its random model "
                   "is still made: ours is made from its tensors)")
    p.add_argument("--profile", action="store_true", help="also print the kernels of one INT8 step, by GPU time")
    p.add_argument("--options", action="append", default=[], metavar="FIELD=VALUE[,...]", help="also ours INT8 "
                   "resident with these Options fields changed from the recipe's (dit_core/gpu/options.py), e.g. "
                   "int8_attention=True, kernels.fa3_attention=True (a kernels.Choices field); repeatable, a row "
                   "each")
    p.add_argument("--curve-rank", type=int, default=0, help="also ours INT8 resident in the pruned files' curve "
                   "form of this rank (8: the template's minimax_h3_*_pruned_int8_convrot files; its modulation "
                   "linears [96768, 8] f32, MiniMaxH3.curve_form); 0: not")
    p.add_argument("--tiny", action="store_true", help="a smoke run: a 3-layer model of GPU-kernel sizes, 64x64x22, "
                   "16 text rows; on the CPU where there is no CUDA")
    add_variant_arguments(p)
    args = p.parse_args(argv)
    defaults = MiniMaxH3.default_options()
    extra = variants(args, defaults) + parsed_options(args.options, defaults)  # bad ones stop the run here
    if args.tiny:
        args.layers, args.width, args.height, args.frames, args.text = 3, 64, 64, 22, 16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TINY if args.tiny else {}
    inputs = step_inputs(config, args.width, args.height, args.frames, args.text, device)
    layout, video, audio, text, times, index = (inputs.layout, inputs.video, inputs.audio, inputs.text, inputs.times,
                                                inputs.index)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (kernel references)"
    print(f"# MiniMax H3 step, {args.width}x{args.height}x{args.frames} ({layout.video} video + {layout.audio} "
          f"audio + {layout.text} text rows), {args.layers} layers{' (tiny sizes)' * args.tiny}, {name}, torch "
          f"{torch.__version__}; random vectors N(0, {args.vector_std})")

    state = peer_timed(args, device, layout, video, audio, text, times, index)
    results, result = {}, state.pop("result")
    if result is not None:
        results[PEER] = result
    loaded = MiniMaxH3.load(TensorSource(state), linears="int8")  # quantized where the tensors are, as stored
    del state
    arch = loaded.arch
    if device.type == "cuda":
        torch.cuda.empty_cache()

    def step(model):
        return lambda: model.output(video, audio, text, layout, times, index)[0]

    with torch.no_grad():
        # On the CPU the GPU form (the kernels' references), as the tests run it.
        ours = loaded.to(device, options=defaults) if device.type == "cuda" else loaded.gpu_form(device, defaults)
        results[OURS] = (*timed_on(device, step(ours), args.steps), weights_gb(ours))
        if args.profile:
            profiled(device, step(ours))
        for label, options in extra:
            variant = dataclasses.replace(ours, options=options)
            results[f"{OURS}, {label}"] = (*timed_on(device, step(variant), args.steps), results[OURS][4])
            if args.profile:
                print(f"\n## {label}")
                profiled(device, step(variant))
        print_account(ours)
        if args.curve_rank:
            curve = loaded.curve_form(args.curve_rank)
            curve = curve.to(device, options=defaults) if device.type == "cuda" else curve.gpu_form(device, defaults)
            curve_label = f"{OURS}, curve form rank {args.curve_rank}"
            results[curve_label] = (*timed_on(device, step(curve), args.steps), weights_gb(curve))
            if args.profile:
                print(f"\n## {curve_label}")
                profiled(device, step(curve))
            print_account(curve)
            del curve
        if args.budget_gb > 0:
            host = moved(loaded, "cpu")
            del ours, loaded
            if device.type == "cuda":
                torch.cuda.empty_cache()
            # As on a card of budget_gb: what the rest of the model and a pass over these rows take comes first
            # (asked once the rest is on the device), the layers get what is left.
            card = int(args.budget_gb * GIB) - pass_bytes(host.arch, layout.rows)
            used = torch.cuda.memory_allocated if device.type == "cuda" else lambda: 0
            budget = (lambda total: 2 * total // args.layers) if args.tiny else lambda total: card - used()
            streamed = host.to(device, budget_bytes=budget, options=defaults)  # tiny: two layers' bytes: they stream
            stream = f"ours INT8, layers streamed ({'two layers' if args.tiny else f'{args.budget_gb:g} GiB'} budget)"
            results[stream] = (*timed_on(device, step(streamed), args.steps), used() / 1e9)
    print()
    print_table(results)
    print(work_line(arch, layout.rows, results))
    out = {label: r[2] for label, r in results.items()}
    if PEER in out:
        print(f"\nfidelity (relative Frobenius of the video rows' velocity): ours INT8 vs diffusers BF16 "
              f"{rel(out[OURS], out[PEER]):.4f}")
        if args.curve_rank:
            print(f"ours INT8 curve form rank {args.curve_rank} vs diffusers BF16 (the truncation's error too): "
                  f"{rel(out[curve_label], out[PEER]):.4f}")
    for label, _ in extra:
        print(f"{label} vs ours INT8 default: {rel(out[f'{OURS}, {label}'], out[OURS]):.4f}")
    if args.budget_gb > 0:
        print(f"streamed vs resident: {rel(out[stream], out[OURS]):.2e} (the same kernels on a GPU: 0 expected; "
              f"the CPU streams host layers); resident / streamed speed {results[stream][0] / results[OURS][0]:.2f}")


if __name__ == "__main__":
    main()
