"""kernels/pixel_norm.py against its reference: f32 within sums' reordering, bf16 within one step of the f32 math;
with and without the modulation, channels split over blocks, rows split over column blocks, causal (front only) and
two-sided time padding, and the LTX video decoder's own norm, modulation, SiLU and padding (the host math)."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_within_one_bf16_step, rel_err

from dit_core.codecs.conv import pixel_norm
from kernels.pixel_norm import padded, pixel_norm_silu, reference

# (shape [B, C, T, H, W], pad (front, back, ph, pw))
CASES = [((1, 40, 3, 5, 9), (2, 0, 1, 1)), ((2, 8, 2, 4, 70), (1, 1, 1, 1)), ((1, 3, 1, 3, 3), (0, 0, 0, 0)),
         ((1, 16, 4, 6, 5), (2, 0, 2, 2))]


def activations(shape, seed, device, dtype, modulated):
    g = torch.Generator().manual_seed(seed)
    x = 2 + 3 * torch.randn(shape, generator=g)
    mods = (0.3 * torch.randn(shape[:2], generator=g), 0.2 * torch.randn(shape[:2], generator=g)) if modulated \
        else (None, None)
    return x.to(device, dtype), *(None if m is None else m.to(device) for m in mods)


@pytest.mark.parametrize("modulated", [False, True])
@pytest.mark.parametrize("shape,pad", CASES)
def test_f32_matches_reference(shape, pad, modulated, device):
    x, scale, shift = activations(shape, sum(shape), device, torch.float32, modulated)
    got = pixel_norm_silu(x, 1e-8, scale, shift, pad, block_c=16, block_w=32)
    want = reference(x, 1e-8, scale, shift, pad)
    assert got.shape == want.shape and rel_err(got, want) < 1e-5


@pytest.mark.parametrize("shape,pad", CASES[:2])
def test_bf16_within_one_step_of_the_math(shape, pad, device):
    x, scale, shift = activations(shape, sum(shape) + 1, device, torch.bfloat16, True)
    got = pixel_norm_silu(x, 1e-8, scale, shift, pad, block_c=16, block_w=32)
    assert got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, reference(x.float(), 1e-8, scale, shift, pad).to(torch.bfloat16))


def test_is_the_decoders_norm_modulation_silu_and_conv_padding():
    """The reference is the host decoder's steps (dit_core/codecs/ltx2_video_vae.py's resnet before a conv): pixel
    norm, scale/shift, SiLU, then the causal conv's frames and reflected borders."""
    x, scale, shift = activations((1, 6, 3, 4, 5), 3, "cpu", torch.float32, True)
    h = pixel_norm(x, 1e-8) * (1 + scale[..., None, None, None]) + shift[..., None, None, None]
    assert torch.equal(padded(F.silu(h), (2, 0, 1, 1)), reference(x, 1e-8, scale, shift, (2, 0, 1, 1)))


def test_bad_shapes_name_themselves(device):
    x = torch.ones(1, 4, 2, 3, 3, device=device)
    with pytest.raises(ValueError, match="both"):
        pixel_norm_silu(x, 1e-8, torch.ones(1, 4, device=device), None)
    with pytest.raises(ValueError, match="reflection"):
        pixel_norm_silu(x, 1e-8, pad=(0, 0, 3, 1))
