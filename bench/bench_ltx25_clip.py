"""LTX-2.5's t2v template clip end to end on one GPU (issue 36): stage 1 (8 steps at 640x352), the x2 latent
upsampler, stage 2 (3 steps at 1280x704), the video decode and the audio decode with the vocoder; 121 frames, cfg 1
(one pass a step). Ours as the nodes run it: dit_core/sampling/ltx25.py sample_two_stage over the INT8 ConvRot
transformer (steps replayed from CUDA graphs while every layer is resident), the upsampler in f32, the video
decode in BF16 in the template's VAEDecodeTiled(512, 64, 64, 16) tiles, the audio decoder and vocoder in f32.
diffusers 0.42.1's models of the same weights run the same evaluations in the same run: its BF16 transformer for
each step of each stage (bench_ltx25_step.peer_step), its upsampler, its tiled VAE decode (bench_video_decode), its
audio VAE and vocoder; its clip is the sum of those phases (its pipeline's own loop adds a little). Random weights
of the real sizes; the prompt's connector rows given (the text encoder is bench_text_encoders'). Seconds per phase
and whole, ours first (its graphs captured, its kernels built) and warm.

    python bench/bench_ltx25_clip.py [--layers 48] [--fidelity] [--attention-8bit]    # on a GPU, the peers' carry
    python bench/bench_ltx25_clip.py --tiny            # a smoke run: tiny models, on the CPU where no GPU

--fidelity: then the clip by our BF16 model of the same INT8 weights (the same seeds), and the INT8 clip's PSNR of
frames and audio against it (issue 36's fidelity measure). --attention-8bit: also the INT8 clip with the self-
attentions' products on 8 bits (Options.attention_8bit: the 2x step's price in fidelity), and with --fidelity its PSNR.

Memory: diffusers' BF16 transformer (38 GB) runs its steps and is freed before ours is made from its tensors; with
--fidelity our INT8 model is freed before the BF16 one is placed."""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_ltx25_step import (  # noqa: E402
    STAGES, TINY, TINY_STAGES, our_models, peer_step, quantized_state, random_reference, stage_inputs)
from bench_video_decode import LTX25_TINY_TILES, ltx25_diffusers_decode, ltx25_vaes  # noqa: E402
from clip_report import fidelity_line, now, print_phases, timed  # noqa: E402
from dit_core.codecs.ltx2_audio_vae import AudioDecoder  # noqa: E402
from dit_core.codecs.ltx2_latent_upsampler import LatentUpsampler  # noqa: E402
from dit_core.codecs.ltx2_video_vae import TEMPLATE_TILES  # noqa: E402
from dit_core.codecs.ltx2_vocoder import Vocoder  # noqa: E402
from dit_core.sampling.ltx25 import Prompt, sample_two_stage, template_stages  # noqa: E402
from tiny_models import (  # noqa: E402
    builders, random_ltx2_upsampler, randomized_vocoder, save_ltx2_audio, save_ltx2_upsampler)

FPS = 24.0


def codecs(device: torch.device, tiny: bool, folder: Path):
    """The upsampler, video VAE, audio VAE and vocoder as diffusers' modules (BF16 video VAE, the rest f32) and as
    ours of the same weights, read from the files they were saved to: (theirs, ours), dicts by role."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE
    tests = builders("families/test_ltx25_codecs.py")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vae, video = ltx25_vaes(device, dtype, tiny, folder)
    released = {"in_channels": 128, "mid_channels": 1024, "num_blocks_per_stage": 4}
    up = random_ltx2_upsampler(**({} if tiny else released))
    save_ltx2_upsampler(up, folder / "upsampler.safetensors")
    audio_vae = tests.randomized(AutoencoderKLLTX2Audio(**(tests.AUDIO if tiny else {})), 6)
    vocoder = randomized_vocoder(LTX2VocoderWithBWE(**(tests.VOCODER if tiny else {"final_act_fn": "clamp"})))
    stats, _ = save_ltx2_audio(audio_vae, vocoder, folder / "audio.safetensors")
    theirs = {"upsampler": up.to(device), "video": vae, "audio": audio_vae.to(device), "vocoder": vocoder.to(device),
              "stats": [s.to(device) for s in stats.values()]}
    ours = {"upsampler": LatentUpsampler.load(folder / "upsampler.safetensors").to(device), "video": video,
            "audio": AudioDecoder.load(folder / "audio.safetensors").to(device),
            "vocoder": Vocoder.load(folder / "audio.safetensors").to(device)}
    return theirs, ours


def their_audio(theirs: dict, z: torch.Tensor) -> torch.Tensor:
    """diffusers' audio decode of normalized latents z [1, 8, L, 16]: de-normalized as its pipeline does (per packed
    row of 128), its VAE, then its vocoder: the waveform on the host."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    packed = LTX2Pipeline._denormalize_audio_latents(LTX2Pipeline._pack_audio_latents(z), *theirs["stats"])
    with torch.no_grad():
        mel = theirs["audio"].decode(LTX2Pipeline._unpack_audio_latents(packed, z.shape[2], num_mel_bins=z.shape[3]))
        return theirs["vocoder"](mel.sample).float().cpu()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--vector-std", type=float, default=0.1)
    p.add_argument("--tiny", action="store_true", help="the tests' tiny models at 64x64 / 128x128, 17 frames")
    p.add_argument("--fidelity", action="store_true", help="then the clip by our BF16 model of the same INT8 "
                   "weights, and the PSNR of the INT8 clip's frames and audio against it")
    p.add_argument("--attention-8bit", action="store_true", help="also the clip with Options.attention_8bit")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from graph_peers import torchvision_shim
    torchvision_shim()  # CPU torch beside the dev venv's CUDA torchvision wheel
    layers, config, sizes = (1, TINY, TINY_STAGES) if args.tiny else (args.layers, {}, STAGES)
    frames, text = (17, 16) if args.tiny else (121, 1024)
    stages = template_stages()
    inputs = {k: stage_inputs(*sizes[k], frames, text, config, device) for k in (1, 2)}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (kernel references)"
    print(f"# LTX-2.5 clip, {frames} frames, stage 1 {sizes[1][0]}x{sizes[1][1]} ({len(stages[0].sigmas) - 1} "
          f"steps), stage 2 {sizes[2][0]}x{sizes[2][1]} ({len(stages[1].sigmas) - 1} steps), cfg 1; {layers} layers"
          f"{' (tiny sizes)' * args.tiny}; {name}, torch {torch.__version__}\n", flush=True)
    phases = {}

    ref = random_reference(layers, args.vector_std, device, config)
    for k, stage in zip((1, 2), stages):
        step = peer_step(ref, inputs[k])
        step()  # first call out of the timing
        phases[f"stage {k} steps"] = sum(timed(step, device)[0] for _ in range(len(stage.sigmas) - 1))
    state = quantized_state(ref)
    ref = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    host, model = our_models(state, device)
    del state

    with tempfile.TemporaryDirectory(prefix="bench_ltx25_clip_") as folder:
        theirs, ours = codecs(device, args.tiny, Path(folder))
    s1 = inputs[1]
    video = torch.zeros(1, model.video.proj_in.in_features, s1.grid.frames, s1.grid.height, s1.grid.width,
                        device=device)
    mel_bins = 16
    audio = torch.zeros(1, model.audio.proj_in.in_features // mel_bins, s1.audio.shape[0], mel_bins, device=device)
    positive = Prompt(s1.text_video, s1.text_audio)
    # the decoders' latents: the sampler's where they fit the codecs (real sizes), else random ones (tiny models)
    z_video = torch.randn(1, 128, s1.grid.frames, 2 * s1.grid.height, 2 * s1.grid.width, device=device)
    z_audio = torch.randn(1, 8, s1.audio.shape[0], 16, device=device)
    tiles = LTX25_TINY_TILES if args.tiny else TEMPLATE_TILES

    up = theirs["upsampler"]
    phases["upsampler"] = timed(lambda: up(video.float()), device)[0]
    ltx25_diffusers_decode(theirs["video"], z_video[:, :, :2, :4, :4])  # cuDNN's plans out of the timing
    phases["video decode"] = timed(lambda: ltx25_diffusers_decode(theirs["video"], z_video), device)[0]
    phases["audio decode"] = timed(lambda: their_audio(theirs, z_audio), device)[0]

    # the VAE's statistics un-normalize the upsampler's latents (identity ones where the tiny models' widths differ)
    c = video.shape[1]
    stats = (ours["video"].latents_mean, ours["video"].latents_std) if c == 128 else \
        (torch.zeros(c, device=device), torch.ones(c, device=device))

    def our_clip(model, step) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seconds by phase, IMAGE frames, the waveform, the final video latent) of the clip by model (its graphed
        twin step, or None)."""
        marks = [now(device)]
        upsample = lambda v: ours["upsampler"].upsample(v, *stats)  # noqa: E731
        with torch.no_grad():
            v, a = sample_two_stage(model, upsample, video, audio, FPS, positive, stages=stages, step=step)
        marks.append(now(device))
        frames = ours["video"].decode(v if v.shape[1] == 128 else z_video, tiles=tiles)
        marks.append(now(device))
        sound = ours["vocoder"].audio(ours["audio"].decode(a if a.shape[1] == 8 and a.shape[3] == 16 else z_audio))
        marks.append(now(device))
        seconds = {phase: b - a for phase, a, b in zip(("sampling", "video decode", "audio decode"), marks, marks[1:])}
        return seconds, frames, sound["waveform"], v

    step = model.graphed() if device.type == "cuda" else None
    ours_rows = {label: our_clip(model, step) for label in ("first", "warm")}
    theirs_rows = {"sampling": phases["stage 1 steps"] + phases["upsampler"] + phases["stage 2 steps"],
                   "video decode": phases["video decode"], "audio decode": phases["audio decode"]}
    clip_phases = (("sampling", "stages 1 and 2 with the upsampler"), ("video decode", "video decode"),
                   ("audio decode", "audio decode with the vocoder"))
    print_phases(clip_phases, theirs_rows, ours_rows["first"][0], ours_rows["warm"][0])
    print(f"\ndiffusers' phases: stage 1 steps {phases['stage 1 steps']:.2f} s, upsampler {phases['upsampler']:.3f} s, "
          f"stage 2 steps {phases['stage 2 steps']:.2f} s", flush=True)
    if args.attention_8bit:
        if step is not None:
            step.clear()
        model = replace(model, options=replace(model.options, attention_8bit=True))
        step = model.graphed() if device.type == "cuda" else None
        ours_rows.update({f"8-bit {label}": our_clip(model, step) for label in ("first", "warm")})
        print("\nWith the self-attentions' products on 8 bits (Options.attention_8bit):\n")
        print_phases(clip_phases, theirs_rows, ours_rows["8-bit first"][0], ours_rows["8-bit warm"][0])
    if args.fidelity:  # INT8 against BF16 of the same INT8 weights, the same seeds: the decoded clip's distance
        if step is not None:
            step.clear()
        model = step = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        bf16 = replace(host, blocks=tuple(b.dequantized() for b in host.blocks))
        model = bf16.to(device) if device.type == "cuda" else bf16.gpu_form(device, bf16.default_options())
        bf16_clip = our_clip(model, model.graphed() if device.type == "cuda" else None)
        print(fidelity_line(ours_rows["warm"][1:], bf16_clip[1:], args.tiny))
        if args.attention_8bit:
            print("8-bit attention, " + fidelity_line(ours_rows["8-bit warm"][1:], bf16_clip[1:], args.tiny))
    return 0


if __name__ == "__main__":
    sys.exit(main())
