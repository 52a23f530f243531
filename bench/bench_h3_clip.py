"""MiniMax H3's t2v template clip end to end on one GPU (issue 35): 20 steps of res_multistep on the simple grid at
864x480, 124 frames (ComfyUI's way: the audio carried on the video grid), then the video decode (clips of 7 latents,
256-px tiles) and the stereo audio decode. Ours as the nodes run it: dit_core/sampling/minimax_h3.py sample_t2va
over the INT8 ConvRot transformer, our VAE decoders. diffusers 0.42.1's models of the same weights in the same run:
its BF16 transformer's step (the median of --peer-steps, times the clip's steps: its 66 GB model runs a few), its
video decode in the same tiles and its audio VAE; its clip is the sum of those phases. Random weights of the real
sizes; the prompt's features given (the text encoder is bench_text_encoders'). Seconds per phase and whole.

    python bench/bench_h3_clip.py [--layers 50] [--fidelity] [--attention-8bit]    # on a GPU, the peers' carry
    python bench/bench_h3_clip.py --tiny                         # a smoke run: tiny models, on the CPU where no GPU

--fidelity: then the clip by our BF16 model of the same INT8 weights (the same seed; its layers streamed where the
card holds less than its 66 GB), and the INT8 clip's PSNR of frames and audio against it (issue 35's measure).
--attention-8bit: also the INT8 clip with both attention products on 8 bits (Options.attention_8bit: the 2x step's
price in fidelity), timed warm, and with --fidelity its PSNR against the same BF16 clip."""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_h3_step import TINY, peer_timed, step_inputs  # noqa: E402
from bench_video_decode import h3 as h3_video  # noqa: E402
from clip_report import fidelity_line, now, print_phases, timed  # noqa: E402
from dit_core.codecs.h3_audio_vae import AudioDecoder  # noqa: E402
from dit_core.families.minimax_h3 import MiniMaxH3  # noqa: E402
from dit_core.gpu.streaming import pass_bytes  # noqa: E402
from dit_core.sampling.minimax_h3 import sample_t2va  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from tiny_models import builders  # noqa: E402

GIB = 1 << 30
STEPS, SAMPLER, SCHEDULER = 20, "res_multistep", "simple"  # the t2v template's KSampler


def audio_codecs(device: torch.device, tiny: bool, folder: Path):
    """diffusers' H3 audio VAE (as released, or the tests' tiny one) with random weights, f32 on device, and our
    decoder of the same weights read from the file they were saved to."""
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3_audio import AutoencoderKLMiniMaxH3Audio
    tests = builders("dit_core/codecs/test_h3_audio_vae.py")
    vae = tests.tiny_vae() if tiny else AutoencoderKLMiniMaxH3Audio().eval()
    path = folder / "h3_audio.safetensors"
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(path))
    ours = AudioDecoder.load(path, tests.RATES_TINY, tests.DIL_TINY) if tiny else AudioDecoder.load(path)
    return vae.to(device), ours.to(device)


def bf16_of(model: MiniMaxH3) -> MiniMaxH3:
    """model with every INT8 block linear as BF16 of its codes turned back (Block.dequantized)."""
    return replace(model, refiners=tuple(b.dequantized() for b in model.refiners),
                   blocks=tuple(replace(layer, block=layer.block.dequantized()) for layer in model.blocks))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--peer-steps", type=int, default=2, help="diffusers' steps timed (their median times 20)")
    p.add_argument("--vector-std", type=float, default=0.1)
    p.add_argument("--fidelity", action="store_true")
    p.add_argument("--attention-8bit", action="store_true", help="also the clip with Options.attention_8bit")
    p.add_argument("--tiny", action="store_true", help="a 3-layer model of GPU-kernel sizes at 64x64x22")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from graph_peers import torchvision_shim
    torchvision_shim()  # CPU torch beside the dev venv's CUDA torchvision wheel
    config = TINY if args.tiny else {}
    layers, width, height, frames, text_rows = (3, 64, 64, 22, 16) if args.tiny else (args.layers, 864, 480, 124, 512)
    inputs = step_inputs(config, width, height, frames, text_rows, device)
    layout, text, (latent_frames, lh, lw), audio_latents = inputs.layout, inputs.text, inputs.latent, \
        inputs.audio_latents
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (kernel references)"
    print(f"# MiniMax H3 clip, {width}x{height}x{frames}, {STEPS} steps ({SAMPLER}, {SCHEDULER}); {layers} layers"
          f"{' (tiny sizes)' * args.tiny}; {name}, torch {torch.__version__}\n", flush=True)

    peer = argparse.Namespace(layers=layers, vector_std=args.vector_std, tiny=args.tiny, peer=True,
                              steps=args.peer_steps)
    state = peer_timed(peer, device, layout, inputs.video, inputs.audio, text, inputs.times, inputs.index,
                       state_on="cpu")
    theirs = {"sampling": state.pop("result")[0] / 1e3 * STEPS}
    # on the host as the loader node reads a file, its linears quantized on the card
    loaded = MiniMaxH3.load(TensorSource(state), linears="int8", compute_on=device if device.type == "cuda" else None)
    del state
    if device.type == "cuda":
        torch.cuda.empty_cache()
    defaults = MiniMaxH3.default_options()

    def placed(model: MiniMaxH3) -> MiniMaxH3:
        """On the card, its layers streamed where the free memory less a pass's need cannot hold them all."""
        if device.type != "cuda":
            return model.gpu_form(device, defaults)
        spare = lambda total: int(torch.cuda.mem_get_info()[0]) - pass_bytes(model.arch, layout.rows) - 2 * GIB  # noqa
        return model.to(device, budget_bytes=spare, options=defaults)

    with tempfile.TemporaryDirectory(prefix="bench_h3_clip_") as folder:
        our_video, their_video, z_video = h3_video(device, torch.bfloat16 if device.type == "cuda" else torch.float32,
                                                   args.tiny, Path(folder))
        their_audio, our_audio = audio_codecs(device, args.tiny, Path(folder))
    z_audio = torch.randn(2, our_audio.latent_channels, audio_latents, generator=torch.Generator().manual_seed(2))
    z_audio = z_audio.to(device)
    their_video(z_video[:, :, :7, :4, :4])  # cuDNN's plans out of the timing
    theirs["video decode"] = timed(lambda: their_video(z_video), device)[0]
    with torch.no_grad():
        theirs["audio decode"] = timed(lambda: their_audio.decode(z_audio).sample.float().cpu(), device)[0]

    def our_clip(model: MiniMaxH3) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seconds by phase, IMAGE frames, the waveform, the video latent) of the clip by model."""
        marks = [now(device)]
        with torch.no_grad():
            v, a = sample_t2va(model, text, latent_frames, lh, lw, audio_latents, STEPS, seed=0, sampler=SAMPLER,
                               scheduler=SCHEDULER)
        marks.append(now(device))
        # the sampler's latents where they fit the decoders (real sizes), else random ones (tiny models)
        frames_out = our_video(v if v.shape[1:] == z_video.shape[1:] else z_video)
        marks.append(now(device))
        stereo = a[0].transpose(0, 1) if a.shape[1] == our_audio.latent_channels else z_audio
        sound = our_audio.audio(stereo)["waveform"]
        marks.append(now(device))
        seconds = {k: b - e for k, e, b in zip(("sampling", "video decode", "audio decode"), marks, marks[1:])}
        return seconds, frames_out, sound, v

    model = placed(loaded)
    ours = {label: our_clip(model) for label in ("first", "warm")}
    phases = (("sampling", f"{STEPS} steps (diffusers: its step x {STEPS})"), ("video decode", "video decode"),
              ("audio decode", "audio decode"))
    print_phases(phases, theirs, ours["first"][0], ours["warm"][0])
    if args.attention_8bit:
        model = replace(model, options=replace(defaults, attention_8bit=True))
        ours.update({f"8-bit {label}": our_clip(model) for label in ("first", "warm")})
        print("\nWith both attention products on 8 bits (Options.attention_8bit):\n")
        print_phases(phases, theirs, ours["8-bit first"][0], ours["8-bit warm"][0])
    if args.fidelity:  # INT8 against BF16 of the same INT8 weights, the same seed: the decoded clip's distance
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # the INT8 host model let go first: a 33 B model's 33 GB beside its BF16 copy's 66 and the streamed layers'
        # page-locked copies would near the device host's 128 GB
        host_bf16, loaded = bf16_of(loaded), None
        model = placed(host_bf16)
        del host_bf16
        bf16 = our_clip(model)[1:]
        print("\n" + fidelity_line(ours["warm"][1:], bf16, args.tiny))
        if args.attention_8bit:
            print("8-bit attention, " + fidelity_line(ours["8-bit warm"][1:], bf16, args.tiny))
    return 0


if __name__ == "__main__":
    sys.exit(main())
