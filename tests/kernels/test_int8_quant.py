"""kernels/int8/quant.py against its reference, dit_core's host quantizer and, on the GPU at Z-Image's
shapes, the float64 rotation of the same bf16 rows.

What may differ from the float64 reference (test_plain_codes_equal_float64_rotation): the kernel sums each
rotated value's g exact products in f32, so its bf16 rounding of a value y can differ from the correctly
rounded one only where y lies within that sum's error of a bf16 rounding midpoint ("ambiguous"; bound
2^-17 sum_i |u_i| / sqrt(g): four f32 ulps of the largest partial sum per 16-product matrix-core step, 16
steps for g = 256; about 7 % of values fall inside it, so the count bound is what makes the test tight).
Allowed: codes off by one or two (see assert_codes_match_float64) at ambiguous values, and rows whose scale
differs only where an ambiguous value competes for the absmax; both counted and bounded (1e-5 of the codes
at Z-Image's shapes). Every other code and scale must be equal.
"""
import math

import pytest
import torch

from dit_core.weights import hadamard as host_hadamard
from dit_core.weights import quantize_rows as host_quantize_rows
from dit_core.weights import rotate
from kernels.int8.codes import launch_codes
from kernels.int8.codes import reference as codes_reference
from kernels.int8.hadamard import hadamard
from kernels.int8 import quant as int8_quant
from kernels.int8.quant import quantize_rows, reference

CASES = [(1, 16, 16), (7, 64, 16), (37, 64, 64), (5, 256, 256), (19, 192, 64)]  # (M, K, g): odd M, one group
FUSED = [{"norm": "rms", "weight": True, "shift": True}, {"norm": "rms", "weight": False, "shift": False},
         {"norm": "layer", "weight": False, "shift": True}, {"act": "swiglu"}, {"act": "gelu_tanh"}]


def rows_like_activations(m: int, k: int, seed: int, device) -> torch.Tensor:
    """bf16 rows with a spread of magnitudes and a few outlier features, as DiT activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g))
    x[:, torch.randint(0, k, (max(1, k // 64),), generator=g)] *= 20
    return x.to(device, torch.bfloat16)


def poisoned_outputs(m: int, k: int, device):
    return (torch.full((m, k), 0x7F, dtype=torch.int8, device=device),
            torch.full((m,), float("nan"), device=device))


def fused_inputs(m: int, k: int, case: dict, seed: int, device, rows: int | str = 3,
                 first_run: int = 20) -> tuple[torch.Tensor, dict]:
    """Activation cases: bf16 rows (the product before the down projection); norm cases: the f32 residual,
    modulated by `rows` modulation rows mapped at random (1: one image, read as a vector by the kernel), or
    "runs": 2 rows, rows below first_run on the first (a packed sequence: row blocks within a run read their
    shared modulation row as vectors, a block across the boundary gathers)."""
    g = torch.Generator().manual_seed(seed)
    width = 2 * k if case.get("act") == "swiglu" else k
    x = torch.randn(m, width, generator=g) * 2
    if "act" in case:
        return x.to(device, torch.bfloat16), {"act": case["act"]}
    row_map = (torch.arange(m) >= first_run).long() if rows == "runs" else torch.randint(0, rows, (m,), generator=g)
    rows = 2 if rows == "runs" else rows
    kw = {"norm": case["norm"], "eps": 1e-5, "row_map": row_map.to(device),
          "scale": (0.3 * torch.randn(rows, k, generator=g)).to(device)}
    if case["weight"]:
        kw["norm_weight"] = (1 + 0.2 * torch.randn(k, generator=g)).to(device)
    if case["shift"]:
        kw["shift"] = (0.1 * torch.randn(rows, k, generator=g)).to(device)
    return x.to(device), kw


def bf16_round64(y: torch.Tensor) -> torch.Tensor:
    """float64 values correctly rounded to bf16 (8 significant bits, ties to even), kept in float64."""
    mant, exp = torch.frexp(y)
    return torch.ldexp(torch.round(mant * 256), exp - 8)


def float64_quantizer(u: torch.Tensor, group: int):
    """Steps 2-5 of the kernel's math, the rotation exact in float64: (codes, scales, exact y, ambiguous)."""
    m, k = u.shape
    u64 = u.double().reshape(m, k // group, group)
    y = (u64 @ hadamard(group, torch.float64).to(u.device)).reshape(m, k)
    yb = bf16_round64(y)
    amax = yb.abs().amax(-1).float()
    scales = (amax / torch.full_like(amax, 127.0)).clamp(min=1e-30)  # rounded once, on CUDA too
    quotients = yb.to(torch.bfloat16) / scales.to(torch.bfloat16)[:, None]
    codes = quotients.round().clamp(-128, 127).to(torch.int8)
    mant, exp = torch.frexp(y)
    frac = mant * 256 - torch.floor(mant * 256)
    to_midpoint = (frac - 0.5).abs() * torch.ldexp(torch.ones_like(y), exp - 8)
    magnitude = u64.abs().sum(-1, keepdim=True).expand(-1, -1, group).reshape(m, k) / math.sqrt(group)
    error_bound = 2.0 ** -17 * magnitude
    return codes, scales, y, to_midpoint <= error_bound


def assert_codes_match_float64(q, s, u, group, max_fraction):
    codes, scales, y, ambiguous = float64_quantizer(u, group)
    bad_rows = s != scales
    near_top = ambiguous & (y.abs() >= y.abs().amax(-1, keepdim=True) * (1 - 2.0 ** -7))
    assert not (bad_rows & ~near_top.any(-1)).any(), "a row scale differs without an ambiguous absmax"
    assert bad_rows.sum() <= max(1, max_fraction * q.shape[0]), f"{int(bad_rows.sum())} row scales differ"
    differ = (q != codes) & ~bad_rows[:, None]
    assert not (differ & ~ambiguous).any(), f"{int((differ & ~ambiguous).sum())} codes differ off a boundary"
    # One bf16 step of a rotated value moves its quotient by up to half a code, and in [64, 128) bf16
    # quotients lie on a grid of 0.5 that rounds half to even: codes may then move by 2.
    assert (q.int() - codes.int()).abs().max() <= 2
    assert differ.sum() <= max(1, max_fraction * q.numel()), f"{int(differ.sum())} of {q.numel()} differ"


def assert_fused_close(q, s, q_ref, s_ref, max_fraction):
    """Fused prologues: the kernel's f32 statistics and transcendentals may move a rotation input by one
    bf16 step (and so a code by up to 2, as in assert_codes_match_float64)."""
    bad_rows = s != s_ref
    assert ((s - s_ref).abs() <= 2.0 ** -7 * s_ref).all()
    assert bad_rows.float().mean() <= max_fraction * 10
    assert ((q.int() - q_ref.int()).abs() <= 2).all()
    assert (q != q_ref).float().mean() <= max_fraction


def test_hadamard_is_the_format_docs():
    for g in (4, 16, 64, 256):
        assert torch.equal(hadamard(g, torch.float64), host_hadamard(g, torch.float64))


@pytest.mark.parametrize("m,k,group", CASES)
def test_reference_equals_host_quantizer(m, k, group):
    x = rows_like_activations(m, k, seed=m + k, device="cpu")
    codes, scales = host_quantize_rows(rotate(x.float(), group).to(torch.bfloat16))
    q, s = reference(x, group)
    assert torch.equal(q, codes) and torch.equal(s, scales.reshape(-1))


# Launches: the default for the input; a program a row block (normed rows' default); two and one programs walking
# the row blocks (plain rows' default walks too).
LAUNCHES = [{}, {"row_programs": 0, "num_stages": 2}, {"row_programs": 2}, {"row_programs": 1, "num_stages": 3}]
LAUNCH_IDS = ["default", "block-a-program", "two-walking", "one-walking"]


@pytest.mark.parametrize("launch", LAUNCHES, ids=LAUNCH_IDS)
@pytest.mark.parametrize("m,k,group", CASES)
def test_plain_kernel(m, k, group, launch, device):
    x = rows_like_activations(m, k, seed=m * k, device=device)
    q, s = quantize_rows(x, group, out=poisoned_outputs(m, k, device), block_m=16, **launch)
    assert not s.isnan().any()
    assert_codes_match_float64(q, s, x, group, max_fraction=0)
    q_ref, s_ref = reference(x, group)
    assert_codes_match_float64(q_ref, s_ref, x, group, max_fraction=0)


@pytest.mark.parametrize("case", FUSED, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("m,k,group", [(37, 64, 16), (19, 128, 64), (5, 512, 256)])
@pytest.mark.parametrize("mod_rows", [3, 1, "runs"])
@pytest.mark.parametrize("launch", LAUNCHES[::2], ids=LAUNCH_IDS[::2])
def test_fused_kernel(m, k, group, case, mod_rows, launch, device):
    x, kw = fused_inputs(m, k, case, seed=m + k, device=device, rows=mod_rows)
    q, s = quantize_rows(x, group, **kw, out=poisoned_outputs(m, k, device), block_m=16, **launch)
    q_ref, s_ref = reference(x, group, **kw)
    assert not s.isnan().any()
    assert_fused_close(q, s, q_ref, s_ref, max_fraction=0.01)


@pytest.mark.parametrize("case", [FUSED[0], FUSED[2]], ids=["rms", "layer"])
@pytest.mark.parametrize("first_run", [32, 20])
def test_row_starts_read_each_blocks_modulation_row(case, first_run, device, monkeypatch):
    """Runs that start on 16-row blocks (row_starts given): each block's first row names its modulation row, no
    gather (HAS_SCALE 3); runs that do not: the gathering kernel (1). Both bit for bit the kernel without the hint."""
    m, k, group = 53, 512, 256
    x, kw = fused_inputs(m, k, case, seed=9, device=device, rows="runs", first_run=first_run)
    kernel, forms = int8_quant._rotate_kernel, []

    class Spy:  # the rotate pass's launches, each form recorded
        def __getitem__(self, grid):
            return lambda *args, **flags: (forms.append(flags["HAS_SCALE"]), kernel[grid](*args, **flags))
    monkeypatch.setattr(int8_quant, "_rotate_kernel", Spy())
    q, s = quantize_rows(x, group, **kw, out=poisoned_outputs(m, k, device), block_m=16, row_starts=(0, first_run))
    q_ref, s_ref = quantize_rows(x, group, **kw, block_m=16)
    assert forms == ([3, 1] if first_run % 16 == 0 else [1, 1])
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert_fused_close(q, s, *reference(x, group, **kw, row_starts=(0, first_run)), max_fraction=0.01)


@pytest.mark.parametrize("m,k,group", [(1, 256, 256), (37, 768, 256), (19, 64, 16)])
def test_codes_launch_equals_its_reference(m, k, group, device):
    """kernels/int8/codes.py alone: rows not a multiple of its 16-row tile, one row, one group, K past one tile."""
    yb = rows_like_activations(m, k, seed=m + k, device=device)
    group_max = yb.float().abs().reshape(m, k // group, group).amax(-1).contiguous()
    codes, scales = poisoned_outputs(m, k, device)
    launch_codes(yb, group_max, codes, scales)
    q_ref, s_ref = codes_reference(yb, group_max)
    assert torch.equal(codes, q_ref) and torch.equal(scales, s_ref)


@pytest.mark.parametrize("exponent", [0, -99, 120])  # scales near 1, near the 1e-30 floor, near bf16's largest / 127
def test_quotient_as_product_with_the_reciprocal(exponent):
    """kernels/int8/codes.py takes bf16(yb / bf16(s)) as bf16(yb * f32(1 / bf16(s))): the same value for every
    finite bf16 yb and every bf16 significand of s (both sides scale by powers of two alike), so the same codes."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    y = every[every.isfinite()]
    s = torch.arange(128, 256, dtype=torch.float32) / 128 * 2.0 ** exponent  # every bf16 significand, exactly
    assert torch.equal(s, s.to(torch.bfloat16).float())
    quotient = (y[None, :] / s[:, None]).to(torch.bfloat16)
    product = (y[None, :] * (1 / s)[:, None]).to(torch.bfloat16)
    in_range = quotient.float().abs() <= 256  # the codes clamp beyond 127.5
    assert torch.equal(quotient[in_range], product[in_range])
    codes = lambda q: q.float().round().clamp(-128, 127)  # noqa: E731
    assert torch.equal(codes(quotient), codes(product))
    # The check can fail: a reciprocal of bf16's 8 bits (error 2^-9, past the 2^-17 margin) gives other values.
    coarse = (1 / s).to(torch.bfloat16).float()
    assert not torch.equal(quotient[in_range], (y[None, :] * coarse[:, None]).to(torch.bfloat16)[in_range])


@pytest.mark.parametrize("m,k,group", [(37, 64, 16), (5, 512, 256)])
def test_given_row_statistics(m, k, group, device):
    """stats= (gated_residual's next_rms): the statistics launch is skipped and those given are used, also as a
    column slice of a wider [2, M'] buffer (the MLP's chunks of rows)."""
    x, kw = fused_inputs(m, k, {"norm": "rms", "weight": True, "shift": True}, seed=m * k, device=device)
    g = torch.Generator().manual_seed(k)
    wide = torch.stack([torch.zeros(m + 9), 0.5 + torch.rand(m + 9, generator=g)]).to(device)
    stats = wide[:, 4:4 + m]
    q, s = quantize_rows(x, group, **kw, stats=stats, out=poisoned_outputs(m, k, device), block_m=16)
    q_ref, s_ref = reference(x, group, **kw, stats=stats)
    assert not s.isnan().any()
    assert_fused_close(q, s, q_ref, s_ref, max_fraction=0.01)
    # The row statistics as the statistics launch computes them give the codes it gives.
    own = torch.stack([torch.zeros(m), 1 / torch.sqrt(x.cpu().pow(2).mean(-1) + kw["eps"])]).to(device)
    q_own, s_own = quantize_rows(x, group, **kw, stats=own, block_m=16)
    assert_fused_close(q_own, s_own, *quantize_rows(x, group, **kw, block_m=16), max_fraction=0.01)
    with pytest.raises(ValueError, match="stats must be"):
        quantize_rows(x, group, **kw, stats=wide)


def test_f32_rows_and_minus_128(device):
    """The residual stream comes in as f32; a negative absmax can quantize to -128 (format doc section 5)."""
    y = torch.zeros(2, 16, dtype=torch.float64)
    y[0, 0], y[1, 0] = -11.0, 11.0  # bf16(11/127) < 11/127, so 11 / it rounds to 127.5 in bf16
    x = (y @ hadamard(16, torch.float64)).float().to(device)  # rotates back to y exactly
    q, s = quantize_rows(x, 16, out=poisoned_outputs(2, 16, device), block_m=16)
    assert q[0, 0] == -128 and q[1, 0] == 127 and (q[:, 1:] == 0).all()
    assert torch.equal(s.cpu(), torch.full((2,), 11.0) / 127)


def test_bad_arguments_raise():
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    for kw in ({"group": 4}, {"group": 32}, {"group": 128}, {"group": 16, "act": "swiglu", "norm": "rms"},
               {"group": 16, "norm": "layer", "norm_weight": torch.ones(64)},
               {"group": 16, "scale": torch.zeros(1, 64)}):
        with pytest.raises(ValueError):
            quantize_rows(x, **kw)


ZIMAGE_ROWS = 4608


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [3840, 10240])
def test_plain_codes_equal_float64_rotation(k):
    x = rows_like_activations(ZIMAGE_ROWS, k, seed=k, device="cuda")
    q, s = quantize_rows(x, 256, out=poisoned_outputs(ZIMAGE_ROWS, k, "cuda"))
    assert_codes_match_float64(q, s, x, 256, max_fraction=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case,k,mod_rows", [(FUSED[0], 3840, 3), (FUSED[2], 3840, 3), (FUSED[3], 10240, 3),
                                             (FUSED[4], 3840, 3), (FUSED[2], 3072, "runs")])
def test_fused_at_zimage_shapes(case, k, mod_rows):
    """Z-Image's shapes, and FLUX.3 Klein's joint-block norm (512 text rows on one modulation row, the image's
    rows on another, plus a boundary inside a row block)."""
    for first_run in (512, 500):
        x, kw = fused_inputs(ZIMAGE_ROWS, k, case, seed=k, device="cuda", rows=mod_rows, first_run=first_run)
        q, s = quantize_rows(x, 256, **kw, out=poisoned_outputs(ZIMAGE_ROWS, k, "cuda"))
        q_ref, s_ref = reference(x, 256, **kw)
        assert_fused_close(q, s, q_ref, s_ref, max_fraction=1e-3)
