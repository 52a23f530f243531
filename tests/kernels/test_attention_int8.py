"""kernels/int8/attention.py: the codes pass against its reference bit for bit (interpreted on the CPU), the
reference's error against f32 attention, the sm_90a build, and the Gluon kernel against the reference on the GPU."""
import math

import pytest
import torch

from conftest import GLUON_BUILD, gluon_builds
from kernels.int8 import attention as ka


def head_rows(m: int, heads: int, seed: int, device, spread: float = 1.0) -> torch.Tensor:
    """Rows [m, heads x 128] bf16 as the blocks' q and k are: each head's 128 values RMS-normed (times `spread`)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, heads, ka.HEAD, generator=g) * (1 + torch.rand(1, heads, ka.HEAD, generator=g))
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * spread
    return x.reshape(m, heads * ka.HEAD).to(torch.bfloat16).to(device)


def f32_attention(q, k, v, heads):
    m = q.shape[0]
    q, k, v = (t.float().reshape(m, heads, ka.HEAD).transpose(0, 1) for t in (q, k, v))
    o = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(ka.HEAD), -1) @ v
    return o.transpose(0, 1).reshape(m, heads * ka.HEAD)


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("m", [1, 63, 130, 257])
@pytest.mark.parametrize("per_row", [True, False])
def test_codes_equal_their_reference(m, per_row, device):
    """Odd row counts (a block past M, one row); outputs poisoned first. Codes reach +-127 and the scales are the
    absmax / 127 of each row (block) and head."""
    x = head_rows(m, 2, seed=m, device=device, spread=3.0)
    blocks = m if per_row else -(-m // ka.BLOCK_N)
    out = (torch.full((m, 2 * ka.HEAD), 0x55, dtype=torch.int8, device=device),
           torch.full((2, blocks), float("nan"), device=device))
    c, s = ka.codes(x, 2, per_row, out=out)
    c_ref, s_ref = ka.codes_reference(x, 2, per_row)
    assert torch.equal(c.cpu(), c_ref.cpu()) and torch.equal(s.cpu(), s_ref.cpu())
    assert c.abs().amax().item() == 127


def test_reference_is_the_exact_attention_where_the_codes_are_exact():
    """Integer rows whose absmax is 127 in every row (q) and block (k) have scales 1: the reference is then the f64
    attention of those rows with p rounded to bf16, which only the rounding of p separates from f64's own."""
    g = torch.Generator().manual_seed(1)
    m, heads = 200, 2
    q, k = (torch.randint(-40, 41, (m, heads * ka.HEAD), generator=g).float() for _ in range(2))
    q[:, ::ka.HEAD] = 127.0  # each row's and block's absmax in each head
    k[:, ::ka.HEAD] = -127.0
    q, k = q / 64, k / 64  # scores of a sane size; codes stay exact (scales 127/64 / 127)
    v = torch.randn(m, heads * ka.HEAD, generator=g).to(torch.bfloat16)
    got = ka.reference(q.to(torch.bfloat16), k.to(torch.bfloat16), v, heads)
    truth = f32_attention(q.double(), k.double(), v.double(), heads)
    assert rel(got, truth) < 4e-3  # bf16 p and output


def test_reference_error_against_f32_attention():
    """On rows as the blocks make them the INT8 scores move the output by about 1% of its size (bf16 attention: 0.2-
    0.6%); a wrong scale or an off-by-one block would move it by tens of percent."""
    m, heads = 300, 2
    q, k, v = (head_rows(m, heads, seed, "cpu", spread) for seed, spread in ((1, 1.5), (2, 1.5), (3, 1.0)))
    err = rel(ka.reference(q, k, v, heads), f32_attention(q, k, v, heads))
    assert 1e-3 < err < 2.5e-2


def test_rows_of_another_shape_or_no_hopper_gpu_say_why():
    x = torch.zeros(4, 2 * ka.HEAD, dtype=torch.bfloat16)
    assert "contiguous bf16" in ka.unusable(x.float(), 2)
    assert "contiguous bf16" in ka.unusable(x, 3)
    assert ka.unusable(x, 2) is not None  # interpreted or on the CPU


BUILD = GLUON_BUILD + """
from kernels.int8 import attention as ka
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
def desc(base, shape, block, dtype):
    return mangle_type(TensorDescriptor(base, shape, [shape[1], 1], block,
                                           gl.NVMMASharedLayout.get_default_for(block, dtype)))
found = {}
for even in (True, False):
    m = 4608 if even else 4608 + 80
    sig = {"q_desc": desc(Codes, [m, 3072], [128, 128], gl.int8), "k_desc": desc(Codes, [m, 3072], [128, 128], gl.int8),
           "v_desc": desc(Rows, [m, 3072], [128, 128], gl.bfloat16), "sq_ptr": "*fp32", "sk_ptr": "*fp32",
           "o_ptr": "*bf16", "M": "i32", "H": "i32", "factor": "fp32"}
    consts = {"EVEN": even, "STAGES": ka.STAGES}
    src = GluonASTSource(ka._attention_kernel, {**sig, **{k: "constexpr" for k in consts}}, consts)
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    found[f"even {even}"] = {
        "mma": sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))), "int_to_float": ptx.count("cvt.rn.f32.s32"),
        "waits": sorted(set(re.findall(r"wgmma.wait_group.sync.aligned\\s+(\\d+)", ptx))),
        "shared": built.metadata.shared,
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg.(?:inc|dec).sync.aligned.u32\\s+(\\d+)", ptx)))}
print(json.dumps(found))
"""


def test_builds_for_the_h200_with_integer_scores_and_the_softmax_under_the_values_product():
    found = gluon_builds(BUILD)
    assert len(found) == 2
    for name, built in found.items():
        assert built["mma"] == ["wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
                                "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"], name
        assert "1" in built["waits"], name  # q k^T awaited with the p v behind it still in flight
        assert built["int_to_float"] == 0, name  # the scores made f32 by an add, not the quarter-rate cvt
        assert "24" in built["setmaxnreg"], name  # the producer warp's registers handed to the warpgroups
        assert built["shared"] <= 227 * 1024, name


@pytest.mark.gpu
@pytest.mark.parametrize("m, heads", [(4608, 24), (4608, 30), (512, 24), (4096 + 80, 2)])
def test_kernel_against_reference(m, heads):
    """Klein's and Z-Image's joint rows, Klein's text rows, and rows past a whole block."""
    q, k, v = (head_rows(m, heads, seed, "cuda", spread) for seed, spread in ((1, 1.5), (2, 1.5), (3, 1.0)))
    assert ka.unusable(q, heads) is None
    got = ka.attention_int8(q, k, v, heads)
    want, truth = ka.reference(q.cpu(), k.cpu(), v.cpu(), heads), f32_attention(q, k, v, heads).cpu()
    assert rel(got.cpu(), want) < 1e-2  # p rounded to bf16 against the running maximum, not the final one
    assert rel(got.cpu(), truth) < rel(want, truth) + 2e-3  # the online softmax no worse than the reference's math


def test_blocks_attention_hands_the_qkv_rows_over_where_usable(monkeypatch):
    """kernels.attention.attention gives the kernel the QKV's rows [M, heads x 128] themselves (views, not copies)
    where q, k, v view them and the kernel is usable; groups and batched heads stay with SDPA."""
    from kernels import attention
    calls = []
    shape_only = ka.unusable  # its answer on the rows' shape and dtype; the machine's taken as a Hopper GPU
    monkeypatch.setattr(ka, "unusable", lambda r, h: (shape_only(r, h) or "").startswith("rows") or None)
    monkeypatch.setattr(ka, "attention_int8", lambda q, k, v, heads: calls.append((q, k, v, heads)) or q)
    qkv = torch.randn(3, 256, 2 * ka.HEAD).to(torch.bfloat16)  # the QKV's output: [3, M, heads x D]
    q, k, v = (t.reshape(256, 2, ka.HEAD).transpose(0, 1).unsqueeze(0) for t in qkv)  # head_norm_rope's views
    assert attention.attention(q, k, v).shape == (256, 2 * ka.HEAD) and not calls  # not asked for: SDPA
    out = attention.attention(q, k, v, int8_scores=True)
    assert len(calls) == 1 and calls[0][3] == 2 and out.data_ptr() == qkv[0].data_ptr()
    assert all(r.data_ptr() == t.data_ptr() and r.shape == (256, 2 * ka.HEAD) for r, t in zip(calls[0], qkv))
    assert attention.attention(q, k, v, group=128, int8_scores=True).shape == (256, 2 * ka.HEAD)  # two groups
    assert attention.attention(*(t.float() for t in (q, k, v)), int8_scores=True).dtype == torch.float32  # f32
    assert len(calls) == 1


def test_int8_scores_for_the_families_whose_options_ask_with_int8_linears_only():
    """FLUX.3 Klein's INT8 blocks take INT8 scores (its recipe's options); its BF16 blocks (the precise path) and
    other families do not."""
    from dataclasses import replace

    from dit_core.gpu import block as block_gpu
    from dit_core.families.flux3_klein import Flux3Klein
    from dit_core.families.z_image import ZImage
    klein, z_image = Flux3Klein.default_options(), ZImage.default_options()
    int8 = block_gpu.GpuLinear(torch.zeros(768, 256, dtype=torch.int8), torch.ones(768), None, 256)
    bf16 = replace(int8, weight=torch.zeros(768, 256, dtype=torch.bfloat16), scale=None)
    assert block_gpu._int8_scores(int8, klein) and not block_gpu._int8_scores(bf16, klein)
    assert not block_gpu._int8_scores(int8, z_image)


class _Raising:
    """Stands in for the Gluon kernel: its launch raises `error` (a build this Triton cannot make)."""
    def __init__(self, error):
        self.error = error

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise self.error
        return launch


def test_a_kernel_this_triton_cannot_build_leaves_attention_on_sdpa(monkeypatch):
    """A build error (here: out of shared memory) is kept in UNBUILT and said by unusable; the blocks' attention
    then runs SDPA, with the same result as without INT8 scores."""
    pytest.importorskip("triton.experimental.gluon")
    import triton
    from kernels import attention
    monkeypatch.setattr(ka, "UNBUILT", [])
    monkeypatch.setattr(ka, "_attention_kernel", _Raising(triton.runtime.errors.OutOfResources(300000, 232448,
                                                                                                "shared memory")))
    shape_only = ka.unusable  # the machine taken as a Hopper GPU until the build fails
    monkeypatch.setattr(ka, "unusable", lambda r, h: (shape_only(r, h) or "").startswith(("rows", "not built"))
                        or None)
    qkv = head_rows(256, 2, seed=4, device="cpu").reshape(1, 256, 2 * ka.HEAD).repeat(3, 1, 1)
    q, k, v = (t.reshape(256, 2, ka.HEAD).transpose(0, 1).unsqueeze(0) for t in qkv)
    out = attention.attention(q, k, v, int8_scores=True)
    assert len(ka.UNBUILT) == 1 and "OutOfResources" in ka.UNBUILT[0]
    assert shape_only(qkv[0], 2).startswith("not built: Triton")
    assert torch.equal(out, attention.attention(q, k, v))  # SDPA's, as without INT8 scores
    assert torch.equal(attention.attention(q, k, v, int8_scores=True), out) and len(ka.UNBUILT) == 1  # not retried
