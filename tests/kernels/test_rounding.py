"""kernels/rounding.py against torch's roundings: on the CPU its integer form (the interpreter's cast truncates), on
the GPU the hardware conversion, both over every bf16 neighbourhood that matters (midpoints, ties both ways,
subnormals, the largest finite values) and random bit patterns."""
import pytest
import torch

from kernels.rounding import round_half_even, round_to_bf16, rounded_bf16

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _rounded_kernel(x_ptr, bf16_ptr, stored_ptr, int_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(bf16_ptr + offs, round_to_bf16(x), mask=offs < N)
    tl.store(stored_ptr + offs, rounded_bf16(x), mask=offs < N)
    tl.store(int_ptr + offs, round_half_even(x), mask=offs < N)


def f32_cases() -> torch.Tensor:
    """Each bf16 value of every exponent at both signs, those plus a quarter, half and three quarters of a bf16
    step (the midpoint: a tie, broken to even by the last kept bit), near-midpoints either side, and random bits."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    bits = every[every.isfinite()].view(torch.int32)
    offsets = torch.tensor([0, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xBFFF], dtype=torch.int32)
    near = (bits[:, None] + offsets[None, :]).reshape(-1)
    random = torch.randint(-2**31, 2**31 - 1, (1 << 16,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    x = torch.cat([near, random]).view(torch.float32)
    # finite values whose bf16 rounding is finite too (above 0x7F7F7FFF the rounding overflows, as cvt.rn does)
    return x[x.isfinite() & (x.abs() < torch.tensor(0x7F7F8000, dtype=torch.int32).view(torch.float32))]


def test_roundings_equal_torch(device):
    check_roundings(device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_roundings_equal_torch():
    check_roundings(torch.device("cuda"))


def check_roundings(device):
    x = f32_cases()
    assert x.numel() > 400_000
    bf16, ints = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    stored = torch.zeros_like(x, dtype=torch.bfloat16)
    args = (x.to(device), bf16.to(device), stored.to(device), ints.to(device))
    _rounded_kernel[(triton.cdiv(x.numel(), 1024),)](*args, x.numel(), BLOCK=1024)
    assert torch.equal(args[1].cpu().view(torch.int32), x.to(torch.bfloat16).float().view(torch.int32))
    # the interpreter's bf16 tensors flush subnormals: normal values only there, every value on the GPU
    kept = x.abs() >= (2.0 ** -126 if device.type == "cpu" else 0)
    assert torch.equal(args[2].cpu()[kept].view(torch.int16), x[kept].to(torch.bfloat16).view(torch.int16))
    small = x.abs() < 2**22  # round_half_even's domain
    assert torch.equal(args[3].cpu()[small], x[small].round())
    # the check can fail: truncation (the interpreter's own cast) differs at a quarter step
    assert not torch.equal(x.to(torch.bfloat16).float(),
                           (x.view(torch.int32) & ~0xFFFF).view(torch.float32))
