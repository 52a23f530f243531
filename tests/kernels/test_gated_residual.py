"""kernels/gated_residual.py against its reference (bit for bit without the sandwich norm; within f32 rounding
of the row statistic with it) and against the block's host update x + gate[map] * rms_norm(y, post_weight)."""
import pytest
import torch

from dit_core.block import rms_norm
from kernels.gated_residual import gated_residual, gated_residual_quantized, reference, reference_quantized
from kernels.int8_quant import quantize_rows

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


QUANTIZED = [(1, 256, 256), (7, 768, 256), (37, 192, 64), (5, 64, 16)]  # (M, N, g): one row, one group, 3 of 64
MODULATIONS = [{"gain": True, "shift": False}, {"gain": False, "shift": True}, {"gain": True, "shift": None}]


def assert_quantized_equals_two_kernels(m, n, group, modulation, device, seed):
    """gated_residual_quantized: the update gated_residual makes, and codes and scales equal bit for bit to
    quantize_rows' of the updated rows with gated_residual's statistics (the two launches it replaces); within a
    bf16 step of the plain-torch reference's."""
    x, y, gate, row_map, post = inputs(m, n, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    next_norm = {"norm_weight": (1 + 0.2 * torch.randn(n, generator=g)).to(device) if modulation["gain"] else None,
                 "scale": None if modulation["shift"] is None else (0.3 * torch.randn(3, n, generator=g)).to(device),
                 "shift": (0.1 * torch.randn(3, n, generator=g)).to(device) if modulation["shift"] else None}
    x_two, stats = x.clone(), torch.empty(2, m, device=device)
    gated_residual(x_two, y, gate, row_map, post, 1e-5, next_rms=(stats, 1e-6))
    q_two, s_two = quantize_rows(x_two, group, norm="rms", eps=1e-6, row_map=row_map, stats=stats, **next_norm)
    x_ref = x.clone()
    q_ref, s_ref = reference_quantized(x_ref, y, gate, row_map, post, 1e-5, 1e-6, group, **next_norm)
    out = (torch.full((m, n), 0x7F, dtype=torch.int8, device=device), torch.full((m,), float("nan"), device=device))
    q, s = gated_residual_quantized(x, y, gate, row_map, post, 1e-5, 1e-6, group, **next_norm, out=out)
    assert q is out[0] and s is out[1]
    assert torch.equal(x, x_two) and torch.equal(q, q_two) and torch.equal(s, s_two)
    torch.testing.assert_close(x, x_ref, rtol=1e-6, atol=1e-5)
    assert ((s - s_ref).abs() <= 2.0 ** -7 * s_ref).all() and ((q.int() - q_ref.int()).abs() <= 2).all()


@pytest.mark.parametrize("modulation", MODULATIONS, ids=["gain", "shift", "no-modulation"])
@pytest.mark.parametrize("m,n,group", QUANTIZED)
def test_quantized_equals_the_two_kernels(m, n, group, modulation, device):
    assert_quantized_equals_two_kernels(m, n, group, modulation, device, seed=m + n)


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
    with pytest.raises(ValueError, match="gated_residual_quantized: ConvRot group"):
        gated_residual_quantized(x, y, gate, row_map, post, 1e-5, 1e-6, 128)
    with pytest.raises(ValueError, match="gated_residual_quantized: modulation scale"):
        gated_residual_quantized(x, y, gate, row_map, post, 1e-5, 1e-6, 16, scale=torch.zeros(3, 16))


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quantized_at_zimage_shape():
    assert_quantized_equals_two_kernels(4608, 3840, 256, MODULATIONS[0], "cuda", seed=3)
