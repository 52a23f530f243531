"""dit_core/codecs/h3_video_vae.py against diffusers 0.42.1 AutoencoderKLMiniMaxH3 (a tiny random model saved in
diffusers' own names: diffusers has no single-file converter for this VAE)."""

import math

import pytest
import torch
from conftest import rel_err
from diffusers import AutoencoderKLMiniMaxH3
from safetensors.torch import save_file
from tiny_models import int8_convrot_state

from dit_core.codecs.h3_video_vae import PIXEL_MEAN, PIXEL_STD, VideoDecoder, VideoEncoder
from dit_core.weights import TensorSource, WeightsError, dequantize_convrot

# The released geometry (/16, /4, 24 latent channels, 4 registers) with a tiny encoder and a 2 x 16 decoder.
CONFIG = {"block_out_channels": (8,) * 6, "layers_per_block": 1, "norm_num_groups": 4, "decoder_num_layers": 2,
          "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 16}


def tiny_vae() -> AutoencoderKLMiniMaxH3:
    g = torch.Generator().manual_seed(0)
    mean = (torch.randn(24, generator=g) * 0.5).tolist()
    std = (torch.rand(24, generator=g) + 0.5).tolist()
    return randomized(AutoencoderKLMiniMaxH3(**CONFIG, latents_mean=mean, latents_std=std), g)


def randomized(vae: AutoencoderKLMiniMaxH3, g: torch.Generator) -> AutoencoderKLMiniMaxH3:
    """Every parameter random (diffusers zero-initializes the gates and registers: a zero gate would hide a block),
    matrices fan-in scaled, norm gains near 1; the buffers (its rotary tables) left as computed."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.dim() >= 2 and "register" not in name:
                p.copy_(r / p[0].numel() ** 0.5)
            elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                p.copy_(1 + 0.2 * r)
            else:
                p.copy_(0.5 * r)
    return vae.eval()


@pytest.fixture(scope="module")
def h3_file(tmp_path_factory):
    vae = tiny_vae()
    path = tmp_path_factory.mktemp("vae") / "minimax_h3_video_vae.safetensors"
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(path))
    return vae, path


@pytest.fixture(scope="module")
def h3(h3_file):
    vae, path = h3_file
    return vae, VideoDecoder.load(path, vae.config.latents_mean, vae.config.latents_std, head_dim=16)


@pytest.fixture(scope="module")
def h3_encoder(h3_file):
    vae, path = h3_file
    groups = CONFIG["norm_num_groups"]
    return vae, VideoEncoder.load(path, vae.config.latents_mean, vae.config.latents_std, groups=groups)


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


# --- the encoder -----------------------------------------------------------------------------------------

def frames(f, h, w, seed=3):
    """Random 8-bit frames [1, 3, F, H, W] as uint8 (what diffusers' condition encoder takes)."""
    return torch.randint(0, 256, (1, 3, f, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def as_image(pixels):
    return (pixels.float() / 255.0)[0].permute(1, 2, 3, 0)  # ComfyUI IMAGE [F, H, W, 3]


def encode_reference(vae, pixels):
    """diffusers' encode of the ImageNet-normalized frames: the posterior mean, normalized with latents_mean/std."""
    pm, ps = (torch.tensor(v).view(1, -1, 1, 1, 1) for v in (PIXEL_MEAN, PIXEL_STD))
    with torch.no_grad():
        mean = vae.encode((pixels.float() / 255.0 - pm) / ps).latent_dist.mean
    lm, ls = (torch.tensor(v).view(1, -1, 1, 1, 1) for v in (vae.config.latents_mean, vae.config.latents_std))
    return (mean - lm) / ls


def test_encoder_clip_matches_diffusers(h3_encoder):
    vae, enc = h3_encoder
    x = torch.randn(1, 3, 17, 40, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = vae.quant_conv(vae.encoder(x))
    out = enc.forward(x)
    assert out.shape == ref.shape == (1, 48, 5, 2, 2)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("f,latent_frames", [(1, 1), (5, 2), (22, 7)])  # an image, a padded clip, two clips
def test_encode_matches_diffusers(h3_encoder, f, latent_frames):
    vae, enc = h3_encoder
    vae.disable_tiling()
    pixels = frames(f, 32, 48)
    ref = encode_reference(vae, pixels)
    out = enc.encode(as_image(pixels), tile=None)
    assert out.shape == ref.shape == (1, 24, latent_frames, 2, 3) and out.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-4


def test_encode_tiles_match_diffusers(h3_encoder):
    vae, enc = h3_encoder
    pixels = frames(5, 48, 48, seed=4)  # one clip in 2 x 2 tiles of 32 pixels
    vae.enable_tiling(32, 32, 16, 16)
    ref = encode_reference(vae, pixels)
    vae.disable_tiling()
    whole = encode_reference(vae, pixels)
    out = enc.encode(as_image(pixels), tile=32, overlap=16)
    assert out.shape == ref.shape == (1, 24, 2, 3, 3)
    assert rel_err(ref, whole) > 1e-3  # the tiles are visible: the comparison says something
    assert rel_err(out, ref) <= 1e-4


def test_encode_sampled_as_the_condition_recipe(h3_encoder):
    """sample_seed gives diffusers' keyframe latent (encode_vae_condition: a sample under the seed, rounded to
    f16), tiled as released; 2 x 2 tiles of 48 pixels, the overlaps widened from 16 to 32."""
    encoders = pytest.importorskip("diffusers.modular_pipelines.minimax_h3.encoders")
    vae, enc = h3_encoder
    vae.enable_tiling(48, 48, 16, 16)
    pixels = frames(1, 64, 64, seed=6)
    ref = encoders.encode_vae_condition(vae, pixels, PIXEL_MEAN, PIXEL_STD, encode_seed=42)
    out = enc.encode(as_image(pixels), tile=48, overlap=16, sample_seed=42)
    assert rel_err(out, ref) <= 1e-4
    assert rel_err(enc.encode(as_image(pixels), tile=48, overlap=16), ref) > 1e-2  # the sample is not the mean


def test_encoder_file_errors(h3_file, tmp_path):
    vae, path = h3_file
    with pytest.raises(WeightsError, match="6 levels .* downsample factors"):
        VideoEncoder.load(path, vae.config.latents_mean, vae.config.latents_std, spatial=(2, 2, 4),
                          temporal=(1, 2, 2), groups=4)
    with pytest.raises(WeightsError, match="level 3's downsampler"):
        VideoEncoder.load(path, vae.config.latents_mean, vae.config.latents_std, spatial=(2, 2, 2, 1, 2, 1),
                          groups=4)
    with pytest.raises(WeightsError, match="latents_mean"):
        VideoEncoder.load(path, groups=4)
    state = dict(vae.state_dict())
    state["encoder.conv_in.weight"] = state["encoder.conv_in.weight"].to(torch.int8)
    with pytest.raises(WeightsError, match=r"'encoder\.conv_in\.weight' is stored as torch\.int8"):
        VideoEncoder.load(TensorSource(state), vae.config.latents_mean, vae.config.latents_std, groups=4)
    decoder_only = {k: v for k, v in vae.state_dict().items() if not k.startswith("encoder.")}
    save_file({k: v.contiguous() for k, v in decoder_only.items()}, str(tmp_path / "dec.safetensors"))
    with pytest.raises(WeightsError, match=r"dec\.safetensors: no 'encoder\.conv_in\.weight'"):
        VideoEncoder.load(tmp_path / "dec.safetensors")


def test_real_size_encoder_reads_with_h3_defaults():
    """The released sizes (diffusers' defaults), shapes only: H3's factors and 32 groups fit the file's levels."""
    with torch.device("meta"):
        real = AutoencoderKLMiniMaxH3()
    enc = VideoEncoder.load(TensorSource(dict(real.state_dict())), real.config.latents_mean, real.config.latents_std)
    assert enc.shape.channels == (128, 256, 256, 512, 512, 1024) and enc.shape.blocks == 2
    assert enc.shape.patch == 16 and math.prod(enc.shape.temporal) == 4
    assert enc.w["down_blocks.5.resnets.0.conv_shortcut.weight"].shape == (1024, 512, 1, 1, 1)


def test_the_decode_bench_runs_tiny(capsys):
    """bench/bench_video_decode.py's smoke run: H3's several clips in tiles equal diffusers' (PSNR inf in f32), and
    LTX-2.5's row is printed."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import bench_video_decode
    assert bench_video_decode.main(["--tiny"]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert rows["h3"].rstrip(" |").endswith("inf") and "ltx25" in rows, rows


def test_the_clip_bench_runs_tiny(capsys):
    """bench/bench_h3_clip.py's smoke run: the 20 steps, both decoders, ours and diffusers', and the fidelity line."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import bench_h3_clip
    assert bench_h3_clip.main(["--tiny", "--fidelity"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows[-4:] == ["20 steps (diffusers: its step x 20)", "video decode", "audio decode", "whole clip"], rows
    assert "ours INT8 against ours BF16 of the same weights" in out

