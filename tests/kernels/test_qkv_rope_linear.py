"""kernels/int8/qkv_rope_linear.py (the QKV product with head norm and rotary in its epilogue) against the two launches
it replaces: q and k within one bf16 step (the RMS sums run in another order), v bit for bit."""
import pytest
import torch
from conftest import assert_within_one_bf16_step

from kernels.head_norm_rope import head_norm_rope
from kernels.int8.linear import int8_linear
from kernels.int8.quant_turned import turned_rows
from kernels.int8.qkv_rope_linear import qkv_rope_linear, reference

SMALL = {"BLOCK_M": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}


def operands(m, heads, head, k, seed, device, bias=True):
    g = torch.Generator().manual_seed(seed)
    n = 3 * heads * head
    angles = 50 * torch.rand(m, head // 2, generator=g)
    ops = {"q": torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8),
           "s_x": torch.rand(m, generator=g) * 0.02 + 1e-3,
           "w": torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
           "s_w": torch.rand(n, generator=g) * 0.002 + 1e-4,
           "bias": torch.randn(n, generator=g).to(torch.bfloat16) if bias else None,
           "heads": heads, "head": head,
           "q_weight": 1 + 0.2 * torch.randn(head, generator=g), "k_weight": 1 + 0.2 * torch.randn(head, generator=g),
           "cos": angles.cos(), "sin": angles.sin()}
    return {key: t.to(device) if isinstance(t, torch.Tensor) else t for key, t in ops.items()}


@pytest.mark.parametrize("m", [1, 37])
@pytest.mark.parametrize("block_n", [32, 64])  # one head, two heads a tile
@pytest.mark.parametrize("loads", [{}, {"TMA": True}, {"TMA": True, "PERSISTENT": True}],
                         ids=["pointers", "tma", "tma-persistent"])
@pytest.mark.parametrize("normed,bias,group", [(True, True, 0), (False, False, 0), (True, False, 1)])
def test_equals_the_two_launches(m, block_n, loads, normed, bias, group, device):
    ops = operands(m, heads=4, head=32, k=64, seed=m + block_n, device=device, bias=bias)
    if not normed:
        ops["q_weight"] = ops["k_weight"] = None
    got = qkv_rope_linear(**ops, eps=1e-5, group=group, tiles={**SMALL, "BLOCK_N": block_n, **loads})
    qkv = int8_linear(ops["q"], ops["s_x"], ops["w"], ops["s_w"], ops["bias"], tiles={**SMALL, "BLOCK_N": 32})
    want = head_norm_rope(qkv, 4, 32, ops["q_weight"], ops["k_weight"], ops["cos"], ops["sin"], 1e-5, group=group)
    g = group or m
    for a, b in zip(got, want):
        assert a.shape == b.shape == (m // g, 4, g, 32) and a.transpose(1, 2).is_contiguous()
        assert_within_one_bf16_step(a, b)
    assert torch.equal(got[2], want[2])  # v: the product's bf16 rows as they are
    for a, b in zip(got, reference(**ops, eps=1e-5, group=group)):
        assert_within_one_bf16_step(a, b)


@pytest.mark.parametrize("m,block_n", [(1, 64), (37, 128)])  # one head, two heads a tile
def test_turned_v(m, block_n, device):
    """turn_v: q and k as without it, v's each 64 columns turned along their top digit (four bf16 halves summed:
    exact in f32, so bit for bit float64's)."""
    ops = operands(m, heads=2, head=64, k=64, seed=m, device=device)
    tiles = {**SMALL, "BLOCK_N": block_n}
    got, plain = qkv_rope_linear(**ops, tiles=tiles, turn_v=True), qkv_rope_linear(**ops, tiles=tiles)
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
    assert torch.equal(got[2], turned_rows(plain[2])) and torch.equal(got[2], reference(**ops, turn_v=True)[2])
    assert got[2].transpose(1, 2).is_contiguous()
    with pytest.raises(ValueError, match="turn_v"):
        qkv_rope_linear(**operands(m, heads=2, head=32, k=64, seed=m, device=device), turn_v=True)


def test_tiles_must_hold_whole_heads(device):
    ops = operands(5, heads=3, head=32, k=64, seed=0, device=device)
    with pytest.raises(ValueError, match="whole heads"):
        qkv_rope_linear(**ops, tiles={**SMALL, "BLOCK_N": 64})  # 64 does not divide 3 x 32
    with pytest.raises(ValueError, match="every column turned"):
        qkv_rope_linear(**{**ops, "cos": ops["cos"][:, :8], "sin": ops["sin"][:, :8]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_zimage_shape_default_tiles():
    """Z-Image's QKV at 1024^2 (4608 rows, 30 heads of 128 from 3840 features), the default tiles (int8_linear's
    fixed ones on Hopper, else autotuned)."""
    ops = operands(4608, heads=30, head=128, k=3840, seed=1, device="cuda")
    got = qkv_rope_linear(**ops)
    qkv = int8_linear(ops["q"], ops["s_x"], ops["w"], ops["s_w"], ops["bias"])
    want = head_norm_rope(qkv, 30, 128, ops["q_weight"], ops["k_weight"], ops["cos"], ops["sin"])
    for a, b in zip(got, want):
        assert_within_one_bf16_step(a, b)
    assert torch.equal(got[2], want[2])
