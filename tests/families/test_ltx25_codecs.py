"""LTX-2.5's decoders (dit_core/codecs/ltx2_video_vae.py, ltx2_audio_vae.py, ltx2_vocoder.py) against diffusers
0.42.1 (AutoencoderKLLTX2Video, AutoencoderKLLTX2Audio, LTX2VocoderWithBWE): tiny random models saved in the
single files' original names (`vae.*`; `audio_vae.*` + `vocoder.*`), checked to map onto diffusers' names by
diffusers' own single-file converters where it has them."""
import json
import re

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file

from dit_core.codecs.ltx2_video_vae import TEMPLATE_TILES, VideoDecoder, tile_sizes
from dit_core.weights import WeightsError

pytest.importorskip("diffusers")
from diffusers import AutoencoderKLLTX2Video
from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers

# The released decoder's geometry (128 latent channels, three x2 depth-to-space upsamplers, patch 4) at widths
# 32 -> 16 -> 8 -> 4 with one or two resnets a level; the encoder is built only because the class needs it.
VIDEO = {"block_out_channels": (8, 8, 8, 8), "layers_per_block": (1, 1, 1, 1, 1),
         "decoder_block_out_channels": (8, 16, 32), "decoder_layers_per_block": (1, 2, 1, 1),
         "decoder_causal": False}


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter and statistic random, fan-in scaled (tables and biases O(1)), so no path is zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.is_floating_point():
                r = torch.randn(p.shape, generator=g)
                p.copy_(r / p[0].numel() ** 0.5 if p.dim() >= 2 and p.shape[-1] != p[0].numel() else 0.5 * r)
    return module.eval()


def original_video_names(state: dict) -> dict:
    """diffusers' AutoencoderKLLTX2Video names -> the single file's (the inverse of convert_ltx2_vae_to_diffusers,
    plus the timestep-conditioned decoder's `last_*` names, which that converter does not know)."""
    out = {}
    for k, v in state.items():
        if k.startswith("encoder."):
            continue  # the decoder test needs no encoder tensors
        k = k.replace("latents_mean", "per_channel_statistics.mean-of-means")
        k = k.replace("latents_std", "per_channel_statistics.std-of-means")
        k = re.sub(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m: f"decoder.up_blocks.{2 * int(m[1]) + 1}.", k)
        k = re.sub(r"decoder\.up_blocks\.(\d+)\.(resnets|time_embedder)",
                   lambda m: f"decoder.up_blocks.{2 * int(m[1]) + 2}.{m[2]}", k)
        k = k.replace("decoder.mid_block.", "decoder.up_blocks.0.")
        k = k.replace(".resnets.", ".res_blocks.")
        k = re.sub(r"^decoder\.(time_embedder|scale_shift_table)", r"decoder.last_\1", k)
        out["vae." + k] = v.contiguous()
    return out


def video_file(tmp_path, vae, name="ltx-2.5-video-vae.safetensors"):
    path = tmp_path / name
    save_file(original_video_names(vae.state_dict()), str(path),
              metadata={"config": json.dumps({"vae": {"causal_decoder": False}})})
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    vae = randomized(AutoencoderKLLTX2Video(**VIDEO), 0)
    return vae, VideoDecoder.load(video_file(tmp_path_factory.mktemp("video"), vae))


def video_latents(f, h, w, seed=1, b=1):
    return torch.randn(b, 128, f, h, w, generator=torch.Generator().manual_seed(seed))


def reference_frames(vae, z, temb=None):
    """diffusers' pipeline decode step (de-normalize, decode, [-1, 1] -> [0, 1]) as ComfyUI IMAGE frames."""
    view = (1, -1, 1, 1, 1)
    with torch.no_grad():
        x = vae.decode(z * vae.latents_std.view(view) + vae.latents_mean.view(view), temb, causal=False).sample
    return ((x + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).flatten(0, 1)


def test_file_names_are_what_diffusers_converter_reads(video):
    vae, _ = video
    ours = original_video_names(vae.state_dict())
    converted = convert_ltx2_vae_to_diffusers(dict(ours))
    expected = {k for k in vae.state_dict() if not k.startswith("encoder.")}
    assert set(converted) == expected


def test_whole_decode_matches_diffusers(video):
    vae, dec = video
    z = video_latents(3, 2, 3, b=2)
    out = dec.decode(z, tiles=None)
    ref = reference_frames(vae, z)
    assert out.shape == ref.shape == (2 * 17, 64, 96, 3)
    assert rel_err(out, ref) <= 1e-4


def test_template_tiles_equal_whole_when_one_tile_covers(video):
    _, dec = video
    z = video_latents(3, 2, 3)
    assert tile_sizes(*TEMPLATE_TILES) == ((8, 16, 16), (2, 2, 2))
    assert torch.equal(dec.decode(z), dec.decode(z, tiles=None))


def test_several_tiles_match_comfyui_tiling_of_diffusers(video, comfy):
    """VAEDecodeTiled's blend is ComfyUI's tiled_scale_multidim (the template decodes with it), not diffusers'
    tiled_decode (tiles of 512 px stride 448 and 16 frames stride 8, a different split and ramp): so the oracle
    is ComfyUI's own tiling function driving diffusers' decoder, here with 4-latent tiles overlapping by 1 and
    2-latent clips overlapping by 1 (2 x 2 x 2 tiles)."""
    import comfy.utils

    vae, dec = video
    tiles = (128, 32, 16, 8)
    (tile_t, tile_s, _), (over_t, over_s, _) = tile_sizes(*tiles)
    assert (tile_t, tile_s, over_t, over_s) == (2, 4, 1, 1)
    z = dec.raw_latents(video_latents(3, 5, 5, seed=3))
    with torch.no_grad():
        ref = comfy.utils.tiled_scale_multidim(
            z, lambda a: vae.decoder(a, None, causal=False), tile=(tile_t, tile_s, tile_s),
            overlap=(over_t, over_s, over_s), upscale_amount=(lambda a: max(0, a * 8 - 7), 32, 32),
            out_channels=3, index_formulas=(8, 32, 32))
    counts = []
    out = dec.decode_raw(z, (tile_t, tile_s, tile_s), (over_t, over_s, over_s),
                         progress=lambda done, total: counts.append((done, total)))
    assert counts[-1] == (8, 8)
    assert out.shape == ref.shape == (1, 3, 17, 160, 160)
    assert rel_err(out, ref) <= 1e-4


def test_timestep_conditioned_decoder_matches_diffusers(tmp_path):
    vae = randomized(AutoencoderKLLTX2Video(**VIDEO, timestep_conditioning=True), 4)
    dec = VideoDecoder.load(video_file(tmp_path, vae))
    assert dec.shape.timestep_conditioning
    z = video_latents(2, 2, 2, seed=5)
    out = dec.decode(z, tiles=None, timestep=0.05)
    assert rel_err(out, reference_frames(vae, z, torch.tensor([0.05]))) <= 1e-4
    with pytest.raises(ValueError, match="timestep"):
        dec.decode(z, tiles=None)


def test_video_loader_names_the_problem(tmp_path, video):
    vae, _ = video
    state = original_video_names(vae.state_dict())
    path = tmp_path / "not_ltx.safetensors"
    save_file({k.replace("conv_in.conv", "conv_in"): v for k, v in state.items()}, str(path))
    with pytest.raises(WeightsError, match="no 'decoder.conv_in.conv.weight'"):
        VideoDecoder.load(path)
    with pytest.raises(ValueError, match="LTX-2 video latents"):
        video[1].decode(torch.zeros(1, 16, 2, 2, 2))
