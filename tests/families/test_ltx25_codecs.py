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
from tiny_models import randomized_vocoder, save_ltx2_audio

from dit_core.codecs.ltx2_audio_vae import AudioDecoder
from dit_core.codecs.ltx2_video_vae import TEMPLATE_TILES, VideoDecoder, VideoEncoder, tile_sizes
from dit_core.codecs.ltx2_vocoder import Vocoder
from dit_core.weights import WeightsError

pytest.importorskip("diffusers")
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
from diffusers.loaders.single_file_utils import (
    convert_ltx2_audio_vae_to_diffusers,
    convert_ltx2_vae_to_diffusers,
)
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

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
        k = re.sub(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.",
                   lambda m: f"encoder.down_blocks.{2 * int(m[1]) + 1}.", k)
        k = re.sub(r"encoder\.down_blocks\.(\d+)\.resnets",
                   lambda m: f"encoder.down_blocks.{2 * int(m[1])}.resnets", k)
        k = k.replace("encoder.mid_block.", f"encoder.down_blocks.{2 * (len(VIDEO['layers_per_block']) - 1)}.")
        k = k.replace("latents_mean", "per_channel_statistics.mean-of-means")
        k = k.replace("latents_std", "per_channel_statistics.std-of-means")
        k = re.sub(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.",
                   lambda m: f"decoder.up_blocks.{2 * int(m[1]) + 1}.", k)
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
    assert set(convert_ltx2_vae_to_diffusers(dict(ours))) == set(vae.state_dict())


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


@pytest.mark.parametrize("frames,height,width", [(1, 64, 64), (9, 32, 96)])
def test_encoder_matches_diffusers(video, tmp_path, frames, height, width):
    """i2v keyframes (one frame) and a short clip: normalized posterior means, as the i2v pipelines condition."""
    vae, _ = video
    enc = VideoEncoder.load(video_file(tmp_path, vae))
    assert enc.shape.strides == ((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2))
    image = torch.rand(frames, height, width, 3, generator=torch.Generator().manual_seed(10))
    view = (1, -1, 1, 1, 1)
    with torch.no_grad():
        means = vae.encode(image.permute(3, 0, 1, 2)[None] * 2 - 1).latent_dist.mode()
    ref = (means - vae.latents_mean.view(view)) / vae.latents_std.view(view)
    out = enc.encode(image)
    assert out.shape == ref.shape == (1, 128, (frames - 1) // 8 + 1, height // 32, width // 32)
    assert rel_err(out, ref) <= 1e-4
    with pytest.raises(ValueError, match="1 \\+ 8k"):
        enc.encode(image[:, :, :40])


def test_video_loader_names_the_problem(tmp_path, video):
    vae, _ = video
    state = original_video_names(vae.state_dict())
    path = tmp_path / "not_ltx.safetensors"
    save_file({k.replace("conv_in.conv", "conv_in"): v for k, v in state.items()}, str(path))
    with pytest.raises(WeightsError, match="no 'vae.decoder.conv_in.conv.weight'"):
        VideoDecoder.load(path)
    with pytest.raises(ValueError, match="LTX-2 video latents"):
        video[1].decode(torch.zeros(1, 16, 2, 2, 2))


# --- audio: the VAE decoder and the vocoder, both from one file as ComfyUI's LTXVAudioVAELoader reads it ---

# The released layout (8 latent channels x 16 mel bins, ch_mult 1-2-4, causal in time, pixel norm) at base 8.
AUDIO = {"base_channels": 8, "output_channels": 2, "ch_mult": (1, 2, 4), "num_res_blocks": 1, "latent_channels": 8,
         "norm_type": "pixel", "causality_axis": "height", "mel_bins": 64}
# BigVGAN stages as released but narrow and short: stage hop 4 (x2 x2), extender x12 = 3 (48/16 kHz) x mel hop 4;
# unequal dilation counts across the stage's two kernels.
STAGE = {"upsample_factors": [2, 2], "upsample_kernel_sizes": [4, 4], "resnet_kernel_sizes": [3, 5],
         "resnet_dilations": [[1, 3], [1, 2, 3]]}
BWE = {"upsample_factors": [6, 2], "upsample_kernel_sizes": [12, 4], "resnet_kernel_sizes": [3],
       "resnet_dilations": [[1, 3, 5]]}
VOCODER = {"hidden_channels": 16, **STAGE, "final_act_fn": "clamp", "bwe_hidden_channels": 8,
           **{f"bwe_{k}": v for k, v in BWE.items()}, "filter_length": 16, "hop_length": 4, "window_length": 16}


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    vae, vocoder = randomized(AutoencoderKLLTX2Audio(**AUDIO), 6), randomized_vocoder(LTX2VocoderWithBWE(**VOCODER))
    path = tmp_path_factory.mktemp("audio") / "ltx-2.5-audio-vae.safetensors"
    stats, state = save_ltx2_audio(vae, vocoder, path, seed=8)
    return {"vae": vae, "vocoder": vocoder, "stats": stats, "state": state, "path": path,
            "decoder": AudioDecoder.load(path)}


def test_audio_file_names_are_what_diffusers_converter_reads(audio):
    vae, state = audio["vae"], audio["state"]
    converted = convert_ltx2_audio_vae_to_diffusers({k: v for k, v in state.items() if k.startswith("audio_vae.")})
    assert set(converted) - {"latents_mean", "latents_std"} == {k for k in vae.state_dict()
                                                                  if not k.startswith("latents_")}


def test_audio_decode_matches_diffusers(audio):
    vae, stats, dec = audio["vae"], audio["stats"], audio["decoder"]
    z = torch.randn(2, 8, 6, 16, generator=torch.Generator().manual_seed(8))
    packed = LTX2Pipeline._pack_audio_latents(z)  # the pipeline's de-normalization, on a latent row of 128
    packed = LTX2Pipeline._denormalize_audio_latents(packed, *stats.values())
    with torch.no_grad():
        ref = vae.decode(LTX2Pipeline._unpack_audio_latents(packed, 6, num_mel_bins=16)).sample
    out = dec.decode(z)
    assert out.shape == ref.shape == (2, 2, 21, 64)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("stage_clamp", [None, False])
def test_vocoder_matches_diffusers(audio, stage_clamp):
    """The file's config leaves the first stage's final activation on (ComfyUI clamps it); diffusers' class
    default (final_act_fn None) leaves it off: both, each against diffusers configured alike."""
    voc = Vocoder.load(audio["path"], stage_clamp=stage_clamp)
    ref_model = audio["vocoder"]
    if stage_clamp is False:
        ref_model = LTX2VocoderWithBWE(**{**VOCODER, "final_act_fn": None}).eval()
        ref_model.load_state_dict(audio["vocoder"].state_dict())
    mel = torch.randn(2, 2, 7, 64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ref = ref_model(mel)
    out = voc.forward(mel)
    assert out.shape == ref.shape == (2, 2, 7 * 4 * 3)
    assert (out.abs() < 1).float().mean() > 0.5  # mostly inside the final clamp: the comparison means something
    assert rel_err(out, ref) <= 1e-4
    result = voc.audio(mel)
    assert result["sample_rate"] == 48000 and torch.equal(result["waveform"], out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_codecs_on_the_card_match_the_host(video, audio, tmp_path):
    """As the nodes place them on a GPU: the video decoder in BF16 (tiled as the template decodes), its encoder, the
    audio decoder and the vocoder f32; each against its host f32 result, IMAGE and AUDIO back on the CPU."""
    vae, host = video
    z = video_latents(3, 5, 6, seed=11)
    tiles = (128, 32, 16, 8)  # 4 latents overlapping by 1: tiles of 4 and 2 rows, 4 and 3 columns
    frames = host.to("cuda", torch.bfloat16).decode(z, tiles=tiles)
    assert frames.device.type == "cpu" and rel_err(frames, host.decode(z, tiles=tiles)) <= 2e-2
    enc = VideoEncoder.load(video_file(tmp_path, vae))
    image = torch.rand(9, 64, 64, 3, generator=torch.Generator().manual_seed(12))
    assert rel_err(enc.to("cuda").encode(image).cpu(), enc.encode(image)) <= 1e-4
    dec, voc = audio["decoder"], Vocoder.load(audio["path"])
    za = torch.randn(1, 8, 6, 16, generator=torch.Generator().manual_seed(13))
    mel = dec.to("cuda").decode(za)
    # cuDNN's f32 convolutions sum in another order: 1.3e-4 (mel) and 3.7e-4 (waveform) measured on the H200
    assert rel_err(mel.cpu(), dec.decode(za)) <= 1e-3
    sound = voc.to("cuda").audio(mel)
    assert sound["waveform"].device.type == "cpu"
    assert rel_err(sound["waveform"], voc.audio(dec.decode(za))["waveform"]) <= 1e-3
