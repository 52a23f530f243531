"""dit_core/codecs/flux1_vae.py against diffusers 0.42.1 AutoencoderKL (FLUX.1 structure) saved in BFL/ComfyUI names."""

import pytest
import torch
from conftest import rel_err
from diffusers import AutoencoderKL
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from safetensors.torch import save_file
from tiny_models import CONFIGS, save_bfl, tiny_vae, to_bfl

from dit_core.codecs.conv import spans
from dit_core.codecs.flux1_vae import ImageDecoder, raw_latents
from dit_core.weights import WeightsError


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    vae = tiny_vae("flux")
    path = tmp_path_factory.mktemp("vae") / "ae.safetensors"
    save_bfl(vae, path)
    return vae, ImageDecoder.load(path, groups=CONFIGS["flux"]["norm_num_groups"])


def image(sample: torch.Tensor) -> torch.Tensor:
    """diffusers' decoder output as ComfyUI IMAGE (VAE.decode: clamp to -1..1, to 0..1, channels last)."""
    return ((sample.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bfl_names_round_trip_through_diffusers(name, tmp_path):
    vae = tiny_vae(name)
    state = save_bfl(vae, tmp_path / "ae.safetensors", prefix="vae.")
    back = convert_ldm_vae_checkpoint(state, vae.config)
    fresh = AutoencoderKL.from_config(vae.config)
    fresh.load_state_dict(back, strict=True)
    for key, t in vae.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], t), key


@pytest.mark.parametrize("name,prefix", [("flux", ""), ("flux", "first_stage_model."), ("two_level", "vae.")])
def test_decode_matches_diffusers(name, prefix, tmp_path):
    vae = tiny_vae(name)
    save_bfl(vae, tmp_path / "ae.safetensors", prefix)
    dec = ImageDecoder.load(tmp_path / "ae.safetensors", groups=CONFIGS[name]["norm_num_groups"])
    z = torch.randn(2, 16, 6, 10, generator=torch.Generator().manual_seed(3))  # non-square, batch 2
    with torch.no_grad():
        ref = vae.decode(z).sample
    f = 2 ** (len(CONFIGS[name]["block_out_channels"]) - 1)
    assert ref.shape == (2, 3, 6 * f, 10 * f)
    assert rel_err(dec.forward(z), ref) <= 1e-4
    out = dec.decode(z)
    assert out.shape == (2, 6 * f, 10 * f, 3) and out.dtype == torch.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert rel_err(out, image(ref)) <= 1e-4


def test_channels_last_decode_matches_diffusers(tmp_path):
    """The decoder with its convs and activations channels last (ImageDecoder.to(channels_last=True)) gives the same
    image; on a GPU its norms run the channels-last kernels (tests/kernels/test_group_norm.py)."""
    vae = tiny_vae("flux")
    save_bfl(vae, tmp_path / "ae.safetensors")
    dec = ImageDecoder.load(tmp_path / "ae.safetensors", groups=CONFIGS["flux"]["norm_num_groups"])
    last = dec.to("cpu", torch.float32, channels_last=True)
    assert last.channels_last and last.w["conv_in.weight"].is_contiguous(memory_format=torch.channels_last)
    z = torch.randn(1, 16, 6, 10, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = vae.decode(z).sample
    out = last.decode(z, tile=None)
    assert out.is_contiguous() and rel_err(out, image(ref)) <= 1e-4


def test_default_groups_are_flux_32(tmp_path):
    vae = tiny_vae("two_level")
    save_bfl(vae, tmp_path / "ae.safetensors")
    dec = ImageDecoder.load(tmp_path / "ae.safetensors")
    assert dec.shape.groups == 32 and dec.shape.channels == (32, 64) and dec.shape.blocks == 3


def test_normalized_latents_helper(comfy):
    """raw_latents undoes ComfyUI's FLUX.1 latent format (its process_out), the constants not ours."""
    import comfy.latent_formats
    n = torch.randn(1, 16, 4, 4)
    assert torch.allclose(raw_latents(n), comfy.latent_formats.Flux().process_out(n))


def test_reads_sizes_from_the_file(flux):
    _, dec = flux
    assert dec.shape.channels == (32, 32, 64, 64) and dec.shape.blocks == 2 and dec.shape.factor == 8
    assert dec.shape.latent_channels == 16 and dec.shape.out_channels == 3


# --- tiles -----------------------------------------------------------------------------------------------

H, W, TILE, OVERLAP = 48, 40, 24, 8


def seam_pixels(n: int, tile: int, overlap: int, f: int) -> list[int]:
    """Pixel rows/columns where a tile begins or ends inside the image."""
    tiles = spans(n, tile, overlap)
    return sorted({s * f for s, _ in tiles if s > 0} | {e * f for _, e in tiles if e < n})


def far_from_seams(n: int, tile: int, overlap: int, f: int, margin: int) -> torch.Tensor:
    x = torch.arange(n * f) + 0.5
    dist = torch.stack([(x - p).abs() for p in seam_pixels(n, tile, overlap, f)]).amin(0)
    return dist >= margin


@pytest.fixture(scope="module")
def tiled(flux):
    _, dec = flux
    z = torch.randn(1, 16, H, W, generator=torch.Generator().manual_seed(5))
    calls = []
    out = dec.decode(z, tile=TILE, overlap=OVERLAP, progress=lambda done, total: calls.append((done, total)))
    return z, dec.decode(z, tile=None), out, calls


def test_tiled_decode_matches_whole_away_from_seams(tiled):
    _, whole, out, calls = tiled
    assert out.shape == whole.shape == (1, H * 8, W * 8, 3)
    assert calls == [(i, 6) for i in range(1, 7)]  # 3 rows x 2 columns of 24-cell tiles
    # Two latent cells (16 px) from any tile edge. Tiles still differ from the whole by conv padding at their
    # edges and by their own GroupNorm and attention statistics, which no tiled decoder avoids (nor ComfyUI's).
    far = far_from_seams(H, TILE, OVERLAP, 8, 16)[:, None] & far_from_seams(W, TILE, OVERLAP, 8, 16)[None, :]
    assert far.float().mean() > 0.2
    assert rel_err(out[0][far], whole[0][far]) <= 1e-2
    assert rel_err(out, whole) <= 1e-2


def test_tiles_are_placed_exactly(flux, tiled):
    """Where only one tile covers the image, the result is that tile's own decode, to float rounding."""
    _, dec = flux
    z, _, out, _ = tiled
    tile = dec.decode(z[:, :, 0:24, 0:24], tile=None)  # top-left tile; its neighbours start at 12 and 16
    assert torch.allclose(out[:, :12 * 8, :16 * 8], tile[:, :12 * 8, :16 * 8], atol=1e-6)
    tile = dec.decode(z[:, :, 24:48, 16:40], tile=None)  # bottom-right tile; its neighbours end at 36 and 24
    assert torch.allclose(out[:, 36 * 8:, 24 * 8:], tile[:, 12 * 8:, 8 * 8:], atol=1e-6)


def line_steps(img: torch.Tensor, axis: int) -> torch.Tensor:
    """Mean |step| between neighbouring pixel lines along axis (1 rows, 2 columns); index p-1 is the step
    between lines p-1 and p."""
    step = (img.narrow(axis, 1, img.shape[axis] - 1) - img.narrow(axis, 0, img.shape[axis] - 1)).abs()
    return step.mean(dim=(0, 2 if axis == 1 else 1, 3))


def seam_report(img: torch.Tensor, whole: torch.Tensor, axis: int, seams: list[int]) -> tuple[float, ...]:
    """(largest step of img - whole across a seam, largest step of img across a seam, largest step of img
    across the other lines of the same phase). A seam is a step in the difference from the whole decode (a
    smooth drift is none), and a step in the image that stands out among lines at the same offset within a
    latent cell (the nearest 2x upsamples give the decoded image an 8-pixel period)."""
    jump = line_steps(img - whole, axis)[[p - 1 for p in seams]].max().item()
    steps = line_steps(img, axis)
    same = [p - 1 for p in range(8, img.shape[axis], 8) if p not in seams]
    return jump, steps[[p - 1 for p in seams]].max().item(), steps[same].max().item()


@pytest.mark.parametrize("axis,n", [(1, H), (2, W)])
def test_tiled_decode_has_no_seams(flux, tiled, axis, n):
    _, dec = flux
    z, whole, out, _ = tiled
    seams = seam_pixels(n, TILE, OVERLAP, 8)
    jump, at_seams, elsewhere = seam_report(out, whole, axis, seams)
    assert jump <= 1 / 255  # under one 8-bit level along the seam lines
    assert at_seams <= elsewhere
    if axis == 1:  # the checks can see a seam: hard cuts (overlap 0: two 24-row tiles that touch) fail both
        jump, at_seams, elsewhere = seam_report(dec.decode(z, tile=TILE, overlap=0), whole, axis, [TILE * 8])
        assert jump > 10 / 255 and at_seams > 1.5 * elsewhere


def test_tiling_is_chosen_by_size(flux):
    _, dec = flux
    z = torch.randn(1, 16, 12, 20, generator=torch.Generator().manual_seed(7))
    calls = []
    small = dec.decode(z[:, :, :, :12], tile=16, overlap=4, progress=lambda *a: calls.append(a))
    assert calls == [(1, 1)]
    assert torch.equal(small, dec.decode(z[:, :, :, :12], tile=None))
    calls.clear()
    dec.decode(z, tile=16, overlap=4, progress=lambda *a: calls.append(a))
    assert calls[-1] == (2, 2)
    assert torch.equal(dec.decode(z), dec.decode(z, tile=None))  # default tile of 64 cells: whole


# --- errors ----------------------------------------------------------------------------------------------

def test_rejects_sd_vae_with_4_latent_channels(tmp_path):
    vae = tiny_vae("two_level", latent_channels=4, quant=True)
    save_bfl(vae, tmp_path / "sd_vae.safetensors")
    with pytest.raises(WeightsError, match=r"sd_vae\.safetensors.*4 latent channels.*FLUX\.1 VAE.*16 latent"):
        ImageDecoder.load(tmp_path / "sd_vae.safetensors")


def test_rejects_a_dit_file(tmp_path):
    save_file({"layers.0.attention.qkv.weight": torch.zeros(8, 4), "x_embedder.weight": torch.zeros(4, 4)},
              str(tmp_path / "dit.safetensors"))
    with pytest.raises(WeightsError, match=r"dit\.safetensors.*decoder\.conv_in\.weight.*FLUX\.1 VAE"):
        ImageDecoder.load(tmp_path / "dit.safetensors")


def test_rejects_missing_decoder_tensor(tmp_path):
    state = to_bfl(tiny_vae("two_level").state_dict(), 2)
    del state["decoder.up.1.block.2.conv2.weight"]
    save_file(state, str(tmp_path / "ae.safetensors"))
    with pytest.raises(WeightsError, match=r"ae\.safetensors.*'decoder\.up\.1\.block\.2\.conv2\.weight' is"):
        ImageDecoder.load(tmp_path / "ae.safetensors")


def test_rejects_unknown_decoder_tensors(tmp_path):
    state = to_bfl(tiny_vae("two_level").state_dict(), 2)
    state["decoder.up.1.attn.0.q.weight"] = torch.zeros(64, 64, 1, 1)  # LDM attention inside a level
    save_file(state, str(tmp_path / "ae.safetensors"))
    with pytest.raises(WeightsError, match=r"ae\.safetensors.*unexpected decoder tensors.*up\.1\.attn\.0"):
        ImageDecoder.load(tmp_path / "ae.safetensors")


def test_rejects_diffusers_naming(tmp_path):
    save_file({k: v.contiguous() for k, v in tiny_vae("two_level").state_dict().items()},
              str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(WeightsError, match=r"diffusion_pytorch_model\.safetensors.*diffusers naming"):
        ImageDecoder.load(tmp_path / "diffusion_pytorch_model.safetensors")


@pytest.mark.parametrize("shape", [(1, 4, 8, 8), (16, 8, 8)])
def test_rejects_latents_of_wrong_shape(flux, shape):
    _, dec = flux
    with pytest.raises(ValueError, match=r"samples.*16 channels"):
        dec.decode(torch.zeros(shape))


def test_rejects_bad_tile_settings(flux):
    _, dec = flux
    with pytest.raises(ValueError, match="overlap"):
        dec.decode(torch.zeros(1, 16, 8, 8), tile=8, overlap=8)


def test_matches_comfyui_decoder_on_the_same_file(comfy, tmp_path):
    """ComfyUI v0.3.75 runs ae.safetensors with BFL's own names (comfy/ldm/modules/diffusionmodules/model.py
    Decoder, 32 norm groups): our file loads into it strictly and decodes the same."""
    from comfy.ldm.modules.diffusionmodules.model import Decoder

    state = save_bfl(tiny_vae("two_level"), tmp_path / "ae.safetensors", prefix="first_stage_model.")
    ref = Decoder(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=2, attn_resolutions=[], in_channels=3,
                  resolution=64, z_channels=16).eval()
    head = "first_stage_model.decoder."
    ref.load_state_dict({k[len(head):]: v for k, v in state.items() if k.startswith(head)}, strict=True)
    z = torch.randn(1, 16, 7, 5, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = ref(z)
    assert rel_err(ImageDecoder.load(tmp_path / "ae.safetensors").forward(z), want) <= 1e-4


def decode_psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR (dB) of IMAGE a against b, both 0..1."""
    return float(10 * torch.log10(1 / ((a.double() - b.double()) ** 2).mean()))


def test_bf16_decode_is_close_to_f32(flux):
    """to(device, bfloat16), as the GPU decodes (stock ComfyUI's VAE runs in BF16 there): the IMAGE comes back f32
    within 40 dB of the f32 decode (the tiny random VAE: 55-56 dB), tiled or whole."""
    _, f32 = flux
    bf16 = f32.to("cpu", torch.bfloat16)
    assert bf16.w["conv_in.weight"].dtype == torch.bfloat16 and f32.w["conv_in.weight"].dtype == torch.float32
    z = torch.randn(1, 16, 10, 12, generator=torch.Generator().manual_seed(3))
    for tile in (None, 6):
        got, want = bf16.decode(z, tile=tile, overlap=2), f32.decode(z, tile=tile, overlap=2)
        assert got.dtype == torch.float32 and decode_psnr(got, want) > 40


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decode_is_close_to_f32(flux):
    """On the GPU in BF16 (its group norms kernels/group_norm.py's): within 40 dB of the host's f32 decode, the IMAGE
    back on the host in page-locked memory."""
    _, f32 = flux
    z = torch.randn(1, 16, 10, 12, generator=torch.Generator().manual_seed(4))
    got = f32.to("cuda", torch.bfloat16).decode(z, tile=None)
    assert got.device.type == "cpu" and got.is_pinned() and decode_psnr(got, f32.decode(z, tile=None)) > 40
