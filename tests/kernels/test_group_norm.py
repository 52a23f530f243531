"""kernels/group_norm.py against its reference: f32 within sums' reordering, bf16 within one step of the f32 math
rounded once (the reference rounds between the norm and SiLU, the kernel does not); pieces and blocks that split
channels, a group of one channel, 1-D and 3-D positions, activations far from zero mean."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_within_one_bf16_step, rel_err

from kernels.group_norm import _group_norm_apply_kernel, _piece_moments_kernel, build, group_norm, reference

# (shape, groups)
CASES = [((2, 8, 5, 7), 4), ((1, 6, 40, 3), 6), ((1, 12, 33), 3), ((1, 8, 2, 3, 5), 2), ((3, 4, 1, 1), 2)]


def activations(shape, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = 20 + 3 * torch.randn(shape, generator=g)  # far from zero mean: a sum of squares would cancel
    w, b = 1 + 0.2 * torch.randn(c, generator=g), 0.1 * torch.randn(c, generator=g)
    return x.to(device, dtype), w.to(device, dtype), b.to(device, dtype)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape,groups", CASES)
def test_f32_matches_reference(shape, groups, silu, device):
    x, w, b = activations(shape, sum(shape), device, torch.float32)
    got = group_norm(x, w, b, groups, 1e-6, silu, block=16, piece=32)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert rel_err(got, reference(x, w, b, groups, 1e-6, silu)) < 1e-5


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape,groups", CASES[:3])
def test_bf16_within_one_step_of_the_math(shape, groups, silu, device):
    x, w, b = activations(shape, sum(shape) + 1, device, torch.bfloat16)
    got = group_norm(x, w, b, groups, 1e-6, silu, block=16, piece=16)
    assert got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, reference(x.float(), w.float(), b.float(), groups, 1e-6, silu).to(torch.bfloat16))


# (shape, groups) of channels-last activations: groups and channels a group powers of two
LAST_CASES = [((2, 8, 5, 7), 4), ((1, 16, 9, 3), 4), ((1, 8, 2, 3, 5), 2), ((1, 32, 4, 4), 32)]


def channels_last(x):
    return x.movedim(1, -1).contiguous().movedim(-1, 1)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape,groups", LAST_CASES)
def test_channels_last_f32_matches_reference(shape, groups, silu, device):
    """Channels-last activations (a channels-last decoder's) normed in their own layout: pieces that split the
    positions, combined a few at a time; the result channels last too."""
    x, w, b = activations(shape, sum(shape) + 2, device, torch.float32)
    x = channels_last(x)
    got = group_norm(x, w, b, groups, 1e-6, silu, block_s=2, last_pieces=5, last_parts=2)
    assert got.shape == x.shape and got.stride() == x.stride()
    assert rel_err(got, reference(x, w, b, groups, 1e-6, silu)) < 1e-5


def test_channels_last_bf16_within_one_step_of_the_math(device):
    x, w, b = activations((1, 16, 6, 5), 7, device, torch.bfloat16)
    got = group_norm(channels_last(x), w, b, 4, 1e-6, True, block_s=4, last_pieces=3, last_parts=4)
    assert got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got, reference(x.float(), w.float(), b.float(), 4, 1e-6, True).to(torch.bfloat16))


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shift_is_normed_with_x(last, dtype, device):
    """A shift a channel (the bias of the conv that wrote x, not yet added; f32): the norm of x + shift, in either
    layout, its pieces' means moved by their channels' shifts (several channels a group, far apart)."""
    x, w, b = activations((2, 8, 5, 7), 11, device, dtype)
    shift = (10 * torch.randn(8, generator=torch.Generator().manual_seed(2))).to(device)
    got = group_norm(channels_last(x) if last else x, w, b, 4, 1e-6, True, shift, block=16, piece=16, block_s=2,
                     last_pieces=5, last_parts=2)
    want = F.silu(F.group_norm(x.float() + shift[:, None, None], 4, w.float(), b.float(), 1e-6))
    assert torch.equal(want, reference(x.float(), w.float(), b.float(), 4, 1e-6, True, shift))
    if dtype == torch.float32:
        assert rel_err(got, want) < 1e-5
    else:
        assert_within_one_bf16_step(got, want.to(torch.bfloat16))


def test_channels_last_off_a_power_of_two_is_normed_as_it_reads(device):
    """Groups or channels a group not powers of two: refused as channels last (the channel-first kernels then
    need contiguous rows), as any other layout they do not take."""
    x, w, b = activations((1, 6, 4, 4), 0, device, torch.float32)
    with pytest.raises(ValueError, match="channels last"):
        group_norm(channels_last(x), w, b, 3)


def test_a_group_of_many_pieces_reads_them_all(device):
    """More pieces than max_parts allows are merged into longer pieces, combined `parts` at a time, with the same
    result."""
    x, w, b = activations((1, 2, 37), 5, device, torch.float32)
    got = group_norm(x, w, b, 1, 1e-6, block=2, piece=1, max_parts=8, parts=4)
    assert rel_err(got, reference(x, w, b, 1, 1e-6)) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton's warmup compiles for one)")
def test_kernels_built_ahead_serve_every_size():
    """build() compiles what a decode of any resolution and channel count launches: nothing is built after it."""
    build(torch.bfloat16)
    caches = [k.device_caches[torch.cuda.current_device()][0] for k in (_piece_moments_kernel,
                                                                         _group_norm_apply_kernel)]
    before = [len(c) for c in caches]
    for shape in ((1, 64, 32, 32), (2, 128, 96, 80), (1, 512, 128, 128)):
        x, w, b = activations(shape, 0, "cuda", torch.bfloat16)
        for silu in (False, True):
            group_norm(x, w, b, 32, 1e-6, silu)
    assert [len(c) for c in caches] == before


def test_an_empty_batch_gives_an_empty_result(device):
    x, w, b = activations((0, 4, 3, 3), 0, device, torch.float32)
    assert group_norm(x, w, b, 2).shape == (0, 4, 3, 3)


def test_bad_arguments_raise():
    x, w, b = activations((1, 6, 4, 4), 0, "cpu", torch.float32)
    for args in ((x, w, b, 4), (x.transpose(2, 3), w, b, 3), (x, w[:3], b, 3), (x[0, 0, 0], w, b, 1),
                 (x, w, b, 3, 1e-6, False, b[:3])):
        with pytest.raises(ValueError, match="group_norm"):
            group_norm(*args)
