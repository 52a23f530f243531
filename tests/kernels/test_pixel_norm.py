"""kernels/pixel_norm.py against its reference: f32 within sums' reordering, bf16 within one step of the f32 math;
with and without the modulation, channels split over blocks, rows split over column blocks, written into the
interior of a padded buffer; and the reference is the LTX video decoder's host steps."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_within_one_bf16_step, rel_err

from dit_core.codecs.conv import pixel_norm
from kernels.pixel_norm import _pixel_norm_kernel, build, pixel_norm_silu, reference

SHAPES = [(1, 40, 3, 5, 9), (2, 8, 2, 4, 70), (1, 3, 1, 3, 3)]


def activations(shape, seed, device, dtype, modulated):
    g = torch.Generator().manual_seed(seed)
    x = 2 + 3 * torch.randn(shape, generator=g)
    mods = (0.3 * torch.randn(shape[:2], generator=g), 0.2 * torch.randn(shape[:2], generator=g)) if modulated \
        else (None, None)
    return x.to(device, dtype), *(None if m is None else m.to(device) for m in mods)


@pytest.mark.parametrize("modulated", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_f32_matches_reference(shape, modulated, device):
    x, scale, shift = activations(shape, sum(shape), device, torch.float32, modulated)
    got = pixel_norm_silu(x, 1e-8, scale, shift, block_c=16, block_w=32)
    assert got.shape == x.shape and rel_err(got, reference(x, 1e-8, scale, shift)) < 1e-5


def test_writes_the_interior_of_a_padded_buffer_only(device):
    x, scale, shift = activations((1, 20, 3, 4, 6), 5, device, torch.float32, True)
    buf = torch.full((1, 20, 5, 6, 8), 7.0, device=device)
    inner = buf[:, :, 2:, 1:5, 1:7]
    pixel_norm_silu(x, 1e-8, scale, shift, out=inner, block_c=16, block_w=4)
    assert rel_err(inner, reference(x, 1e-8, scale, shift)) < 1e-5
    inner.fill_(7.0)
    assert torch.equal(buf, torch.full_like(buf, 7.0))


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_bf16_within_one_step_of_the_math(shape, device):
    x, scale, shift = activations(shape, sum(shape) + 1, device, torch.bfloat16, True)
    got = pixel_norm_silu(x, 1e-8, scale, shift, block_c=16, block_w=32)
    assert got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, reference(x.float(), 1e-8, scale, shift).to(torch.bfloat16))


def test_is_the_decoders_norm_modulation_and_silu():
    """The reference is the host decoder's steps (dit_core/codecs/ltx2_video_vae.py's resnet before a conv)."""
    x, scale, shift = activations((1, 6, 3, 4, 5), 3, "cpu", torch.float32, True)
    h = pixel_norm(x, 1e-8) * (1 + scale[..., None, None, None]) + shift[..., None, None, None]
    assert torch.equal(F.silu(h), reference(x, 1e-8, scale, shift))


def test_bad_shapes_name_themselves(device):
    x = torch.ones(1, 4, 2, 3, 3, device=device)
    with pytest.raises(ValueError, match="both"):
        pixel_norm_silu(x, 1e-8, torch.ones(1, 4, device=device), None)
    with pytest.raises(ValueError, match="unit-strided"):
        pixel_norm_silu(x, 1e-8, out=torch.empty(1, 4, 2, 3, 6, device=device)[..., ::2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton's warmup compiles for one)")
def test_kernels_built_ahead_serve_every_tile():
    """build() compiles what a decode launches, whatever the tile's sizes, channels and the padded buffer's offset:
    nothing is built after it."""
    build(torch.bfloat16)
    cache = _pixel_norm_kernel.device_caches[torch.cuda.current_device()][0]
    before = len(cache)
    for shape in ((1, 128, 9, 64, 64), (1, 512, 3, 16, 20)):
        for modulated in (False, True):
            x, scale, shift = activations(shape, 0, "cuda", torch.bfloat16, modulated)
            b, c, t, h, w = shape
            buf = torch.empty(b, c, t + 2, h + 2, w + 2, device="cuda", dtype=torch.bfloat16)
            pixel_norm_silu(x, 1e-8, scale, shift, out=buf[:, :, 2:, 1:-1, 1:-1])
    assert len(cache) == before
