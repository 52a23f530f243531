"""dit_core/codecs/h3_video_vae.py against diffusers 0.42.1 AutoencoderKLMiniMaxH3 (a tiny random model saved in
diffusers' own names: diffusers has no single-file converter for this VAE)."""

import pytest
import torch
from conftest import rel_err
from diffusers import AutoencoderKLMiniMaxH3
from safetensors.torch import save_file
from tiny_models import int8_convrot_state

from dit_core.codecs.h3_video_vae import PIXEL_MEAN, PIXEL_STD, VideoDecoder
from dit_core.weights import WeightsError, dequantize_convrot

# The released geometry (/16, /4, 24 latent channels, 4 registers) with a tiny encoder and a 2 x 16 decoder.
CONFIG = {"block_out_channels": (8,) * 6, "layers_per_block": 1, "norm_num_groups": 4, "decoder_num_layers": 2,
          "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 16}


def tiny_vae() -> AutoencoderKLMiniMaxH3:
    g = torch.Generator().manual_seed(0)
    mean = (torch.randn(24, generator=g) * 0.5).tolist()
    std = (torch.rand(24, generator=g) + 0.5).tolist()
    vae = AutoencoderKLMiniMaxH3(**CONFIG, latents_mean=mean, latents_std=std).eval()
    # Every parameter random (diffusers zero-initializes the gates and registers: a zero gate would hide a block).
    with torch.no_grad():
        for name, p in vae.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.dim() >= 2 and "register" not in name:
                p.copy_(r / p[0].numel() ** 0.5)
            elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                p.copy_(1 + 0.2 * r)
            else:
                p.copy_(0.5 * r)
    return vae


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    vae = tiny_vae()
    path = tmp_path_factory.mktemp("vae") / "minimax_h3_video_vae.safetensors"
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(path))
    dec = VideoDecoder.load(path, vae.config.latents_mean, vae.config.latents_std, head_dim=16)
    return vae, dec


def latents(t, h, w, b=1, seed=1):
    return torch.randn(b, 24, t, h, w, generator=torch.Generator().manual_seed(seed))


def reference(vae, z):
    """The pipeline's decode step (modular_pipelines/minimax_h3/decoders.py) as ComfyUI IMAGE frames."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        x = vae.decode(z * std + mean).sample
    x = (x * torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1) + torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1))
    return x.clamp(0, 1).permute(0, 2, 3, 4, 1).flatten(0, 1)


def test_whole_clip_matches_diffusers(h3):
    vae, dec = h3
    z = latents(3, 2, 3)
    with torch.no_grad():
        ref = vae.decoder(vae.post_quant_conv(z))
    out = dec.forward(z)
    assert out.shape == ref.shape == (1, 3, 12, 32, 48)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("t", [7, 12, 9])  # one clip, two cross-faded clips, a length padded to whole clips
def test_clips_match_diffusers(h3, t):
    vae, dec = h3
    vae.disable_tiling()
    z = latents(t, 2, 3, b=2 if t == 7 else 1)
    ref = reference(vae, z)
    out = dec.decode(z, tile=None)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("tiling,hw", [((256, 256, 64, 64), (20, 3)), ((64, 64, 16, 16), (6, 7))])
def test_tiles_match_diffusers(h3, tiling, hw):
    vae, dec = h3
    vae.enable_tiling(*tiling)
    z = latents(7, *hw, seed=2)
    ref = reference(vae, z)
    vae.disable_tiling()
    whole = reference(vae, z)
    out = dec.decode(z, tile=tiling[0], overlap=tiling[2])
    assert rel_err(ref, whole) > 1e-3  # the tiles are visible: the comparison says something
    assert rel_err(out, ref) <= 1e-4


def test_int8_convrot_file_dequantized(h3, tmp_path):
    """A file whose blocks' linears are INT8 ConvRot (ComfyUI's markers) decodes as diffusers does with those
    linears set to the dequantized codes."""
    vae, _ = h3
    state = int8_convrot_state(vae.state_dict(), lambda k: "transformer_blocks" in k, group=16)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "int8.safetensors"))
    dec = VideoDecoder.load(tmp_path / "int8.safetensors", vae.config.latents_mean, vae.config.latents_std, 16)
    back = tiny_vae()
    with torch.no_grad():
        for key, p in back.named_parameters():
            if key + "_scale" in state:
                p.copy_(dequantize_convrot(state[key], state[key + "_scale"], 16))
    z = latents(3, 2, 3)
    with torch.no_grad():
        ref = back.decoder(back.post_quant_conv(z))
        f32 = vae.decoder(vae.post_quant_conv(z))
    assert rel_err(dec.forward(z), ref) <= 1e-4
    assert 0 < rel_err(ref, f32) <= 3e-2  # the codes differ from f32, by an INT8 step


def test_short_latents_decode_one_clip(h3):
    # diffusers' clip loop decodes nothing below 7 latents; an image (1 latent) is one frame, 2 latents 5 frames.
    _, dec = h3
    for t, frames in ((1, 1), (2, 5)):
        z = latents(t, 2, 3)
        out = dec.decode(z, tile=None)
        assert out.shape == (frames, 32, 48, 3)
        assert torch.equal(out, dec.decode(z)[-frames:])


def test_wrong_file_names_the_fix(tmp_path):
    save_file({"x.weight": torch.zeros(2, 2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(WeightsError, match="other.safetensors.*decoder.proj_in.weight"):
        VideoDecoder.load(tmp_path / "other.safetensors")
