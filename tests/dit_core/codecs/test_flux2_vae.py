"""dit_core/codecs/flux2_vae.py against diffusers 0.42.1 AutoencoderKLFlux2 saved in BFL's flux2-vae.safetensors names."""

import pytest
import torch
from conftest import rel_err
from diffusers import AutoencoderKLFlux2
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
from safetensors.torch import save_file
from tiny_models import (
    FLUX2_VAE_TINY,
    flux2_vae_bfl_layout,
    save_bfl,
    save_flux2_vae,
    tiny_flux2_vae,
    tiny_vae,
)

from dit_core.codecs.flux1_vae import ImageDecoder
from dit_core.codecs.flux2_vae import Flux2VAE, pack, unpack
from dit_core.weights import WeightsError

GROUPS = FLUX2_VAE_TINY["norm_num_groups"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    vae = tiny_flux2_vae()
    path = tmp_path_factory.mktemp("vae") / "flux2-vae.safetensors"
    save_flux2_vae(vae, path)
    return vae, Flux2VAE.load(path, groups=GROUPS)


def stats(vae):
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    return mean, torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)


def reference_decode(vae, packed):
    """diffusers Flux2KleinPipeline.__call__'s tail: denormalize, unpatchify, decode; as ComfyUI IMAGE."""
    mean, std = stats(vae)
    with torch.no_grad():
        x = vae.decode(Flux2KleinPipeline._unpatchify_latents(packed * std + mean)).sample
    return ((x.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)


def test_bfl_names_round_trip_through_diffusers(tmp_path):
    """Our BFL names, with ComfyUI's rename of the nested quant convs, through diffusers' LDM VAE converter (it
    has no AutoencoderKLFlux2 converter; bn.* are the same names in both) load strictly and equal."""
    vae = tiny_flux2_vae()
    state = flux2_vae_bfl_layout(vae, prefix="vae.")
    assert "vae.encoder.quant_conv.weight" in state and "vae.decoder.post_quant_conv.weight" in state
    comfy = {k.replace("vae.decoder.post_quant_conv.", "vae.post_quant_conv.")
              .replace("vae.encoder.quant_conv.", "vae.quant_conv."): v for k, v in state.items()}
    back = convert_ldm_vae_checkpoint(comfy, vae.config)
    back.update({k[len("vae."):]: v for k, v in state.items() if k.startswith("vae.bn.")})
    fresh = AutoencoderKLFlux2.from_config(vae.config)
    fresh.load_state_dict(back, strict=True)
    for key, t in vae.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], t), key


def test_pack_matches_diffusers():
    z = torch.randn(2, 32, 6, 10)
    assert torch.equal(pack(z), Flux2KleinPipeline._patchify_latents(z))
    assert torch.equal(unpack(pack(z)), z)


@pytest.mark.parametrize("prefix", ["", "first_stage_model."])
def test_decode_matches_diffusers(prefix, tmp_path):
    vae = tiny_flux2_vae(seed=2)
    save_flux2_vae(vae, tmp_path / "flux2-vae.safetensors", prefix)
    ours = Flux2VAE.load(tmp_path / "flux2-vae.safetensors", groups=GROUPS)
    packed = torch.randn(2, 128, 3, 5, generator=torch.Generator().manual_seed(3))  # non-square, batch 2
    want = reference_decode(vae, packed)
    assert want.shape == (2, 48, 80, 3)
    out = ours.decode(packed)
    assert out.shape == want.shape and out.dtype == torch.float32
    err = rel_err(out, want)
    print(f"decode rel err {err:.2e}")
    assert err <= 1e-4
    raw = Flux2KleinPipeline._unpatchify_latents(packed * stats(vae)[1] + stats(vae)[0])
    assert rel_err(ours.decode(raw), want) <= 1e-4  # 32-channel raw latents decode as they are


@pytest.mark.parametrize("size", [(48, 80), (37, 70)])  # the second is cropped to 32 x 64, centred
def test_encode_matches_diffusers(pair, size):
    vae, ours = pair
    h, w = size
    image = torch.rand(2, h, w, 3, generator=torch.Generator().manual_seed(4))
    got = ours.encode(image)
    crop = image[:, (h % 16) // 2:(h % 16) // 2 + h // 16 * 16, (w % 16) // 2:(w % 16) // 2 + w // 16 * 16]
    mean, std = stats(vae)
    with torch.no_grad():  # diffusers Flux2KleinPipeline._encode_vae_image (sample_mode "argmax" = the mode)
        z = vae.encode(crop.permute(0, 3, 1, 2) * 2 - 1).latent_dist.mode()
        want = (Flux2KleinPipeline._patchify_latents(z) - mean) / std
    assert got.shape == want.shape == (2, 128, h // 16, w // 16)
    err = rel_err(got, want)
    print(f"encode {size} rel err {err:.2e}")
    assert err <= 1e-4


def test_reads_sizes_from_the_file(pair):
    _, ours = pair
    assert ours.shape.channels == (16, 32, 32, 64) and ours.shape.blocks == 2 and ours.shape.factor == 8
    assert ours.encoder.channels == (16, 32, 32, 64) and ours.encoder.blocks == 1
    assert ours.shape.post_quant and ours.shape.latent_channels == 32


def test_tiled_decode_close_to_whole(pair):
    _, ours = pair
    packed = torch.randn(1, 128, 24, 20, generator=torch.Generator().manual_seed(5))
    calls = []
    tiled = ours.decode(packed, tile=12, overlap=4, progress=lambda *a: calls.append(a))
    whole = ours.decode(packed, tile=None)
    # 3 x 2 tiles of 12 packed cells (24 raw cells, overlap 8: test_vae.py's tiling). Tiles differ from the whole
    # by their own GroupNorm and attention statistics, as in every tiled decoder (test_vae.py measures seams).
    assert calls[-1] == (6, 6)
    assert tiled.shape == whole.shape == (1, 384, 320, 3)
    err = rel_err(tiled, whole)
    print(f"tiled vs whole rel err {err:.2e}")
    assert err <= 2e-2
    assert torch.equal(ours.decode(packed), whole)  # the default tile of 64 cells: whole


# --- errors ----------------------------------------------------------------------------------------------

def test_rejects_a_flux1_vae(tmp_path):
    save_bfl(tiny_vae("two_level"), tmp_path / "ae.safetensors")
    with pytest.raises(WeightsError, match=r"ae\.safetensors.*16 latent channels.*FLUX\.2 VAE.*32 latent"):
        Flux2VAE.load(tmp_path / "ae.safetensors")


def test_flux1_decoder_rejects_a_flux2_vae(tmp_path):
    save_flux2_vae(tiny_flux2_vae(), tmp_path / "flux2-vae.safetensors")
    with pytest.raises(WeightsError, match=r"flux2-vae\.safetensors.*32 latent channels.*FLUX\.1 VAE"):
        ImageDecoder.load(tmp_path / "flux2-vae.safetensors")


@pytest.mark.parametrize("missing,why", [("bn.running_var", r"no 'bn\.running_var'"),
                                         ("decoder.post_quant_conv.weight", r"'decoder\.post_quant_conv\.weight' is missing"),
                                         ("encoder.quant_conv.bias", r"'encoder\.quant_conv\.bias' is missing"),
                                         ("encoder.down.1.block.0.conv2.weight", r"'encoder\.down\.1\.block")])
def test_rejects_incomplete_files(tmp_path, missing, why):
    state = flux2_vae_bfl_layout(tiny_flux2_vae())
    del state[missing]
    save_file(state, str(tmp_path / "flux2-vae.safetensors"))
    with pytest.raises(WeightsError, match=rf"flux2-vae\.safetensors.*{why}.*FLUX\.2 VAE"):
        Flux2VAE.load(tmp_path / "flux2-vae.safetensors", groups=GROUPS)


def test_rejects_diffusers_naming(tmp_path):
    save_file({k: v.contiguous() for k, v in tiny_flux2_vae().state_dict().items()},
              str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(WeightsError, match=r"diffusion_pytorch_model\.safetensors.*diffusers naming"):
        Flux2VAE.load(tmp_path / "diffusion_pytorch_model.safetensors", groups=GROUPS)


@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (1, 64, 4, 4), (128, 4, 4)])
def test_rejects_latents_of_wrong_shape(pair, shape):
    _, ours = pair
    with pytest.raises(ValueError, match=r"samples.*128.*32"):
        ours.decode(torch.zeros(shape))


@pytest.mark.parametrize("shape", [(1, 8, 32, 3), (32, 32, 3), (1, 32, 32, 2)])
def test_rejects_bad_images(pair, shape):
    _, ours = pair
    with pytest.raises(ValueError, match=r"image: expected an IMAGE"):
        ours.encode(torch.zeros(shape))


def test_bf16_decoder_keeps_an_f32_encoder(pair):
    """to(device, bfloat16): the decoder in BF16 within 40 dB of f32 (here 53); the encoder (reference images)
    unchanged."""
    _, f32 = pair
    bf16 = f32.to("cpu", torch.bfloat16)
    packed = torch.randn(1, 128, 3, 4, generator=torch.Generator().manual_seed(5))
    got, want = bf16.decode(packed), f32.decode(packed)
    assert 10 * torch.log10(1 / ((got.double() - want.double()) ** 2).mean()) > 40
    image = torch.rand(1, 32, 48, 3, generator=torch.Generator().manual_seed(6))
    assert torch.equal(bf16.encode(image), f32.encode(image))
