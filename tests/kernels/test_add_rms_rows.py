"""kernels/add_rms_rows.py against its reference (the residual bit for bit; the normed rows within one bf16 step:
the squares summed in another order) and kernels/swiglu_rows.py against its reference (within one bf16 step)."""
import pytest
import torch
from conftest import assert_within_one_bf16_step

from kernels.add_rms_rows import add_rms_rows, reference
from kernels.swiglu_rows import reference as swiglu_reference
from kernels.swiglu_rows import swiglu_rows

# (R, D): odd R; D a power of 2 or not, and past one column block (1024)
SHAPES = [(7, 64), (13, 96), (5, 1100), (1, 48)]


def rows(r, d, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(r, d, generator=g) * torch.exp(torch.randn(r, 1, generator=g))
    y, w = torch.randn(r, d, generator=g), 1 + 0.2 * torch.randn(d, generator=g)
    return x.to(device), y.to(device, torch.bfloat16), w.to(device)


@pytest.mark.parametrize("with_y", [True, False])
@pytest.mark.parametrize("r,d", SHAPES)
def test_kernel_matches_reference(r, d, with_y, device):
    x, y, w = rows(r, d, seed=r + d, device=device)
    want_x = x.clone()
    want = reference(want_x, y if with_y else None, w, 1e-6)
    got = add_rms_rows(x, y if with_y else None, w, 1e-6, block_m=2)
    assert torch.equal(x, want_x) and got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, want)


def test_reference_is_the_layers_add_and_norm():
    x, y, w = rows(9, 64, seed=3, device="cpu")
    want = torch.nn.functional.rms_norm(x + y, (64,), w, 1e-6).to(torch.bfloat16)
    assert torch.equal(reference(x, y, w, 1e-6), want)


@pytest.mark.parametrize("r,ffn", [(7, 40), (3, 300), (16, 256)])
def test_swiglu_matches_reference(r, ffn, device):
    g = torch.Generator().manual_seed(r * ffn)
    u = (3 * torch.randn(r, 2 * ffn, generator=g)).to(device, torch.bfloat16)
    got = swiglu_rows(u, ffn, block_m=4, block_n=128)
    assert got.shape == (r, ffn) and got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, swiglu_reference(u, ffn))


def test_bad_arguments_raise():
    x, y, w = rows(4, 32, seed=0, device="cpu")
    for args in ((x.double(), y, w), (x, y[:, :16], w), (x, y, w[:8]), (x.T, None, w)):
        with pytest.raises(ValueError, match="add_rms_rows"):
            add_rms_rows(*args)
    with pytest.raises(ValueError, match="swiglu_rows"):
        swiglu_rows(y, 8)
