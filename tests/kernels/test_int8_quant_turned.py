"""kernels/int8_quant_turned.py: rows turned by H_64 (an attention's output of a turned v) to INT8 ConvRot codes.

The kernel equals its reference bit for bit: the radix-4 step sums four halved bf16 values in f32, exact for the
rows here (their values' exponents lie within f32's 24 bits of each other), then int8_codes' steps. Against the
rotate pass on the unturned rows u, the turned rows t = bf16(u H_64) carry one bf16 rounding more: codes move by
one or two at a few percent of values, scales by a bf16 step at most (checked, and bounded, below)."""
import pytest
import torch
from test_int8_quant import poisoned_outputs, rows_like_activations

from kernels import int8_quant
from kernels.hadamard import hadamard
from kernels.int8_quant_turned import MAX_K, fits, quantize_turned, reference


def turned_rows(u: torch.Tensor) -> torch.Tensor:
    """bf16(u_a H_64) of each 64 columns: what the attention's output is when its v was turned."""
    m, k = u.shape
    return (u.double().reshape(m, k // 64, 64) @ hadamard(64, torch.float64).to(u.device)).reshape(m, k).to(
        torch.bfloat16)


@pytest.mark.parametrize("m,k", [(1, 256), (37, 768), (5, 3072), (3, 3840)])  # one row, odd rows, Klein, Z-Image
@pytest.mark.parametrize("rows", [1, 2])
def test_equals_its_reference(m, k, rows, device):
    t = rows_like_activations(m, k, seed=m + k, device=device)
    q, s = quantize_turned(t, out=poisoned_outputs(m, k, device), rows=rows)
    q_ref, s_ref = reference(t)
    assert torch.equal(s, s_ref) and torch.equal(q, q_ref)


def test_minus_128_and_a_zero_row(device):
    """A negative absmax can quantize to -128 (format doc section 5), as int8_quant's test_f32_rows_and_minus_128."""
    t = torch.zeros(3, 256, dtype=torch.bfloat16, device=device)
    for row, sign in ((0, -1), (1, 1)):  # column 0 of each block: (H4 / 2) of (y0 = +-11, 0, 0, 0)
        t[row, [0, 64, 128, 192]] = torch.tensor([5.5, 5.5, 5.5, -5.5], device=device).to(torch.bfloat16) * sign
    q, s = quantize_turned(t, out=poisoned_outputs(3, 256, device))
    assert q[0, 0] == -128 and q[1, 0] == 127 and (q[:2, 1:] == 0).all() and (q[2] == 0).all()
    assert torch.equal(s.cpu(), torch.tensor([11 / 127, 11 / 127, 1e-30], dtype=torch.float32))
    q_ref, s_ref = reference(t)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)


def test_as_the_rotate_pass_of_the_unturned_rows(device):
    """The whole path, u -> t = bf16(u H_64) -> codes, against int8_quant's codes of u: one rounding more."""
    u = rows_like_activations(64, 3840, seed=3, device=device)
    q, s = quantize_turned(turned_rows(u))
    q_u, s_u = int8_quant.reference(u, 256)
    assert ((s - s_u).abs() <= 2.0 ** -7 * s_u).all()
    assert (q.int() - q_u.int()).abs().max() <= 2
    assert (q != q_u).float().mean() < 0.1


def test_quantize_rows_takes_turned_rows(device):
    t = rows_like_activations(7, 512, seed=1, device=device)
    q, s = int8_quant.quantize_rows(t, 256, turned=True)
    q_ref, s_ref = int8_quant.reference(t, 256, turned=True)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    with pytest.raises(ValueError, match="turned rows"):
        int8_quant.quantize_rows(t, 64, turned=True)
    with pytest.raises(ValueError, match="turned rows"):
        int8_quant.quantize_rows(t.float(), 256, norm="rms", scale=torch.zeros(1, 512, device=device),
                                 row_map=torch.zeros(7, dtype=torch.long, device=device), turned=True)


def test_fits():
    assert fits(3840, 256) and fits(3072, 256) and fits(MAX_K, 256)
    assert not fits(3840, 64) and not fits(3000, 256) and not fits(MAX_K + 256, 256) and not fits(0, 256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [3072, 3840])
def test_attention_output_shapes(k):
    """Klein's and Z-Image's attention outputs at 1024^2 (4608 rows), bit for bit the reference."""
    t = turned_rows(rows_like_activations(4608, k, seed=k, device="cuda"))
    q, s = quantize_turned(t, out=poisoned_outputs(4608, k, "cuda"))
    q_ref, s_ref = reference(t)
    assert torch.equal(s, s_ref) and torch.equal(q, q_ref)
