"""kernels/attention_8bit.py: the codes passes and the attention kernel against reference() (Triton's CPU interpreter
here; its tl.dot takes e4m3 operands, its f32 -> e4m3 cast is rounded exactly by the kernel's own _e4m3 there), the
reference's error against f32 attention at H3-like rows, the sm_90a build, and the kernel on the GPU."""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_within_one_bf16_step, compiler_env, rel_err
from kernels import attention_8bit as k8

D = k8.HEAD


def h3_rows(m: int, heads: int, seed: int, device="cpu", gains: float = 0.1, offset: float = 0.0) -> torch.Tensor:
    """Rows [m, heads x 128] bf16 as H3's q and k are (reference/families/minimax_h3.md): each head RMS-normed with
    gains ~1 (1 + gains * N(0, 1) a channel), then split-half rotary on channels 0..95 (3 axes x 16 frequencies,
    theta 10000) at positions of a (t, h, w) grid; offset: a bias added to every row (what smoothing removes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, heads, D, generator=g)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + gains * torch.randn(D, generator=g))
    grid = torch.meshgrid(torch.arange(8), torch.arange(-(-m // 128)), torch.arange(16), indexing="ij")
    pos = torch.stack(grid, -1).reshape(-1, 3)[:m].float()
    angle = (pos[:, :, None] * 10000.0 ** (-torch.arange(16) / 16)).reshape(m, 1, 48)
    a, b = x[..., :48], x[..., 48:96]
    x = torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin(), x[..., 96:]], -1)
    x = x + offset * torch.randn(1, heads, D, generator=g)
    return x.reshape(m, heads * D).to(torch.bfloat16).to(device)


def f32_attention(q, k, v, heads):
    qh, kh, vh = (k8.heads_view(t, heads).float()[None] for t in (q, k, v))
    return F.scaled_dot_product_attention(qh, kh, vh)[0].transpose(0, 1).reshape(q.shape[0], -1)


def qkv(m, heads, device="cpu", offset=0.0):
    """H3-like q, k and random v (v with a bias along the rows when offset)."""
    g = torch.Generator().manual_seed(3)
    v = (torch.randn(m, heads * D, generator=g) + offset * torch.randn(heads * D, generator=g)).to(torch.bfloat16)
    return h3_rows(m, heads, 1, device), h3_rows(m, heads, 2, device, offset=offset), v.to(device)


@pytest.mark.parametrize("m", [160, 40])
def test_codes_equal_their_reference(m, device):
    """160 rows: two whole key blocks and a ragged third, then a block past M (M' = 256); 40: one ragged block.
    Codes and scales bit for bit, step 4's offset up to the order of its sums; codes past M are zeros; q codes
    reach +-127, v's +-448."""
    q, k, v = qkv(m, 2, device, offset=1.0)
    cq, sq, ck, sk, cv, sv, ov, rows = k8.operands(q, k, v, 2)
    views = [k8.heads_view(t, 2) for t in (q, k, v)]
    want = k8.codes_reference(*views, *k8.smoothing(*views[1:]))
    mp = cv.shape[1]
    got = (cq.view(2, mp, D)[:, :m], sq.view(2, mp)[:, :m], ck.view(2, mp, D)[:, :m], sk.view(2, -1)[:, :-(-m // 64)],
           cv.view(2, D, mp)[:, :, :m], sv)
    for name, a, b in zip(("cq", "sq", "ck", "sk", "cv", "sv"), got, want):
        assert torch.equal(a.cpu().view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a.cpu(),
                           b.cpu().view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b.cpu()), name
    torch.testing.assert_close(ov.cpu(), want[6].cpu(), rtol=1e-5, atol=1e-6)  # the error sums: f32, in blocks
    assert not cq.view(2, mp, D)[:, m:].any() and not ck.view(2, mp, D)[:, m:].any()
    assert not cv.view(2, D, mp)[:, :, m:].float().any() and rows == m
    assert cq.abs().amax().item() == 127 and cv.float().abs().amax().item() == 448


def test_e4m3_rounding_is_the_nearest_ties_to_even(device):
    """_e4m3 against torch's cast (nearest, ties to even) at ties, subnormals (step 2^-9), 448 and random values."""
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, y_ptr, N: tl.constexpr):
        at = tl.arange(0, N)
        tl.store(y_ptr + at, k8._e4m3(tl.load(x_ptr + at)))

    g = torch.Generator().manual_seed(0)
    ties = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 0.0029296875, 2.0 ** -10, 3 * 2.0 ** -10, 0.0146484375,
                         0.01513671875, 447.99, 448.0, 0.0, 232.0, 240.0, 2.0 ** -6, 2.0 ** -6 - 2.0 ** -10])
    x = torch.cat([ties, -ties, torch.randn(4096 - 64, generator=g) * 20, torch.rand(32, generator=g) * 0.02])
    y = torch.empty(4096, dtype=torch.float8_e4m3fn, device=device)
    cast[(1,)](x.to(device), y, N=4096)
    assert torch.equal(y.cpu().view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("m, heads, block_n", [(160, 2, 64), (40, 1, 64), (160, 1, 128)])
def test_kernel_equals_reference(m, heads, block_n, device):
    """Rows with a ragged last key block (and a row block past M); the same rows as [1, heads, M, D] views (what
    kernels/head_norm_rope.py hands attention) and as a contiguous [1, heads, M, D]. Equal up to the f32 sums'
    order: within one bf16 step."""
    q, k, v = qkv(m, heads, device, offset=0.5)
    want = k8.reference(q.cpu(), k.cpu(), v.cpu(), heads, block_n)
    got = k8.launch(*k8.operands(q, k, v, heads, block_n), block_n=block_n)
    assert got.shape == (m, heads * D) and got.dtype == torch.bfloat16
    assert_within_one_bf16_step(got.cpu(), want)
    views = [t.unflatten(1, (heads, D)).transpose(0, 1)[None] for t in (q, k, v)]
    assert torch.equal(k8.attention_8bit(*views), got) if block_n == k8.BLOCK_N else True
    assert torch.equal(k8.attention_8bit(*(t.contiguous() for t in views)), k8.attention_8bit(q, k, v, heads))


def test_reference_error_against_f32_attention():
    """At H3-like rows (1024 keys) the 8-bit products move the output by 3.3% of its size (e4m3 p ~2.4%, e4m3 v
    ~2.0% after step 4's offset, INT8 scores ~1.1%); bf16 attention's p moves it by ~0.23%. A wrong scale or block
    would move it by tens of percent."""
    q, k, v = qkv(1024, 2)
    err = rel_err(k8.reference(q, k, v, 2), f32_attention(q, k, v, 2))
    assert 0.03 < err < 0.045, err


def test_smoothing_keeps_a_bias_along_the_rows_out_of_the_codes(monkeypatch):
    """k and v with a bias shared by the rows (3x their spread in k, 1x in v): with step 0 the error of o less v's
    bias (what the rows' own values make) is 4.1% (the unbiased rows' ~3.3% and o's bf16 rounding at the bias's
    size); without it (means 0, av = max |v|) k's block scales and v's codes carry the bias: 5.7%."""
    g = torch.Generator().manual_seed(5)
    q, k = h3_rows(512, 2, 1), h3_rows(512, 2, 2, offset=3.0)
    bias = torch.randn(2 * D, generator=g)
    v = (torch.randn(512, 2 * D, generator=g) + bias).bfloat16()
    truth = f32_attention(q, k, v, 2) - bias
    with_step_0 = rel_err(k8.reference(q, k, v, 2).float() - bias, truth)

    def no_smoothing(k, v):
        return torch.zeros(k.shape[0], D), torch.zeros(k.shape[0], D), v.float().abs().amax(1)
    monkeypatch.setattr(k8, "smoothing", no_smoothing)
    without = rel_err(k8.reference(q, k, v, 2).float() - bias, truth)
    assert with_step_0 < 0.05 and without > with_step_0 + 0.01, (with_step_0, without)


def test_bad_shapes_say_what_to_pass():
    x = torch.zeros(8, 2 * D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"rows \[M, heads x 128\]"):
        k8.attention_8bit(x, x, x)  # rows without heads
    with pytest.raises(ValueError, match="differ in shape"):
        k8.operands(x, x, x[:4], 2)
    assert "floating point" in k8.unusable(x.to(torch.int8))
    assert "[1, heads, M > 0, 128]" in k8.unusable(x) and "[1, heads" in k8.unusable(torch.zeros(2, 2, 8, D))
    assert k8.unusable(torch.zeros(1, 2, 8, D)) is None  # interpreted here; on the GPU: a Hopper one


BUILD = """
import json, re, sys
import triton
from triton.compiler import ASTSource
import sm90_builds
from kernels import attention_8bit as k8
found = {}
for bm, bn, warps, stages in ((128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)):
    sig = {"q_desc": f"tensordesc<i8[{bm}, 128]>", "k_desc": f"tensordesc<i8[{bn}, 128]>",
           "v_desc": f"tensordesc<fp8e4nv[128, {bn}]>", "sq_ptr": "*fp32", "sk_ptr": "*fp32", "sv_ptr": "*fp32",
           "ov_ptr": "*fp32", "o_ptr": "*bf16", "M": "i32", "MP": "i32", "H": "i32", "factor": "fp32"}
    consts, launch = {"BLOCK_M": bm, "BLOCK_N": bn, "D": 128}, {"num_warps": warps, "num_stages": stages}
    ptx = triton.compile(ASTSource(k8._attention_kernel, {**sig, **{k: "constexpr" for k in consts}}, consts),
                         target=sm90_builds._target(), options=launch).asm["ptx"]
    found[f"{bm} {bn} {warps} {stages}"] = {
        "mma": sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))), "int_to_float": ptx.count("cvt.rn.f32.s32"),
        "to_e4m3": sorted(set(re.findall(r"cvt[.\\w]*e4m3x2.f32", ptx))),
        **sm90_builds.resources(k8._attention_kernel, sig, consts, launch)}
print(json.dumps(found))
"""


def test_builds_for_the_h200_with_both_products_on_8_bit_wgmma():
    """Compiled for sm_90a here (no GPU): q k^T on the s8 wgmma, p v on the e4m3 one, p rounded by cvt.rn.satfinite,
    the scores made f32 without the int-to-float instruction, and no spills at the bench's tiles."""
    done = subprocess.run([sys.executable, "-c", BUILD], env=compiler_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, built in found.items():
        bn = name.split()[1]
        assert built["mma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3",
                                f"wgmma.mma_async.sync.aligned.m64n{bn}k32.s32.s8.s8"], name
        assert built["to_e4m3"] == ["cvt.rn.satfinite.e4m3x2.f32"] and built["int_to_float"] == 0, name
        assert built["spill stores"] == 0 and built["shared"] <= 227 * 1024, name


@pytest.mark.gpu
@pytest.mark.parametrize("m, heads", [(15911, 56), (4608, 24), (4096 + 80, 2)])
def test_kernel_against_reference_on_the_gpu(m, heads):
    """H3's rows, Klein's joint rows, rows past a whole block. The GPU's fused multiply-adds and exp2 move p by an
    e4m3 step at times, so not bit for bit; the error against f32 is the reference's."""
    q, k, v = qkv(m, heads, "cuda", offset=0.5)
    assert k8.unusable(k8.heads_view(q, heads)[None]) is None
    got = k8.attention_8bit(q, k, v, heads)
    want, truth = k8.reference(q, k, v, heads), f32_attention(q, k, v, heads)
    assert rel_err(got, want) < 1e-2
    assert rel_err(got, truth) < rel_err(want, truth) + 2e-3
    assert rel_err(got, truth) < 0.045


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["128x64x8x3", "64x64x4x3", "128x128x8x2", "64x128x4x2"])
def test_bench_tiles_against_reference_on_the_gpu(tile):
    """Each tile bench/bench_attention.py times (BLOCK_M x BLOCK_N x warps x stages) at Klein's joint rows plus a
    ragged block: the reference of its key blocks (BLOCK_N rows of k a scale)."""
    bm, bn, warps, stages = (int(x) for x in tile.split("x"))
    q, k, v = qkv(4608 + 40, 24, "cuda", offset=0.5)
    got = k8.launch(*k8.operands(q, k, v, 24, bn), block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)
    assert rel_err(got, k8.reference(q, k, v, 24, bn)) < 1e-2


def test_the_attention_op_takes_it_when_asked(device):
    """kernels/attention.py with eight_bit (Options.attention_8bit in a block whose QKV is INT8): this kernel where
    it takes the rows, one group of [1, heads, M, D]; several groups go to SDPA as before."""
    from kernels import attention
    q, k, v = qkv(160, 2, device)
    views = [t.unflatten(1, (2, D)).transpose(0, 1)[None] for t in (q, k, v)]
    assert torch.equal(attention.attention(*views, eight_bit=True), k8.attention_8bit(*views))
    grouped = attention.attention(*views[:1] * 3, group=32, eight_bit=True)
    assert torch.equal(grouped, attention.attention(*views[:1] * 3, group=32))
