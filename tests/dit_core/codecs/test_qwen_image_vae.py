"""dit_core/codecs/qwen_image_vae.py against ComfyUI v0.3.75's WanVAE (comfy/ldm/wan/vae.py, the oracle that decodes
qwen_image_vae.safetensors) on a tiny random instance in the file's own names: one frame, f32."""
import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file

from dit_core.codecs.qwen_image_vae import QwenImageDecoder
from dit_core.weights import TensorSource, WeightsError


def tiny_wan_vae(comfy, seed=0):
    """WanVAE as ComfyUI builds it for qwen_image_vae (dim_mult 1 2 4 4, 2 residual blocks, no attention in the
    levels), at dim 4, its weights drawn (ComfyUI's ops leave them unset)."""
    from comfy.ldm.wan.vae import WanVAE
    vae = WanVAE(dim=4, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                 temperal_downsample=[False, True, True], dropout=0.0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("gamma") else
                    0.3 * torch.randn(p.shape, generator=g))
    return vae.eval()


def test_decode_matches_comfyui_wan_vae(comfy, tmp_path):
    vae = tiny_wan_vae(comfy)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, tmp_path / "qwen_image_vae.safetensors")
    ours = QwenImageDecoder.load(tmp_path / "qwen_image_vae.safetensors")
    assert ours.layers.count("resample") == 3 and ours.layers.count("residual") == 12
    z = torch.randn(2, 16, 1, 5, 7, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = vae.decode(z)[:, :, 0]  # [B, 3, 40, 56]
    got = ours.forward(z[:, :, 0])
    assert got.shape == want.shape == (2, 3, 40, 56) and rel_err(got, want) <= 1e-4
    image = ours.decode(z)
    assert image.shape == (2, 40, 56, 3) and rel_err(image, torch.clamp((want + 1) / 2, 0, 1).movedim(1, -1)) <= 1e-4
    last = ours.to("cpu", torch.float32, channels_last=True)
    assert rel_err(last.forward(z[:, :, 0]), want) <= 1e-4


def test_wrong_files_and_latents_are_refused(comfy, tmp_path):
    vae = tiny_wan_vae(comfy)
    sd = dict(vae.state_dict())
    with pytest.raises(WeightsError, match="Qwen-Image VAE"):
        QwenImageDecoder.load(TensorSource({k: v for k, v in sd.items() if not k.startswith("decoder.middle")}))
    with pytest.raises(WeightsError, match="Wan 2.2"):
        QwenImageDecoder.load(TensorSource(sd | {"decoder.upsamples.0.upsamples.0.residual.2.weight": torch.zeros(1)}))
    ours = QwenImageDecoder.load(TensorSource(sd))
    for bad in (torch.zeros(1, 16, 2, 4, 4), torch.zeros(1, 128, 4, 4)):  # two frames; a FLUX.2 latent
        with pytest.raises(ValueError, match="samples: expected raw Qwen-Image VAE latents"):
            ours.decode(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_channels_last_on_the_gpu_is_near_f32(comfy, tmp_path):
    """As the node places it: BF16, channels last, on the card; within BF16's error of the f32 decode."""
    vae = tiny_wan_vae(comfy)
    ours = QwenImageDecoder.load(TensorSource(dict(vae.state_dict())))
    z = torch.randn(1, 16, 1, 12, 10, generator=torch.Generator().manual_seed(2))
    want = ours.decode(z)
    got = ours.to("cuda", torch.bfloat16, channels_last=True).decode(z)
    assert got.device.type == "cpu" and rel_err(got, want) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_norms_built_ahead_are_the_ones_a_decode_launches(comfy):
    """The norms' kernels built ahead (norms_built_ahead: at the move, or from a queued prompt) are the very ones the
    decode launches: none is built again at the decode (a compile option the builds left out made each of them
    another kernel, built as it launched: 1 s of Krea 2's first decode on an H100)."""
    from kernels.channel_rms import _channel_rms_kernel
    ours = QwenImageDecoder.load(TensorSource(dict(tiny_wan_vae(comfy).state_dict())))
    ours = ours.to("cuda", torch.bfloat16, channels_last=True)
    ours.norms_ahead.join()
    built = lambda: sum(len(cache[0]) for cache in _channel_rms_kernel.device_caches.values())  # noqa: E731
    before = built()
    ours.decode(torch.randn(1, 16, 1, 12, 10))
    assert before and built() == before
