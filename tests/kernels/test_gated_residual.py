"""kernels/gated_residual.py against its reference (bit for bit without the sandwich norm; within f32 rounding
of the row statistic with it) and against the block's host update x + gate[map] * rms_norm(y, post_weight)."""
import pytest
import torch

from dit_core.block import rms_norm
from kernels.gated_residual import gated_residual, reference

CASES = [(1, 48), (7, 100), (37, 64), (5, 2500)]  # (M, N): one row, N not a power of 2, N over one block


def inputs(m, n, seed, device):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, n, generator=g), (4 * torch.randn(m, n, generator=g)).to(torch.bfloat16)
    gate, row_map = torch.randn(3, n, generator=g), torch.randint(0, 3, (m,), generator=g)
    return tuple(t.to(device) for t in (x, y, gate, row_map, 1 + 0.2 * torch.randn(n, generator=g)))


@pytest.mark.parametrize("m,n", CASES)
def test_plain_gate_is_exact(m, n, device):
    x, y, gate, row_map, _ = inputs(m, n, seed=m + n, device=device)
    expected = reference(x.clone(), y, gate, row_map)
    assert gated_residual(x, y, gate, row_map, block_n=64) is x
    assert torch.equal(x, expected)


@pytest.mark.parametrize("m,n", CASES)
def test_sandwich_norm(m, n, device):
    x, y, gate, row_map, post = inputs(m, n, seed=m * n, device=device)
    host = x.cpu() + gate.cpu()[row_map.cpu()] * rms_norm(y.cpu().float(), post.cpu(), 1e-5)
    expected = reference(x.clone(), y, gate, row_map, post, 1e-5)
    gated_residual(x, y, gate, row_map, post, 1e-5, block_n=64)
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(expected.cpu(), host, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("m,n", CASES)
def test_next_rms_statistics(m, n, device):
    """next_rms: the update as without it, and the next RMS norm's statistics of the updated rows, written into a
    column slice of a wider buffer (poisoned first)."""
    x, y, gate, row_map, post = inputs(m, n, seed=m + 2 * n, device=device)
    expected = reference(x.clone(), y, gate, row_map, post, 1e-5)
    wide = torch.full((2, m + 3), float("nan"), device=device)
    gated_residual(x, y, gate, row_map, post, 1e-5, next_rms=(wide[:, 1:1 + m], 1e-6), block_n=64)
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-5)
    inv = 1 / torch.sqrt(x.cpu().double().pow(2).mean(-1) + 1e-6)
    assert torch.equal(wide[0, 1:1 + m].cpu(), torch.zeros(m))
    torch.testing.assert_close(wide[1, 1:1 + m].cpu().double(), inv, rtol=1e-6, atol=0)
    assert wide[:, 0].isnan().all() and wide[:, -2:].isnan().all()  # nothing outside the slice


def test_bad_arguments_raise():
    x, y, gate, row_map, post = inputs(4, 32, seed=0, device="cpu")
    with pytest.raises(ValueError):
        gated_residual(x.double(), y, gate, row_map)
    with pytest.raises(ValueError):
        gated_residual(x, y[:, :16], gate, row_map)
    with pytest.raises(ValueError):
        gated_residual(x, y, gate, row_map, post[:16])
    with pytest.raises(ValueError, match="next_rms"):
        gated_residual(x, y, gate, row_map, post, next_rms=(torch.zeros(2, 5), 1e-6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("normed", [False, True])
def test_zimage_shape(normed):
    x, y, gate, row_map, post = inputs(4608, 3840, seed=1, device="cuda")
    post = post if normed else None
    expected = reference(x.clone(), y, gate, row_map, post, 1e-5)
    gated_residual(x, y, gate, row_map, post, 1e-5)
    if normed:
        torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-5)
    else:
        assert torch.equal(x, expected)
