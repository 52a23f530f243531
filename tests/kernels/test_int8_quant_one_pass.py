"""kernels/int8_quant_one_pass.py (whole rows in registers) against int8_quant's reference and its two-pass kernel:
plain rows exactly as the float64 rotation allows (assert_codes_match_float64), the fused norms within
int8_quant's bound; odd row counts, K below the padded width, one group, every group size; given statistics."""
import pytest
import torch
from test_int8_quant import (
    CASES,
    ZIMAGE_ROWS,
    assert_codes_match_float64,
    assert_fused_close,
    fused_inputs,
    poisoned_outputs,
    rows_like_activations,
)

from kernels.int8_quant import hadamard, quantize_rows, reference
from kernels.int8_quant_one_pass import MAX_WIDTH, fits, quantize_rows_one_pass

NORMED = [{"norm": "rms", "weight": True, "shift": True}, {"norm": "rms", "weight": False, "shift": False},
          {"norm": "layer", "weight": False, "shift": True}]


@pytest.mark.parametrize("m,k,group", CASES + [(9, 768, 256), (3, 2560, 256)])
@pytest.mark.parametrize("block_m", [None, 1, 4])
def test_plain_rows(m, k, group, block_m, device):
    x = rows_like_activations(m, k, seed=m * k + 1, device=device)
    q, s = quantize_rows_one_pass(x, group, out=poisoned_outputs(m, k, device), block_m=block_m)
    assert not s.isnan().any()
    assert_codes_match_float64(q, s, x, group, max_fraction=0)
    two_pass = quantize_rows(x, group, block_m=16)
    assert torch.equal(q, two_pass[0]) and torch.equal(s, two_pass[1])  # same sums, same order: equal


@pytest.mark.parametrize("case", NORMED, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("m,k,group", [(37, 64, 16), (19, 128, 64), (5, 512, 256), (6, 320, 64)])
@pytest.mark.parametrize("mod_rows", [3, 1])
def test_normed_rows(m, k, group, case, mod_rows, device):
    x, kw = fused_inputs(m, k, case, seed=m + k, device=device, rows=mod_rows)
    q, s = quantize_rows_one_pass(x, group, **kw, out=poisoned_outputs(m, k, device))
    assert not s.isnan().any()
    assert_fused_close(q, s, *reference(x, group, **kw), max_fraction=0.01)


def test_given_statistics_are_used(device):
    m, k = 11, 256
    x, kw = fused_inputs(m, k, NORMED[0], seed=3, device=device)
    stats = torch.stack([torch.zeros(m), 0.5 + torch.rand(m, generator=torch.Generator().manual_seed(1))]).to(device)
    q, s = quantize_rows_one_pass(x, 256, **kw, stats=stats)
    assert_fused_close(q, s, *reference(x, 256, **kw, stats=stats), max_fraction=0.01)


def test_what_does_not_fit_takes_two_passes(device):
    assert fits(MAX_WIDTH, None) and not fits(MAX_WIDTH + 256, None) and not fits(256, "swiglu")
    x = rows_like_activations(3, 512, seed=2, device=device)
    for got, want in zip(quantize_rows_one_pass(x, 256, act="swiglu"), quantize_rows(x, 256, act="swiglu")):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="quantize_rows_one_pass: ConvRot group 256 does not divide"):
        quantize_rows_one_pass(torch.randn(4, 320), 256)


def test_f32_rows_and_minus_128(device):
    """Plain f32 rows are rounded to bf16 first; a negative absmax can quantize to -128 (format doc section 5)."""
    y = torch.zeros(2, 16, dtype=torch.float64)
    y[0, 0], y[1, 0] = -11.0, 11.0
    x = (y @ hadamard(16, torch.float64)).float().to(device)
    q, s = quantize_rows_one_pass(x, 16, out=poisoned_outputs(2, 16, device))
    assert q[0, 0] == -128 and q[1, 0] == 127 and (q[:, 1:] == 0).all()
    assert torch.equal(s.cpu(), torch.full((2,), 11.0) / 127)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [3072, 3840, 9216, 10240])
def test_plain_codes_equal_float64_rotation_at_real_shapes(k):
    x = rows_like_activations(ZIMAGE_ROWS, k, seed=k, device="cuda")
    q, s = quantize_rows_one_pass(x, 256, out=poisoned_outputs(ZIMAGE_ROWS, k, "cuda"))
    assert_codes_match_float64(q, s, x, 256, max_fraction=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", NORMED, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("mod_rows", [1, 3])
def test_normed_rows_at_zimage_shape(case, mod_rows):
    x, kw = fused_inputs(ZIMAGE_ROWS, 3840, case, seed=mod_rows, device="cuda", rows=mod_rows)
    q, s = quantize_rows_one_pass(x, 256, **kw, out=poisoned_outputs(ZIMAGE_ROWS, 3840, "cuda"))
    assert_fused_close(q, s, *reference(x, 256, **kw), max_fraction=1e-3)


def test_out_of_shared_memory_takes_two_passes(monkeypatch, device):
    """A GPU whose shared memory turns a width down (OutOfResources before anything ran): the rows of that width go
    through two passes, then and from then on."""
    import triton.runtime.errors

    from kernels import int8_quant_one_pass

    class Refusing:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
            return launch

    monkeypatch.setattr(int8_quant_one_pass, "_one_pass_kernel", Refusing())
    monkeypatch.setattr(int8_quant_one_pass, "_UNFIT_WIDTHS", set())
    x = rows_like_activations(5, 768, seed=4, device=device)
    for got, want in zip(quantize_rows_one_pass(x, 256), quantize_rows(x, 256)):
        assert torch.equal(got, want)
    assert int8_quant_one_pass._UNFIT_WIDTHS == {1024} and not fits(768, None) and fits(512, None)
