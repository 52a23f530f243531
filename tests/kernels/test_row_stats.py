"""kernels/int8/row_stats.py against its reference: odd sizes (one row, K not a multiple of the 256-column tile, K of
one tile), both norms, bf16 and f32 rows, rows with a stride, and a column slice of a wider output; the statistics
combined from runs' parts (the Hopper gated product's) against the two-pass ones."""
import pytest
import torch

from kernels.int8.row_stats import parts_reference, reference, row_stats, stats_of_parts, stats_of_parts_reference

CASES = [(1, 256), (7, 100), (37, 640), (70, 3840)]  # (M, K)


@pytest.mark.parametrize("launch", [{}, {"block_m": 16, "block_k": 256, "num_warps": 4}], ids=["whole", "walk"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k", CASES)
def test_kernel_matches_reference(m, k, dtype, norm, launch, device):
    g = torch.Generator().manual_seed(m * k)
    wide = (3 + 2 * torch.randn(m, k + 5, generator=g)).to(device, dtype)  # an offset: the layer mean matters
    x = wide[:, 2:2 + k]  # rows with a stride
    out = torch.full((2, m + 4), float("nan"), device=device)
    stats = row_stats(x, norm, 1e-5, out=out[:, 3:3 + m], **launch)
    expected = reference(x, norm, 1e-5)
    torch.testing.assert_close(stats, expected, rtol=2e-6, atol=2e-6)
    assert out[:, :3].isnan().all() and out[:, -1].isnan().all()  # nothing outside the slice


def test_bad_arguments_raise():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="norm"):
        row_stats(x, None)
    with pytest.raises(ValueError, match="out must be"):
        row_stats(x, "rms", out=torch.empty(2, 5))
    with pytest.raises(ValueError, match="rows"):
        row_stats(x.t(), "rms")


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("m,k,width", [(1, 64, 64), (7, 192, 64), (70, 3072, 64), (33, 80, 16)])
def test_stats_of_parts_match_two_passes(m, k, width, norm, device):
    g = torch.Generator().manual_seed(m + k)
    x = (40 + 3 * torch.randn(m, k, generator=g)).to(device)  # a mean far from 0: the parts' combination matters
    parts = parts_reference(x, width)
    assert parts.shape == (2, k // width, m)
    out = torch.full((2, m + 4), float("nan"), device=device)
    stats = stats_of_parts(parts, norm, 1e-6, out=out[:, 2:2 + m], width=width)
    torch.testing.assert_close(stats, reference(x, norm, 1e-6), rtol=4e-6, atol=0)
    torch.testing.assert_close(stats_of_parts_reference(parts, norm, 1e-6, width), reference(x, norm, 1e-6),
                               rtol=4e-6, atol=0)
    assert out[:, :2].isnan().all() and out[:, -2:].isnan().all()  # nothing outside the slice
