"""kernels/attention.py (SDPA, cuDNN first) against its f32 reference and dit_core.block.attention, with
groups given as a batch (head_norm_rope's layout) or as `group` on one [1, heads, M, D] batch."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dit_core.block import attention as host_attention
from kernels.attention import attention, reference

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


def test_bad_arguments_raise():
    q = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        attention(q, q, q[:, :1])
    with pytest.raises(ValueError):
        attention(q, q, q, 4)


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
