"""kernels/head_norm_rope.py against its reference (within one bf16 step: the RMS sums run in another order
on a GPU) and against dit_core's head_norm_rotary, the block's host math, in the SDPA layout of groups."""
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_within_one_bf16_step

from dit_core.block import head_norm_rotary
from dit_core.sequence import Sequence
from kernels.head_norm_rope import head_norm_rope, qk_norm_rows, reference

# (M, heads, head, r, group): odd M, partial and full rotary, no rotary, head not a power of 2, groups.
CASES = [(7, 2, 32, 8, 0), (37, 3, 64, 32, 0), (1, 1, 16, 0, 0), (12, 3, 24, 12, 4), (20, 2, 32, 16, 5)]


def inputs(m, heads, head, r, seed, device, kv=0):
    g = torch.Generator().manual_seed(seed)
    qkv = (3 * torch.randn(m, (heads + 2 * (kv or heads)) * head, generator=g)).to(torch.bfloat16)
    angles = 100 * torch.rand(m, r, generator=g)
    gains = (1 + 0.2 * torch.randn(2, head, generator=g))
    return tuple(t.to(device) for t in (qkv, angles.cos(), angles.sin(), gains[0], gains[1]))


@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("m,heads,head,r,group", CASES)
def test_kernel_matches_reference(m, heads, head, r, group, normed, device):
    qkv, cos, sin, wq, wk = inputs(m, heads, head, r, seed=m + head, device=device)
    if not normed:
        wq = wk = None
    g = group or m
    out = torch.full((3, m // g, g, heads, head), float("nan"), dtype=torch.bfloat16, device=device)
    q, k, v = head_norm_rope(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group, out=out, block_m=16)
    # [G, heads, g, D] views of rows-major storage (SDPA's BSHD): a row's heads side by side.
    assert all(t.shape == (m // g, heads, g, head) and t.transpose(1, 2).is_contiguous() for t in (q, k, v))
    assert not out.isnan().any()
    for got, want in zip((q, k, v), reference(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group)):
        assert_within_one_bf16_step(got, want)
    assert torch.equal(v.transpose(1, 2).reshape(m, heads * head), qkv[:, 2 * heads * head:])


# (M, heads, kv heads, head, r, group): key heads shared by 2, 3 and all query heads; odd M, groups, no rotary.
GROUPED = [(7, 4, 2, 32, 8, 0), (12, 6, 2, 24, 12, 4), (9, 4, 1, 16, 0, 0)]


@pytest.mark.parametrize("m,heads,kv,head,r,group", GROUPED)
def test_shared_key_heads(m, heads, kv, head, r, group, device):
    """Grouped-query rows [q | k | v] with kv key heads (a view: the rows' gate columns follow, Krea 2's QKV): the
    kernel against its reference, and k and v as each query head's key head, normed and turned like one of
    its own."""
    wide, cos, sin, wq, wk = inputs(m, heads, head, r, seed=m + kv, device=device, kv=kv)
    wide = torch.cat([wide, torch.ones(m, heads * head, dtype=wide.dtype, device=device)], 1)  # the gate's columns
    qkv = wide[:, :(heads + 2 * kv) * head]
    q, k, v = head_norm_rope(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group, block_m=16, kv_heads=kv)
    want = reference(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group, kv_heads=kv)
    for got, expected in zip((q, k, v), want):
        assert_within_one_bf16_step(got, expected)
    repeated = torch.cat([qkv[:, :heads * head]] + [t.reshape(m, kv, head).repeat_interleave(heads // kv, 1)
                                                     .reshape(m, -1) for t in qkv[:, heads * head:].chunk(2, 1)], 1)
    for got, expected in zip(want, reference(repeated, heads, head, wq, wk, cos, sin, 1e-5, group=group)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("m,heads,head,r,group", CASES)
def test_reference_matches_host_block(m, heads, head, r, group):
    qkv, cos, sin, wq, wk = inputs(m, heads, head, r, seed=m * head, device="cpu")
    seq = Sequence(torch.zeros(m, dtype=torch.long), cos, sin, group)
    arch = SimpleNamespace(qk_eps=1e-5, qk_norm="head")  # what head_norm_rotary reads of the Arch
    host = [head_norm_rotary(t, w, arch, seq) for t, w in
            zip(qkv.float().reshape(m, 3, heads, head).unbind(1)[:2], (wq, wk))]
    for got, want in zip(reference(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group), host):
        rows = got.transpose(1, 2).reshape(m, heads, head).float()
        torch.testing.assert_close(rows, want, rtol=2.0 ** -8, atol=1e-6)


def test_bad_arguments_raise():
    qkv, cos, sin, wq, wk = inputs(8, 2, 32, 8, seed=0, device="cpu")
    with pytest.raises(ValueError):
        head_norm_rope(qkv, 2, 16, wq, wk, cos, sin)
    with pytest.raises(ValueError):
        head_norm_rope(qkv, 2, 32, wq, None, cos, sin)
    with pytest.raises(ValueError):
        head_norm_rope(qkv, 2, 32, wq, wk, cos, sin, group=3)
    with pytest.raises(ValueError, match="key heads do not divide"):
        head_norm_rope(qkv, 2, 32, wq, wk, cos, sin, kv_heads=3)
    with pytest.raises(ValueError, match=r"\(2 \+ 2 x 1\) heads"):
        head_norm_rope(qkv, 2, 32, wq, wk, cos, sin, kv_heads=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("group", [0, 1152])
def test_zimage_shape(group):
    m, heads, head, r = 4608, 30, 128, 64
    qkv, cos, sin, wq, wk = inputs(m, heads, head, r, seed=group, device="cuda")
    q, k, v = head_norm_rope(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group)
    for got, want in zip((q, k, v), reference(qkv, heads, head, wq, wk, cos, sin, 1e-5, group=group)):
        assert_within_one_bf16_step(got, want)
        assert (got != want).float().mean() < 1e-3


def test_qk_norm_rows_views_adjacent_rows():
    """The gains as GpuBlock keeps them (rows of one [2, D] f32 tensor) are viewed, no copy; apart, stacked."""
    both = torch.randn(2, 64)
    rows = qk_norm_rows(both[0], both[1])
    assert rows.data_ptr() == both.data_ptr() and torch.equal(rows, both)
    apart = qk_norm_rows(both[1], both[0])
    assert apart.data_ptr() != both.data_ptr() and torch.equal(apart, both.flip(0))
    assert torch.equal(qk_norm_rows(both[0].bfloat16(), both[1].bfloat16()), both.bfloat16().float())
