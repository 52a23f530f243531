"""kernels/attention.py (SDPA, cuDNN first; FlashAttention-3 where chosen and installed) against its f32 reference
and dit_core.block.attention, with groups given as a batch (head_norm_rope's layout) or as `group` on one
[1, heads, M, D] batch; keys of other rows than the queries' (a cross-attention)."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dit_core.block import attention as host_attention
from kernels import Choices
from kernels.attention import attention, fa3_takes, reference

CASES = [(7, 2, 32, 0), (12, 3, 16, 4), (1, 1, 64, 0)]  # (M, heads, head, group)


def qkv_rows(m, heads, head, seed, device):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(m, heads, head, generator=g).to(device, torch.bfloat16) for _ in range(3)]


def batch_layout(t, group):
    """rows [M, heads, D] -> [G, heads, g, D] (the layout head_norm_rope writes)."""
    m, h, d = t.shape
    g = group or m
    return t.reshape(m // g, g, h, d).transpose(1, 2).contiguous()


@pytest.mark.parametrize("m,heads,head,group", CASES)
def test_matches_reference_and_host(m, heads, head, group, device):
    rows = qkv_rows(m, heads, head, seed=m, device=device)
    host = host_attention(*(t.float().cpu() for t in rows), group)
    batched = [batch_layout(t, group) for t in rows]
    got = attention(*batched)
    torch.testing.assert_close(got.float(), reference(*batched).float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float().cpu(), host, rtol=2e-2, atol=2e-2)
    one_batch = [batch_layout(t, 0) for t in rows]
    torch.testing.assert_close(attention(*one_batch, group).float(), got.float(), rtol=0, atol=0)
    torch.testing.assert_close(reference(*one_batch, group), reference(*batched), rtol=0, atol=0)


def test_keys_of_other_rows(device):
    """A cross-attention's keys (5 rows for 7 queries): as the reference, with FA3 chosen too (SDPA where it does
    not take the heads: on the CPU, or without fa3_fwd)."""
    q = batch_layout(qkv_rows(7, 2, 32, seed=1, device=device)[0], 0)
    k, v = (batch_layout(t, 0) for t in qkv_rows(5, 2, 32, seed=2, device=device)[:2])
    got = attention(q, k, v)
    assert got.shape == (7, 64)
    torch.testing.assert_close(got.float(), reference(q, k, v).float(), rtol=2e-2, atol=2e-2)
    chosen = attention(q, k, v, choices=Choices(fa3_attention=True))
    if not fa3_takes(q, k, v):
        assert torch.equal(chosen, got)


def test_bad_arguments_raise():
    q = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        attention(q, q, q[:, :1])
    with pytest.raises(ValueError):
        attention(q, q, q, 4)
    with pytest.raises(ValueError, match="other rows"):  # keys of other rows: no groups
        attention(q[:1], q[:1, :, :4], q[:1, :, :4], 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fa3_where_installed():
    """Choices.fa3_attention: FlashAttention-3's forward on the rows' views (self and cross) within bf16's error of
    the f32 reference, as close as cuDNN's; skipped where fa3_fwd is not installed or the GPU is not a Hopper."""
    q, k, v = (batch_layout(t, 0) for t in qkv_rows(4608, 24, 128, seed=3, device="cuda"))
    if not fa3_takes(q, k, v):
        pytest.skip("fa3_fwd not installed, or not a Hopper GPU")
    for keys in (slice(None), slice(0, 1024)):
        kk, vv = k[:, :, keys], v[:, :, keys]
        want, sdpa = reference(q, kk, vv).float(), attention(q, kk, vv).float()
        got = attention(q, kk, vv, choices=Choices(fa3_attention=True)).float()
        assert not torch.equal(got, sdpa) or keys.stop  # (FA3 ran: its order of sums is its own)
        assert (got - want).norm() <= 1.5 * (sdpa - want).norm() + 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("group", [0, 1152])
def test_zimage_shape_and_cudnn(group):
    rows = qkv_rows(4608, 30, 128, seed=group, device="cuda")
    batched = [batch_layout(t, group) for t in rows]
    got = attention(*batched)
    torch.testing.assert_close(got.float(), reference(*batched).float(), rtol=2e-2, atol=2e-2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # raises if cuDNN cannot take the shape: then flash ran
        cudnn = torch.nn.functional.scaled_dot_product_attention(*batched)
    assert torch.equal(got, cudnn.transpose(1, 2).reshape(got.shape))
