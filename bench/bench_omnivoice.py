"""OmniVoice text to speech, ours (dit_core/gpu/omnivoice.py: BF16, graphed step per bucket, our Higgs decode) vs the
omnivoice 0.2.1 package's generate (BF16 model, SDPA, its transformers Higgs codec in f32), on one GPU in one run, on
random weights of the real size (Qwen3-0.6B body as reference/families/omnivoice.md section 2 lists it; the codec at
the released tokenizer's sizes). For 10 s and 30 s of speech (fixed durations: 250 and 750 frames, one piece each) at
32 and 12 steps: median wall time of text to waveform, real-time factor (wall / speech seconds), speed-up, time to
first audio (the package returns everything at once: its TTFA is its wall time; ours: codes plus the first piece's
decode; "cold": our first call of a bucket, graph capture included), ms a step of our loop, and the peak memory each
call adds above the resident models (GB). Texts are byte-tokenized (a tiny tokenizer with the special tokens), so a
prefix holds about as many rows as characters.

    python bench/bench_omnivoice.py [--repeats 5] [--seconds 10 30] [--steps 32 12]
    python bench/bench_omnivoice.py --tiny      # CPU smoke run at tiny sizes

The device needs the package: omnivoice 0.2.1 (--no-deps), pydub and soundfile wheels (torchaudio is stubbed here:
generate without a voice reference never resamples)."""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dit_core.codecs.higgs_audio import HiggsAudioCodec  # noqa: E402
from dit_core.codecs.omnivoice_audio import finish_speech  # noqa: E402
from dit_core.families.omnivoice import FRAME_RATE, SPECIAL_TOKENS, OmniVoice, Speech, speech_codes  # noqa: E402
from dit_core.gpu.omnivoice import GpuOmniVoice  # noqa: E402
from dit_core.sampling.omnivoice import Unmasking  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
from tiny_models import byte_tokenizer, torchaudio_stand_in  # noqa: E402

HIGGS = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"
REAL = dict(vocab_size=151676, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960)
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096)
SENTENCE = "The quick brown fox jumps over the lazy dog while the band plays on. "
CHARS_A_SECOND = 15  # English speech: about 15 characters a second


def imported_without_torchaudio(*names: str) -> list:
    """The modules, torchaudio stubbed while they import when it is missing (it has no build for every torch)."""
    if "torchvision" not in sys.modules and not torch.cuda.is_available():  # CPU torch beside a CUDA torchvision
        from host.run_comfy import TorchvisionOpsShim  # wheel (as tests/conftest.py)
        sys.meta_path.insert(0, TorchvisionOpsShim())
    with torchaudio_stand_in():
        return [importlib.import_module(n) for n in names]


def codec_config(tiny: bool):
    from transformers import DacConfig, HiggsAudioV2TokenizerConfig, HubertConfig
    if not tiny:  # the released tokenizer's sizes (tests/families/test_omnivoice_codec.py: test_real_sizes_on_meta)
        return HiggsAudioV2TokenizerConfig(
            acoustic_model_config=DacConfig(encoder_hidden_size=64, downsampling_ratios=[8, 5, 4, 2, 3],
                                            decoder_hidden_size=1024, upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=256),
            target_bandwidths=[0.5, 1, 1.5, 2])
    return HiggsAudioV2TokenizerConfig(
        acoustic_model_config=DacConfig(encoder_hidden_size=2, downsampling_ratios=[8, 5, 4, 2, 3], decoder_hidden_size=64,
                                        upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=16),
        semantic_model_config=HubertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=32, conv_dim=(8,) * 7, num_conv_pos_embeddings=16,
                                           num_conv_pos_embedding_groups=4),
        codebook_size=1024, codebook_dim=8, target_bandwidths=[0.5, 2.0])


def models(tiny: bool, device: torch.device, dtype: torch.dtype, int8: bool, eager: bool, agreement: bool):
    """(the package's model with its tokenizers, {name: our form}, our codec), one set of random weights. Ours: BF16
    graphed; with int8 also its linears quantized to INT8 ConvRot at load; with eager also BF16 without graphs; with
    agreement also the f32 form (the host's math; "f32", not timed)."""
    package, duration, higgs = imported_without_torchaudio("omnivoice.models.omnivoice", "omnivoice.utils.duration",
                                                           HIGGS)
    from transformers import Qwen3Config
    torch.manual_seed(0)
    llm = Qwen3Config(**(TINY if tiny else REAL))
    llm._attn_implementation = "sdpa"
    ccfg = codec_config(tiny)
    with torch.device(device):
        theirs = package.OmniVoice(package.OmniVoiceConfig(llm_config=llm)).eval()
        codec = higgs.HiggsAudioV2TokenizerModel(ccfg).eval()
    with torch.no_grad():  # random values of a trained model's scale (transformers' init leaves some at zero)
        for name, p in theirs.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else
                    torch.randn_like(p) / (p.shape[1] ** 0.5 if p.dim() == 2 and "embed" not in name else 1))
    theirs = theirs.to(dtype)
    tokenizer = byte_tokenizer(SPECIAL_TOKENS)
    theirs.text_tokenizer, theirs.duration_estimator = tokenizer, duration.RuleDurationEstimator()
    theirs.audio_tokenizer, theirs.sampling_rate = codec, ccfg.sample_rate
    state = {k: v.detach().float().cpu() for k, v in theirs.state_dict().items()}
    host = OmniVoice.load(TensorSource(state, "model.safetensors"))
    ours = {"ours BF16": GpuOmniVoice.of(host, device, dtype)}
    if eager:
        ours["ours BF16 eager"] = GpuOmniVoice.of(host, device, dtype, graphs=False)
    if agreement:
        ours["f32"] = GpuOmniVoice.of(host, device, torch.float32, graphs=False)
    if int8:
        ours["ours INT8"] = GpuOmniVoice.of(OmniVoice.load(TensorSource(state, "model.safetensors"), "int8"), device,
                                            dtype)
    del state, host
    decoder = HiggsAudioCodec.from_checkpoint(TensorSource({k: v.detach().float().cpu()
                                                            for k, v in codec.state_dict().items()}),
                                              ccfg.to_dict(), encoder=False).to(device)
    return theirs, tokenizer, ours, decoder


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_added(device: torch.device, run):
    """(run()'s result, the memory its call added at its peak above what was allocated before, GB)."""
    if device.type != "cuda":
        return run(), float("nan")
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = run()
    sync(device)
    return out, (torch.cuda.max_memory_allocated(device) - base) / 1e9


def run_ours(ours, tokenizer, decoder, device, text: str, frames: int, u: Unmasking, seed: int,
             trim: bool = False) -> dict:
    sync(device)
    t0 = time.perf_counter()
    codes = speech_codes(ours, tokenizer, [Speech(text, frames=frames)], u, seed)[0]
    sync(device)
    t_codes = time.perf_counter() - t0
    waves = [decoder.decode(codes[0])[0].cpu()]  # .cpu(): the first piece's audio is in host memory
    t_first = time.perf_counter() - t0
    waves += [decoder.decode(c)[0].cpu() for c in codes[1:]]
    finish_speech(waves if len(waves) > 1 else waves[0], decoder.cfg.sample_rate, None, trim=trim)
    return dict(wall=time.perf_counter() - t0, first=t_first, codes=t_codes)


def run_theirs(theirs, device, text: str, seconds: float, u: Unmasking, trim: bool = False) -> dict:
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        theirs.generate(text=text, duration=seconds, num_step=u.steps, guidance_scale=u.guidance, t_shift=u.t_shift,
                        postprocess_output=trim)
    wall = time.perf_counter() - t0
    return dict(wall=wall, first=wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run at tiny sizes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, nargs="+", default=None)
    ap.add_argument("--steps", type=int, nargs="+", default=None)
    ap.add_argument("--int8", action="store_true", help="also ours with the linears quantized to INT8 ConvRot")
    ap.add_argument("--eager", action="store_true", help="also ours BF16 without CUDA graphs")
    ap.add_argument("--postprocess", action="store_true",
                    help="both trim silences (the package's postprocess_output, our finish_speech's trim); off by "
                         "default: both then only match loudness, fade and pad")
    ap.add_argument("--profile", action="store_true",
                    help="then the kernels and host functions of ours BF16 at the last length and step count")
    ap.add_argument("--agreement", action="store_true",
                    help="the share of ours BF16's codes equal to ours f32's (the host's math) for the same seeds")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    seconds, steps = args.seconds or ([2.0, 4.0] if args.tiny else [10.0, 30.0]), args.steps or (
        [4, 2] if args.tiny else [32, 12])
    repeats = 1 if args.tiny else args.repeats
    theirs, tokenizer, ours, decoder = models(args.tiny, device, torch.bfloat16, args.int8, args.eager,
                                                args.agreement)
    first = next(iter(ours.values()))
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch "
          f"{torch.__version__}; ours: {'varlen FlashAttention' if first.flash else 'SDPA with a segment mask'}, "
          f"{'graphed' if first.graphs is not None else 'eager'} steps; median of {repeats}; silence trim "
          f"{'on' if args.postprocess else 'off'} for both")
    print("| speech | steps | who | wall s | RTF | speed-up | TTFA s | TTFA cold s | ms a step | peak added GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    exact = ours.pop("f32", None)
    for s in seconds:
        frames = int(s * FRAME_RATE)
        text = (SENTENCE * 40)[:int(s * CHARS_A_SECOND)].strip()
        for n in steps:
            u = Unmasking(steps=n)
            run_theirs(theirs, device, text, s, u, args.postprocess)  # warm-up
            runs = [peak_added(device, lambda: run_theirs(theirs, device, text, s, u, args.postprocess))
                    for _ in range(repeats)]
            tw = med([r for r, _ in runs], "wall")
            print(f"| {s:g} s | {n} | package | {tw:.3f} | {tw / s:.4f} | 1.00x | {med([r for r, _ in runs], 'first'):.3f}"
                  f" | | | {max(m for _, m in runs):.2f} |", flush=True)
            for name, form in ours.items():
                try:  # one variant failing leaves the others' rows
                    cold = run_ours(form, tokenizer, decoder, device, text, frames, u, 0, args.postprocess)  # capture
                    mine = [peak_added(device, lambda: run_ours(form, tokenizer, decoder, device, text, frames, u, r,
                                                                args.postprocess)) for r in range(repeats)]
                except Exception:  # noqa: BLE001
                    print(f"| {s:g} s | {n} | {name} | failed: {traceback.format_exc()!r} |", flush=True)
                    continue
                ow = med([r for r, _ in mine], "wall")
                print(f"| {s:g} s | {n} | {name} | {ow:.3f} | {ow / s:.4f} | {tw / ow:.2f}x | "
                      f"{med([r for r, _ in mine], 'first'):.3f} | {cold['first']:.3f} | "
                      f"{1e3 * med([r for r, _ in mine], 'codes') / n:.2f} | {max(m for _, m in mine):.2f} |",
                      flush=True)
    if args.profile and device.type == "cuda":
        from gpu_profile import print_profile
        s, n = seconds[-1], steps[-1]
        text = (SENTENCE * 40)[:int(s * CHARS_A_SECOND)].strip()
        print(f"\n## ours BF16, {s:g} s at {n} steps")
        print_profile(lambda: run_ours(ours["ours BF16"], tokenizer, decoder, device, text, int(s * FRAME_RATE),
                                       Unmasking(steps=n), 0, args.postprocess), host=True)
    if exact is not None:
        for s, n in dict.fromkeys(((seconds[0], steps[0]), (seconds[-1], steps[-1]))):
            speech = [Speech((SENTENCE * 40)[:int(s * CHARS_A_SECOND)].strip(), frames=int(s * FRAME_RATE))]
            shares = []
            for seed in range(3):
                a, b = (speech_codes(f, tokenizer, speech, Unmasking(steps=n), seed)[0][0]
                        for f in (ours["ours BF16"], exact))
                shares.append((a == b).float().mean().item())
            print(f"{s:g} s, {n} steps: ours BF16's codes equal to ours f32's: "
                  f"{', '.join(f'{x:.1%}' for x in shares)} (seeds 0-2)", flush=True)


if __name__ == "__main__":
    main()
