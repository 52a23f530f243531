"""Video VAE decode at the templates' sizes, ours against diffusers' on the same random weights in the same run:
seconds, peak GPU memory above the weights, and the frames' PSNR between the two (both in BF16 on the GPU).
  h3: AutoencoderKLMiniMaxH3 as released (diffusers' defaults), the t2v template's 124 frames at 864x480 (latent
      [1, 24, 37, 30, 54]); ours as the VAE Decode node runs it (clips of 7 latents, 256-px tiles), diffusers' decode
      with the same tiles.
  ltx25: AutoencoderKLLTX2Video as released (its decoder not causal, as the file's config says), stage 2's 121 frames
      at 1280x704 (latent [1, 128, 16, 22, 40]); ours in the template's VAEDecodeTiled(512, 64, 64, 16) tiles,
      diffusers' decode with its own tiling (other tiles and blend: the PSNR holds their seams too).
Times include the frames' trip to the host as ComfyUI's IMAGE (both sides).

    python bench/bench_video_decode.py [--only h3 ltx25]    # on a GPU, diffusers installed (the peers' carry)
    python bench/bench_video_decode.py --tiny                # on the CPU: the tests' tiny VAEs, f32
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from dit_core.codecs import h3_video_vae, ltx2_video_vae  # noqa: E402
from tiny_models import builders  # noqa: E402

# (latent frames, height, width) of the templates' clips, and of the tiny smoke run
SIZES = {"h3": (37, 30, 54), "ltx25": (16, 22, 40)}
TINY_SIZES = {"h3": (12, 20, 3), "ltx25": (5, 6, 6)}


def timed(fn, device: torch.device):
    """(seconds, peak GB allocated above what was allocated before, fn's result)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return seconds, (torch.cuda.max_memory_allocated() - base) / 1e9 if cuda else 0.0, out


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 1.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse)


def h3(device: torch.device, dtype: torch.dtype, tiny: bool, folder: Path):
    """(ours, diffusers') decode of one random latent: IMAGE frames on the host."""
    from diffusers import AutoencoderKLMiniMaxH3
    tests = builders("dit_core/codecs/test_h3_video_vae.py")
    g = torch.Generator().manual_seed(0)
    mean, std = (torch.randn(24, generator=g) * 0.5).tolist(), (torch.rand(24, generator=g) + 0.5).tolist()
    with device:
        vae = AutoencoderKLMiniMaxH3(**(tests.CONFIG if tiny else {}), latents_mean=mean, latents_std=std)
    vae = tests.randomized(vae, g)  # (drawn on the host: the generator's)
    path = folder / "h3_vae.safetensors"
    save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in vae.state_dict().items()}, str(path))
    vae = vae.to(dtype)
    head = tests.CONFIG["decoder_attention_head_dim"] if tiny else h3_video_vae.HEAD_DIM
    ours = h3_video_vae.VideoDecoder.load(path, mean, std, head_dim=head).to(device, dtype)
    z = torch.randn(1, 24, *(TINY_SIZES if tiny else SIZES)["h3"], generator=g)
    view = (1, -1, 1, 1, 1)
    pixel_mean, pixel_std = (torch.tensor(v, device=device).view(view) for v in (h3_video_vae.PIXEL_MEAN,
                                                                                h3_video_vae.PIXEL_STD))

    def theirs(z):
        tile, overlap = h3_video_vae.TILE, h3_video_vae.TILE_OVERLAP
        vae.enable_tiling(tile, tile, overlap, overlap)  # ours' tiles: the same frames within bf16
        raw = z.to(device) * torch.tensor(std, device=device).view(view) + torch.tensor(mean, device=device).view(view)
        with torch.no_grad():
            x = vae.decode(raw.to(dtype)).sample.float()
        return (x * pixel_std + pixel_mean).clamp(0, 1).permute(0, 2, 3, 4, 1).flatten(0, 1).cpu()

    return ours.decode, theirs, z


def ltx25_vaes(device: torch.device, dtype: torch.dtype, tiny: bool, folder: Path):
    """diffusers' LTX-2 video VAE (as released, or the tests' tiny one) with random weights on device in dtype,
    and our decoder of the same weights (read from the file it was saved to)."""
    from diffusers import AutoencoderKLLTX2Video
    tests = builders("families/test_ltx25_codecs.py")
    with device:
        # the release's ratios, as its config gives them (the class would derive x64 / x16 from the encoder's
        # four scalings, one of them temporal only: its tiles would then be 8 latents with 1-latent remainders)
        vae = AutoencoderKLLTX2Video(**(tests.VIDEO if tiny else {"decoder_causal": False}),
                                     spatial_compression_ratio=32, temporal_compression_ratio=8)
    vae = tests.randomized(vae, 2)
    path = folder / "ltx_vae.safetensors"
    save_file({k: v.to("cpu", dtype) for k, v in tests.original_video_names(vae.state_dict()).items()}, str(path),
              metadata={"config": json.dumps({"vae": {"causal_decoder": False}})})
    return vae.to(dtype), ltx2_video_vae.VideoDecoder.load(path).to(device, dtype)


def ltx25(device: torch.device, dtype: torch.dtype, tiny: bool, folder: Path):
    vae, ours = ltx25_vaes(device, dtype, tiny, folder)
    g = torch.Generator().manual_seed(3)
    z = torch.randn(1, 128, *(TINY_SIZES if tiny else SIZES)["ltx25"], generator=g)
    tiles = LTX25_TINY_TILES if tiny else ltx2_video_vae.TEMPLATE_TILES
    return (lambda z: ours.decode(z, tiles=tiles)), (lambda z: ltx25_diffusers_decode(vae, z)), z


LTX25_TINY_TILES = (128, 32, 24, 8)


def ltx25_diffusers_decode(vae, z: torch.Tensor) -> torch.Tensor:
    """diffusers' decode of normalized latents z with its own tiling, as IMAGE frames on the host."""
    view, p = (1, -1, 1, 1, 1), next(vae.parameters())
    vae.enable_tiling()
    raw = z.to(p.device) * vae.latents_std.view(view).float() + vae.latents_mean.view(view).float()
    with torch.no_grad():
        x = vae.decode(raw.to(p.dtype), causal=False).sample.float()
    return ((x + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).flatten(0, 1).cpu()


CASES = {"h3": h3, "ltx25": ltx25}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(CASES), choices=list(CASES))
    p.add_argument("--tiny", action="store_true", help="the tests' tiny VAEs and latents (on the CPU where no GPU)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from graph_peers import torchvision_shim
    torchvision_shim()  # CPU torch beside the dev venv's CUDA torchvision wheel
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# video decode, {name}, torch {torch.__version__}, {dtype}; random weights\n")
    print("| family | latent | ours s | ours peak GB | diffusers s | diffusers peak GB | ours vs diffusers | "
          "PSNR ours vs diffusers (dB) |")
    print("|---|---|---|---|---|---|---|---|")
    for family in args.only:
        with tempfile.TemporaryDirectory(prefix="bench_video_decode_") as folder:
            ours, theirs, z = CASES[family](device, dtype, args.tiny, Path(folder))
            small = z[:, :, :7, :4, :4]  # (a clip of H3's) first calls (cuDNN's plans, allocator) out of the timed ones
            ours(small), theirs(small)
            ours_s, ours_gb, ours_frames = timed(lambda: ours(z), device)
            theirs_s, theirs_gb, theirs_frames = timed(lambda: theirs(z), device)
        print(f"| {family} | {list(z.shape)} | {ours_s:.2f} | {ours_gb:.2f} | {theirs_s:.2f} | {theirs_gb:.2f} | "
              f"{theirs_s / ours_s:.2f}x | {psnr(ours_frames, theirs_frames):.1f} |", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
