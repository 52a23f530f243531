"""kernels/swiglu_quant_linear.py against the two launches it replaces (int8_linear's SwiGLU form, then
quantize_rows on the hidden rows, group 256): codes and scales bit for bit, at odd shapes on the CPU interpreter and at
Z-Image's MLP on the GPU."""
import pytest
import torch
from test_int8_linear import LOAD_IDS, LOADS, operands

from kernels import swiglu_quant_linear as fused
from kernels.int8_linear import int8_linear
from kernels.int8_quant import quantize_rows

TILES = {"BLOCK_M": 16, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
WHOLE_TILE_LOADS = [(loads, name) for loads, name in zip(LOADS, LOAD_IDS) if not loads.get("SUBTILE")]


def two_launches(ops, tiles=None):
    hidden = int8_linear(**ops, swiglu=True, tiles=tiles)
    return quantize_rows(hidden, 256, block_m=16 if tiles else 64)


def poisoned(m, n):
    return torch.full((m, n), 77, dtype=torch.int8), torch.full((m,), float("nan"))


@pytest.mark.parametrize("m,k", [(1, 64), (37, 80), (40, 96)])  # one row; K not a multiple of BLOCK_K; whole tiles
@pytest.mark.parametrize("loads", [x for x, _ in WHOLE_TILE_LOADS], ids=[i for _, i in WHOLE_TILE_LOADS])
def test_equals_the_two_launches(m, k, loads, device):
    """Two groups (1024 product columns: four tiles a row block, two pairs), every row block's pairs in turn."""
    ops, _, _ = operands(m, 1024, k, seed=m * k, device=device)
    out = tuple(t.to(device) for t in poisoned(m, 512))
    codes, scales = fused.swiglu_quant_linear(**ops, out=out, tiles={**TILES, **loads})
    assert codes is out[0] and scales is out[1]
    expected_codes, expected_scales = two_launches(ops, TILES)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    reference_codes, reference_scales = fused.reference(**ops)
    assert (codes.int() - reference_codes.int()).abs().max() <= 1  # the SwiGLU's exp and f32 sums: within a code
    torch.testing.assert_close(scales, reference_scales, rtol=1e-2, atol=0)


def test_bad_arguments_raise():
    ops, _, _ = operands(4, 768, 64, seed=0, device="cpu")
    with pytest.raises(ValueError, match="multiple of 512"):
        fused.swiglu_quant_linear(**ops, tiles=TILES)
    ops, _, _ = operands(4, 512, 64, seed=0, device="cpu")
    with pytest.raises(ValueError, match="BLOCK_N 256"):
        fused.swiglu_quant_linear(**ops, tiles={**TILES, "BLOCK_N": 128})
    with pytest.raises(ValueError, match="out must be"):
        fused.swiglu_quant_linear(**ops, tiles=TILES, out=poisoned(4, 512 // 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [4608, 4096 + 77])
def test_zimage_mlp(m):
    """Z-Image's w1 + w3 (3840 -> 2 x 10240) at its fixed tile: equal to the two launches at their fixed tiles."""
    ops, _, _ = operands(m, 20480, 3840, seed=m, device="cuda")
    out = tuple(t.cuda() for t in poisoned(m, 10240))
    codes, scales = fused.swiglu_quant_linear(**ops, out=out)
    assert not fused._UNFIT, "the fixed tile did not fit: the two launches ran"
    expected = two_launches(ops)
    assert torch.equal(codes, expected[0]) and torch.equal(scales, expected[1])
