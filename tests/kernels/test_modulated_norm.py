"""kernels/modulated_norm.py against its reference (within a few f32 steps: the kernel sums in another order) and
the reference against dit_core's modulated_norm (the host block's math) bit for bit."""
from types import SimpleNamespace

import pytest
import torch

from dit_core.block import modulated_norm as host_modulated_norm
from kernels.modulated_norm import modulated_norm, reference

# (M, D, table rows, shift): odd M; D a power of 2 or not, and past one column block (1024); one or several rows
CASES = [(7, 64, 1, True), (13, 96, 3, True), (5, 1100, 2, False), (1, 48, 1, True)]


def inputs(m, d, rows, shift, seed, device, row_stride=0):
    """x [M, D] f32 (row_stride: a view of wider rows; rows of very different sizes), tables, a map using each."""
    g = torch.Generator().manual_seed(seed)
    wide = 2 + 3 * torch.randn(m, d + row_stride, generator=g) * torch.exp(torch.randn(m, 1, generator=g))
    scale, offset = 0.3 * torch.randn(rows, d, generator=g), torch.randn(rows, d, generator=g)
    row_map = torch.randint(0, rows, (m,), generator=g)
    return (wide.to(device)[:, :d], scale.to(device), offset.to(device) if shift else None,
            row_map.to(device, torch.int32))


@pytest.mark.parametrize("block_d", [32, 4096])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("m,d,rows,shift", CASES)
def test_kernel_matches_reference(m, d, rows, shift, norm, block_d, device):
    """Walking the columns in steps (block_d 32) or each row read once (4096)."""
    x, scale, offset, row_map = inputs(m, d, rows, shift, seed=m + d, device=device, row_stride=8)
    got = modulated_norm(x, scale, offset, row_map, 1e-6, norm=norm, block_m=2, block_d=block_d)
    want = reference(x, scale, offset, row_map.long(), 1e-6, norm=norm)
    assert got.shape == (m, d) and got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_bf16_rows_are_the_f32_rows_rounded_once(norm, device):
    """out_dtype bf16 (the GPU pieces' rows, which every reader takes as bf16): the f32 rows rounded to nearest, ties
    to even, one bf16 step apart at most where the kernel's f32 sums land beside a rounding boundary."""
    x, scale, offset, row_map = inputs(13, 1100, 3, True, seed=5, device=device, row_stride=8)
    got = modulated_norm(x, scale, offset, row_map, 1e-6, norm=norm, out_dtype=torch.bfloat16, block_m=2)
    f32 = modulated_norm(x, scale, offset, row_map, 1e-6, norm=norm, block_m=2)
    assert got.dtype == torch.bfloat16 and got.shape == (13, 1100) and got.is_contiguous()
    assert torch.equal(got, f32.to(torch.bfloat16))
    want = reference(x, scale, offset, row_map.long(), 1e-6, norm=norm, out_dtype=torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5)  # a bf16 step


@pytest.mark.parametrize("block_d", [256, 2048])
@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_a_second_modulation_is_the_same_as_its_own_pass(shift, out_dtype, block_d, device):
    """also (LTX-2.5's A->V queries and V->A keys of the same video rows): both outputs from one pass, each equal bit
    for bit to its own call, and the reference's pair to its two calls."""
    x, scale, offset, row_map = inputs(13, 1100, 3, shift, seed=7, device=device, row_stride=8)
    _, scale2, offset2, _ = inputs(13, 1100, 3, shift, seed=8, device=device)
    kw = {"out_dtype": out_dtype, "block_m": 2, "block_d": block_d}
    first, second = modulated_norm(x, scale, offset, row_map, 1e-6, also=(scale2, offset2), **kw)
    assert torch.equal(first, modulated_norm(x, scale, offset, row_map, 1e-6, **kw))
    assert torch.equal(second, modulated_norm(x, scale2, offset2, row_map, 1e-6, **kw))
    pair = reference(x, scale, offset, row_map, 1e-6, out_dtype=out_dtype, also=(scale2, offset2))
    assert all(torch.equal(got, reference(x, sc, sh, row_map, 1e-6, out_dtype=out_dtype))
               for got, (sc, sh) in zip(pair, ((scale, offset), (scale2, offset2))))


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_reference_is_the_host_block(norm):
    x, scale, offset, row_map = inputs(9, 64, 3, True, seed=4, device="cpu")
    arch = SimpleNamespace(norm=norm, eps=1e-6)
    assert torch.equal(reference(x, scale, offset, row_map.long(), 1e-6, norm=norm),
                       host_modulated_norm(arch, x, None, offset, scale, row_map.long()))


def test_bad_arguments_raise():
    x, scale, offset, row_map = inputs(4, 32, 2, True, seed=0, device="cpu")
    for args, kw in (((x, scale, offset, row_map), {"norm": "batch"}), ((x.T, scale, offset, row_map), {}),
                     ((x, scale[:, :16], offset, row_map), {}), ((x, scale, offset, row_map[:3]), {}),
                     ((x, scale, offset, row_map), {"out_dtype": torch.float16}),
                     ((x, scale, offset, row_map), {"block_d": 48})):
        with pytest.raises(ValueError, match="modulated_norm"):
            modulated_norm(*args, **kw)
    for also in ((scale[:, :16], offset), (scale, None)):
        with pytest.raises(ValueError, match="modulated_norm"):
            modulated_norm(x, scale, offset, row_map, also=also)
