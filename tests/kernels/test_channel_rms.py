"""kernels/channel_rms.py against its reference: f32 within the sums' reordering, bf16 within one step of the f32 math
rounded once; widths off a power of two, a shift or none, SiLU or not, positions past a block, far from zero mean."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_within_one_bf16_step, rel_err

from kernels.channel_rms import channel_rms, reference


def activations(shape, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = 3 + torch.randn(shape, generator=g)
    gain, shift = 1 + 0.2 * torch.randn(c, generator=g), 2 * torch.randn(c, generator=g)
    x = x.to(device, dtype).contiguous(memory_format=torch.channels_last)
    return x, gain.to(device), shift.to(device)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shifted", [False, True])
@pytest.mark.parametrize("shape", [(2, 24, 5, 7), (1, 96, 3, 40), (1, 5, 1, 1)])
def test_f32_matches_reference(shape, shifted, silu, device):
    x, gain, shift = activations(shape, sum(shape), device, torch.float32)
    got = channel_rms(x, gain, shift if shifted else None, silu)
    want = reference(x, gain, shift if shifted else None, silu)
    assert got.shape == x.shape and got.stride() == x.stride() and rel_err(got, want) < 1e-5
    v = x + shift[:, None, None] if shifted else x
    plain = F.normalize(v, dim=1) * gain[:, None, None]
    assert torch.allclose(want, F.silu(plain) if silu else plain)  # (the reference is F.normalize's math)


def test_bf16_within_one_step_of_the_math(device):
    x, gain, shift = activations((1, 48, 6, 9), 3, device, torch.bfloat16)
    got = channel_rms(x, gain, shift, True)
    assert got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, reference(x.float(), gain, shift, True).to(torch.bfloat16))


def test_layouts_and_sizes_it_cannot_take_raise(device):
    x, gain, shift = activations((1, 8, 4, 4), 0, device, torch.float32)
    for args in ((x.contiguous(), gain), (x, gain[:3]), (x, gain, shift[:3])):
        with pytest.raises(ValueError, match="channel_rms"):
            channel_rms(*args)
    assert channel_rms(x[:0], gain).shape == (0, 8, 4, 4)
