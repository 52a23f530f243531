"""kernels/int8/linear_hopper.py: built for the H200 in CI (no interpreter runs Gluon: the build must split the warps
into a producer and two consumer warpgroups and keep an integer wgmma group in flight), its launcher's boxes and its
fallback to Triton where it cannot be built checked on the CPU, and on the GPU equal bit for bit to the Triton
kernels it stands in for (int8_linear's three forms, qkv_rope_linear) and to their references (pytest -m gpu)."""
import pytest
import torch
from conftest import GLUON_BUILD, assert_within_one_bf16_step, gluon_builds

from kernels import Choices

BUILD = GLUON_BUILD + """
from kernels.int8 import linear_hopper as kh
t = kh.TILE
def desc(base, shape, block, dtype):
    strides = [shape[1] * shape[2], shape[2], 1] if len(shape) == 3 else [shape[1], 1]
    return mangle_type(kh.TensorDescriptor(base, shape, strides, block,
                                           gl.NVMMASharedLayout.get_default_for(block, dtype)))
bm, bn, bk = t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"]
pointers = {name: "*fp32" for name in ("sx_ptr", "sw_ptr", "bias_ptr", "gate_ptr", "norm_ptr", "cos_ptr", "sin_ptr")}
found = {}
for name, form, out in (("bf16 rows", 0, desc(Rows, [4608, 3840], [bm, bn], gl.bfloat16)),
                        ("GELU rows turned", 0, desc(Rows, [4608, 3840], [bm, bn], gl.bfloat16)),
                        ("gated", 1, desc(Residual, [4608, 3840], [bm, bn // 2], gl.float32)),
                        ("gated, with an addend", 1, desc(Residual, [4608, 3840], [bm, bn // 2], gl.float32)),
                        ("swiglu", 2, desc(Rows, [4608, 10240], [bm, bn // 2], gl.bfloat16)),
                        ("swiglu, rows turned", 2, desc(Rows, [4608, 10240], [bm, bn // 2], gl.bfloat16)),
                        ("qkv + head norm + rotary", 3, desc(Rows, [3, 4608, 3840], [1, bm, bn], gl.bfloat16)),
                        ("qkv, its rotary made from angles", 3, desc(Rows, [3, 4608, 3840], [1, bm, bn], gl.bfloat16)),
                        ("qkv, v turned", 3, desc(Rows, [3, 4608, 3840], [1, bm, bn], gl.bfloat16))):
    a_desc = desc(Codes, [4608, 3840], [bm, bk], gl.int8)
    addend = desc(Rows, [4608, 3840], [bm, bn // 2], gl.bfloat16) if "addend" in name else out
    sig = {"a_desc": a_desc, "b_desc": desc(Codes, [3840, 3840], [bn, bk], gl.int8), "out_desc": out,
           "add_desc": addend, **pointers,
           "map_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "HD": "i32",
           "eps": "fp32"}
    consts = {"FORM": form, "HAS_BIAS": True, "ONE_GATE_ROW": False, "HAS_ADDEND": "addend" in name,
              "HAS_NORM": True, "D": 128,
              "ANGLES": kh.axis_ends((16, 32, 48)) if "angles" in name else 0, "TURN": "turned" in name,
              "GELU": "GELU" in name,
              "GROUP_M": t["GROUP_M"], "STAGES": t["SWIGLU_STAGES" if form == 2 else "STAGES"]}
    src = GluonASTSource(kh._int8_linear_hopper_kernel, {**sig, **{k: "constexpr" for k in consts}}, consts)
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    found[name] = {"mma": sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))),
                   "waits": sorted(set(re.findall(r"wgmma.wait_group.sync.aligned\\s+(\\d+)", ptx))),
                   "setmaxnreg": sorted(set(re.findall(r"setmaxnreg.(?:inc|dec).sync.aligned.u32\\s+(\\d+)", ptx))),
                   "shared": built.metadata.shared, "cos": ptx.count("cos.approx"),
                   "shuffles": ptx.count("shfl.sync.bfly")}
print(json.dumps(found))
"""


def test_builds_for_the_h200_with_a_producer_warp_two_consumers_and_an_integer_mma_in_flight():
    found = gluon_builds(BUILD)
    assert len(found) == 9
    for name, built in found.items():
        assert built["mma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"], name
        assert "1" in built["waits"], name  # one group in flight across K steps
        assert "24" in built["setmaxnreg"], name  # the producer warp's registers handed to the warpgroups
        assert "224" in built["setmaxnreg"], name  # the second consumer warpgroup's (ping-pong)
        assert built["shared"] <= 227 * 1024, name  # the H200's shared memory a block
        assert (built["cos"] > 0) == ("angles" in name), name  # cos and sin on the MUFU, not read from tables
    # v and GELU's rows turned along the digit its threads hold in registers, SwiGLU's rows along two: no shuffle, no
    # layout conversion through shared memory
    for turned, plain in (("qkv, v turned", "qkv + head norm + rotary"), ("swiglu, rows turned", "swiglu"),
                          ("GELU rows turned", "bf16 rows")):
        assert found[turned]["shuffles"] == found[plain]["shuffles"], turned
        assert found[turned]["shared"] == found[plain]["shared"], turned


class _FakeKernel:
    """Stands in for the Gluon kernel: records each launch's grid, arguments and keywords, and raises `error` (a
    build that runs out of shared memory, a launch's own failure) where one is given."""
    def __init__(self, error=None):
        self.error, self.launches = error, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            if self.error is not None:
                raise self.error
        return launch


def test_the_launcher_gives_each_form_its_boxes_and_ring():
    """The launcher's side of each form, on the CPU (tensor descriptors read only shapes, strides and addresses): the
    output's TMA box, the ring's stages, a program an SM at most, the rotary tables only for the fused QKV."""
    pytest.importorskip("triton.experimental.gluon")
    from kernels.int8 import linear_hopper as kh
    m, k, n = 300, 256, 384  # 3 x 3 tiles of 128; the CPU counts 4 SMs (int8_tiles.sm_count)
    q, w = torch.zeros(m, k, dtype=torch.int8), torch.zeros(n, k, dtype=torch.int8)
    s_x, s_w, rows = torch.ones(m), torch.ones(n), torch.zeros(m, 64)
    gated = {"gate": torch.ones(1, n), "row_map": torch.zeros(m, dtype=torch.long)}
    rope = {"cos": rows, "sin": rows, "heads_d": 128, "head": 128, "norms": torch.ones(2, 128)}
    cases = [(kh.BF16, torch.empty(m, n, dtype=torch.bfloat16), {}, [128, 128], 5),
             (kh.GATED, torch.zeros(m, n), gated, [128, 64], 5),
             (kh.SWIGLU, torch.empty(m, n // 2, dtype=torch.bfloat16), {}, [128, 64], 6),
             (kh.QKV_ROPE, torch.empty(3, m, 128, dtype=torch.bfloat16), rope, [1, 128, 128], 5)]
    for form, out, extra, box, stages in cases:
        recorder = _FakeKernel()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kh, "_int8_linear_hopper_kernel", recorder)
            patch.setattr(kh, "UNBUILT", {})
            assert kh.launch(q, s_x, w, s_w, None, out, form, **extra) is True
        (grid, args, kwargs), = recorder.launches
        assert grid == (4,) and kwargs["FORM"] == form and kwargs["STAGES"] == stages, form
        assert list(args[2].block_shape) == box and args[2].base is out, form
        assert (args[10] is rows and args[11] is rows) == (form == kh.QKV_ROPE), form  # the rotary tables
        assert kwargs["ANGLES"] == 0 and kwargs["HAS_NORM"] == (form == kh.QKV_ROPE), form
    # The gated form asked for the next norm's parts writes them where the QKV reads its norm gains.
    parts, recorder = torch.empty(2, n // kh.PART_COLUMNS, m), _FakeKernel()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kh, "_int8_linear_hopper_kernel", recorder)
        patch.setattr(kh, "UNBUILT", {})
        assert kh.launch(q, s_x, w, s_w, None, torch.zeros(m, n), kh.GATED, **gated, parts=parts)
    (_, args, kwargs), = recorder.launches
    assert args[9] is parts and kwargs["HAS_NORM"] and kh.PART_COLUMNS == kh.TILE["BLOCK_N"] // 2
    # The fused QKV given the angles' factors reads those instead of the tables.
    positions, freqs, recorder = torch.zeros(m, 4), torch.ones(2, 64), _FakeKernel()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kh, "_int8_linear_hopper_kernel", recorder)
        patch.setattr(kh, "UNBUILT", {})
        assert kh.launch(q, s_x, w, s_w, None, torch.empty(3, m, 128, dtype=torch.bfloat16), kh.QKV_ROPE,
                         **rope, angles=(positions, freqs, (16, 32, 48)))
    (_, args, kwargs), = recorder.launches
    assert args[10] is positions and args[11] is freqs and kwargs["ANGLES"] == 1 << 24 | 16 | 32 << 8 | 48 << 16
    with pytest.raises(ValueError, match="nondecreasing"):
        kh.launch(q, s_x, w, s_w, None, torch.empty(3, m, 128, dtype=torch.bfloat16), kh.QKV_ROPE, **rope,
                  angles=(positions, freqs, (32, 16, 48)))


def test_unusable_names_the_operands_then_the_machine():
    """TMA's 16-byte rows and bases asked of the operands on any machine, then the machine's answer."""
    from kernels.int8 import linear_hopper as int8_linear_hopper
    q, out = torch.zeros(8, 64, dtype=torch.int8), torch.zeros(8, 32, dtype=torch.bfloat16)
    tma = "TMA needs 16-byte rows and bases"
    assert int8_linear_hopper.unusable(torch.zeros(8, 72, dtype=torch.int8)[:, 4:68], out, 64) == tma  # q strided
    assert int8_linear_hopper.unusable(torch.zeros(8, 40, dtype=torch.int8), out, 64) == tma  # K 40
    assert int8_linear_hopper.unusable(q, out, 24) == tma  # an output row of 24 bytes
    assert int8_linear_hopper.unusable(q, out.t(), 64) == tma  # out not contiguous
    assert int8_linear_hopper.unusable(q, out, 64) in ("off, no Gluon, or interpreted", "not a Hopper GPU (wgmma)")


def test_a_kernel_this_triton_cannot_build_falls_back_to_triton_once(monkeypatch, device):
    """Where Gluon's API or the card's limits refuse the build, the call runs the Triton kernel (equal to the
    reference), the reason is kept, and later calls do not try the build again; a launch's own error still raises."""
    pytest.importorskip("triton.experimental.gluon")
    import triton

    from test_int8_linear import SMALL_TILES, operands

    from kernels.int8 import linear as int8_linear_module
    from kernels.int8 import linear_hopper as int8_linear_hopper
    from kernels.int8.linear import int8_linear, reference
    ops, _, _ = operands(37, 48, 96, seed=5, device=device)
    monkeypatch.setattr(int8_linear_module, "fixed_tiles", lambda *args: dict(SMALL_TILES))  # (no autotuning here)
    fake = _FakeKernel(triton.runtime.errors.OutOfResources(300000, 232448, "shared memory"))
    monkeypatch.setattr(int8_linear_hopper, "_int8_linear_hopper_kernel", fake)
    monkeypatch.setattr(int8_linear_hopper, "unusable", lambda *args: None)
    monkeypatch.setattr(int8_linear_hopper, "UNBUILT", {})
    for _ in range(2):
        assert torch.equal(int8_linear(**ops), reference(**ops))
    assert len(fake.launches) == 1 and "OutOfResources" in int8_linear_hopper.UNBUILT[int8_linear_hopper.BF16]
    monkeypatch.setattr(int8_linear_hopper, "_int8_linear_hopper_kernel", _FakeKernel(RuntimeError(
        "Triton Error [CUDA]: an illegal memory access was encountered")))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        int8_linear(**ops, swiglu=True)


hopper_gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs a Hopper GPU")
# (M, N, K): Z-Image's out and w2, Klein's MLP output; rows not a multiple of the tile, one row, K of one 16-byte
# step past the tile, N not a multiple of the tile.
SHAPES = [(4608, 3840, 3840), (4608, 3840, 10240), (4096, 3072, 12288), (130, 272, 272), (1, 144, 144),
          (257, 1024, 128)]


def _both(monkeypatch, call):
    """call(choices) through the Hopper kernel (it must have launched), then through the Triton kernels (it off)."""
    from kernels.int8 import linear_hopper as int8_linear_hopper
    launches, launch = [], int8_linear_hopper.launch
    monkeypatch.setattr(int8_linear_hopper, "launch",
                        lambda *a, **kw: launches.append(launch(*a, **kw)) or launches[-1])
    hopper = call(Choices(hopper_gemm=True))
    assert launches and all(launches), f"the Hopper kernel did not take the call: {int8_linear_hopper.UNBUILT}"
    return hopper, call(Choices(hopper_gemm=False))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_bf16_rows_and_swiglu(m, n, k, with_bias, monkeypatch):
    from test_int8_linear import operands

    from kernels.int8.linear import int8_linear, reference
    ops, _, _ = operands(m, n, k, seed=m + n + k, device="cuda")
    ops["bias"] = ops["bias"] if with_bias else None
    poisoned = lambda cols: torch.full((m, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    hopper, triton_rows = _both(monkeypatch, lambda c: int8_linear(choices=c, **ops, out=poisoned(n)))
    assert torch.equal(hopper, triton_rows) and torch.equal(hopper, reference(**ops))
    hopper, triton_rows = _both(monkeypatch, lambda c: int8_linear(choices=c, **ops, out=poisoned(n // 2), swiglu=True))
    assert torch.equal(hopper, triton_rows)
    assert_within_one_bf16_step(hopper, reference(**ops, swiglu=True))  # torch's exp against the GPU's
    for turn in (False, True) if n % 64 == 0 else (False,):  # GELU's rows (turned: in the epilogue's registers)
        hopper, triton_rows = _both(monkeypatch, lambda c: int8_linear(choices=c, **ops, out=poisoned(n),
                                                                     gelu_tanh=True, turn_hidden=turn))
        assert torch.equal(hopper, triton_rows), turn
        allowance = 0.0  # (turned: a few f32 ulps of each of a 64-block's values, where the turn's sums cancel)
        if turn:
            block_max = reference(**ops, gelu_tanh=True).float().abs().reshape(m, -1, 64).amax(-1, keepdim=True)
            allowance = 2.0 ** -18 * block_max.expand(m, n // 64, 64).reshape(m, n)
        assert_within_one_bf16_step(hopper, reference(**ops, gelu_tanh=True, turn_hidden=turn), allowance=allowance)
    if n // 2 % 64 == 0:  # SwiGLU's rows turned in the epilogue's registers (turn_hidden), as Triton's kernel does
        hopper, triton_rows = _both(monkeypatch, lambda c: int8_linear(choices=c, **ops, out=poisoned(n // 2), swiglu=True,
                                                                     turn_hidden=True))
        assert torch.equal(hopper, triton_rows)
        # torch's exp and division against the GPU's, a few f32 ulps of each of a 64-block's values: where the turn's
        # sums cancel, that is more than a bf16 step of the sum
        block_max = reference(**ops, swiglu=True).float().abs().reshape(m, -1, 64).amax(-1, keepdim=True)
        assert_within_one_bf16_step(hopper, reference(**ops, swiglu=True, turn_hidden=True),
                                    allowance=2.0 ** -18 * block_max.expand(m, n // 128, 64).reshape(m, n // 2))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("gate_rows", [1, "runs", 3])
@pytest.mark.parametrize("with_addend", [False, True])
def test_gated_residual(m, n, k, gate_rows, with_addend, monkeypatch):
    from test_int8_linear import operands

    from kernels.int8.linear import int8_linear_gated, reference
    ops, _, gated = operands(m, n, k, seed=m * n + k, device="cuda")
    if gate_rows == "runs":  # a packed sequence: rows 0-199 on gate row 0, the rest on row 1
        gated["gate"], gated["row_map"] = gated["gate"][:2], (torch.arange(m, device="cuda") >= 200).long()
    else:
        gated["gate"], gated["row_map"] = gated["gate"][:gate_rows], gated["row_map"] % gate_rows
    start = gated.pop("residual")
    gated["addend"] = torch.randn(m, n, device="cuda").to(torch.bfloat16) if with_addend else None
    expected = reference(**ops, **gated, residual=start.clone())
    hopper, triton_rows = _both(monkeypatch, lambda c: int8_linear_gated(choices=c, **ops, **gated, residual=start.clone()))
    assert torch.equal(hopper, triton_rows) and torch.equal(hopper, expected)
    # The next norm's statistics from the epilogue's parts: the updated rows bit for bit, their statistics within
    # a few f32 ulps of the two-pass ones (kernels/int8/row_stats.py): 1/sqrt(.) relatively, the means (near 0 here)
    # absolutely.
    from kernels.int8.row_stats import reference as stats_reference
    for norm in ("layer", "rms"):
        stats = torch.full((2, m), float("nan"), device="cuda")
        rows = int8_linear_gated(**ops, **gated, residual=start.clone(), next_norm=(stats, norm, 1e-6))
        assert torch.equal(rows, expected)
        torch.testing.assert_close(stats, stats_reference(expected, norm, 1e-6), rtol=4e-6, atol=1e-6)


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("m,heads,group", [(4608, 30, 0), (4096, 24, 0), (37, 2, 0), (300, 3, 100)])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("rotary", ["tables", "angles"])
def test_fused_qkv(m, heads, group, normed, rotary, monkeypatch):
    from test_qkv_rope_linear import operands

    from dit_core.sequence import sequence_of
    from kernels.int8.qkv_rope_linear import qkv_rope_linear, reference
    ops = operands(m, heads=heads, head=128, k=3840 if m > 1000 else 272, seed=m + heads, device="cuda")
    if not normed:
        ops["q_weight"] = ops["k_weight"] = None
    angles = None
    if rotary == "angles":  # Z-Image's axes at positions to 1023, FLUX.3's at halves (its image rows' scale)
        axes, theta, scale = ((32, 48, 48), 256.0, 1.0) if m % 2 else ((32, 32, 32, 32), 10000.0, 0.5)
        g = torch.Generator().manual_seed(m)
        seq = sequence_of(torch.randint(0, 1024, (m, len(axes)), generator=g) * scale, torch.zeros(m, dtype=torch.long),
                          axes, theta).to("cuda")
        ops["cos"], ops["sin"], angles = seq.cos, seq.sin, seq.angles.as_args()
    hopper, triton_views = _both(monkeypatch, lambda c: qkv_rope_linear(choices=c, **ops, group=group, angles=angles))
    # q and k within one bf16 step of the Triton kernel's (a head's RMS sums in another order: 128-column tiles
    # of one warpgroup against 256 of two), v bit for bit. With angles, cos and sin come from the MUFU (about 1e-6 off
    # the tables'), which moves a value by at most 1.5e-6 times its rotary pair's length: 4e-6 of it allowed.
    for a, b, want in zip(hopper, triton_views, reference(**ops, group=group)):
        assert a.shape == b.shape and a.transpose(1, 2).is_contiguous()
        assert_within_one_bf16_step(a, b, 4e-6 * _pair_lengths(b) if angles else 0.0)
        assert_within_one_bf16_step(a, want, 4e-6 * _pair_lengths(want) if angles else 0.0)
    assert torch.equal(hopper[2], triton_views[2])


def _pair_lengths(t):
    """Each value's rotary pair length |(t[j], t[j + R])| (split halves of each head), in t's shape."""
    t = t.float()
    half = t.shape[-1] // 2
    length = (t[..., :half] ** 2 + t[..., half:] ** 2).sqrt()
    return torch.cat([length, length], -1)


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("m,heads", [(4608, 30), (4608, 24), (37, 2)])
def test_fused_qkv_turned_v(m, heads, monkeypatch):
    """turn_v: q and k as without it; v turned in registers (the Hopper epilogue) against the Triton kernel's product
    with (H4 / 2) (x) I_16 and the float64 reference: sums of four bf16 halves, exact, so bit for bit."""
    from test_qkv_rope_linear import operands

    from kernels.int8.qkv_rope_linear import qkv_rope_linear, reference
    ops = operands(m, heads=heads, head=128, k=3840 if m > 1000 else 272, seed=m + heads, device="cuda")
    hopper, triton_views = _both(monkeypatch, lambda c: qkv_rope_linear(choices=c, **ops, turn_v=True))
    plain = qkv_rope_linear(**ops, choices=Choices(hopper_gemm=False))  # (the Triton kernels)
    assert torch.equal(hopper[0], _both(monkeypatch, lambda c: qkv_rope_linear(choices=c, **ops))[0][0])
    assert torch.equal(triton_views[0], plain[0]) and torch.equal(triton_views[1], plain[1])
    assert torch.equal(hopper[2], triton_views[2]) and torch.equal(hopper[2], reference(**ops, turn_v=True)[2])
