"""kernels/int8/quant_hopper.py: built for the H200 in CI (no interpreter runs Gluon: the build must rotate on bf16
wgmma, count row blocks in with release and acquire atomics, and fit three programs an SM), its launcher's choices
and fallbacks checked on the CPU, and on the GPU equal bit for bit to kernels/int8/quant.py's Triton passes
(pytest -m gpu)."""
import pytest
import torch
from conftest import GLUON_BUILD, gluon_builds
from test_int8_quant import poisoned_outputs, rows_like_activations

from kernels import Choices

from kernels.int8 import quant_hopper as int8_quant_hopper
from kernels.int8.arrival_counters import counters_left
from kernels.int8.hadamard import hadamard
from kernels.int8.quant import quantize_rows

BUILD = GLUON_BUILD + """
from kernels.int8 import linear_hopper as kh, quant_hopper as kq
def desc(shape):
    block = [kq.BLOCK_M, kq.BLOCK_Q]
    return mangle_type(kh.TensorDescriptor(Rows, shape, [shape[1], 1], block,
                                           gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)))
found = {}
for groups in (1, 2, 3):
    sig = {"x_desc": desc([4608, 9216]), "h_desc": desc([64, 64]), "q_ptr": "*i8", "s_ptr": "*fp32",
           "pmax_ptr": "*fp32", "count_ptr": "*i32", "work_ptr": "*i32", "M": "i32", "K": "i32", "CHUNKS": "i32",
           "ITEMS": "i32", "G": "constexpr"}
    src = GluonASTSource(kq._plain_quant_kernel, sig, {"G": groups})
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    ordered = r"(?:atom|red|ld)\\.global\\.gpu\\.(acquire|release|acq_rel)"
    found[groups] = {"mma": sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))),
                     "atomics": sorted(set(re.findall(ordered, ptx))),
                     "tma": "cp.async.bulk.tensor" in ptx, "shared": built.metadata.shared}
print(json.dumps(found))
"""


def test_builds_for_the_h200_rotating_on_bf16_wgmma_with_ordered_counters():
    found = gluon_builds(BUILD)
    for groups, built in found.items():
        assert built["mma"] == ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"], groups
        assert built["atomics"] == ["acq_rel", "acquire", "release"], groups  # count in, wait, last to finish
        assert built["tma"], groups
        # x's blocks (32 KB a group) and H_64 / 2: three programs an SM at two groups, two at three
        assert built["shared"] <= {"1": 76, "2": 76, "3": 113}[groups] * 1024, (groups, built["shared"])


def test_taken_only_for_hidden_rows_and_whole_groups():
    """quantize_rows takes the one pass only where it measured faster (the MLP's hidden rows); it needs Hopper,
    bf16 rows of 256-groups and TMA's alignment, else says why."""
    assert int8_quant_hopper.chosen(4608, 9216) and int8_quant_hopper.chosen(4608, 10240)
    assert not any(int8_quant_hopper.chosen(m, k) for m, k in ((4608, 3072), (4608, 3840), (512, 9216)))
    assert [int8_quant_hopper.groups_per_item(g) for g in (36, 40, 15, 13)] == [2, 2, 3, 1]
    x = torch.zeros(8, 512, dtype=torch.bfloat16)
    assert int8_quant_hopper.unusable(x.float(), 256) == "not bf16 rows of whole 256-groups"
    assert int8_quant_hopper.unusable(x, 64) == "not bf16 rows of whole 256-groups"
    assert int8_quant_hopper.unusable(torch.zeros(8, 520, dtype=torch.bfloat16)[:, 4:516], 256) == \
        "TMA needs 16-byte rows and bases"  # its base 8 bytes past a 16-byte boundary
    assert int8_quant_hopper.unusable(x, 256) in ("off, no Gluon, unbuilt or interpreted", "not a Hopper GPU (wgmma)")


class _FakeKernel:
    """Stands in for the Gluon kernel: records each launch's grid and arguments."""
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


def test_the_launcher_splits_rows_into_items_and_counts_programs(monkeypatch):
    """4608 x 9216: 72 row blocks of 18 chunks of 2 groups, 4 programs an SM (at most one an item); its counters
    ([row blocks..., -, tickets, finished programs]) from the kept buffers; none to be had (a capture before any
    warm-up): nothing launched, False."""
    pytest.importorskip("triton.experimental.gluon")
    fake = _FakeKernel()
    monkeypatch.setattr(int8_quant_hopper, "_plain_quant_kernel", fake)
    monkeypatch.setattr(int8_quant_hopper, "sm_count", lambda device: 132)
    monkeypatch.setattr(int8_quant_hopper, "tma_descriptor", lambda t, block, dtype: (tuple(t.shape), tuple(block)))
    kept = torch.zeros(128, dtype=torch.int32)
    monkeypatch.setattr(int8_quant_hopper, "kept", lambda device, numel: kept if numel <= 128 else None)
    x, (codes, scales) = torch.zeros(4608, 9216, dtype=torch.bfloat16), poisoned_outputs(4608, 9216, "cpu")
    assert int8_quant_hopper.launch(x, codes, scales)
    (grid, args, kwargs), = fake.launches
    assert grid == (528,) and kwargs["G"] == 2 and args[0] == ((4608, 9216), (64, 64))
    assert args[-4:] == (4608, 9216, 18, 72 * 18) and args[4].shape == (18, 4608)
    assert args[5].data_ptr() == kept.data_ptr() and args[6].data_ptr() == kept[72:].data_ptr()
    assert int8_quant_hopper.launch(x[:100], codes[:100], scales[:100], groups=3, programs_per_sm=2)
    assert fake.launches[-1][0] == (24,) and fake.launches[-1][2]["G"] == 3  # 2 row blocks x 12 chunks
    assert not int8_quant_hopper.launch(torch.zeros(65536, 256, dtype=torch.bfloat16), *poisoned_outputs(
        65536, 256, "cpu"))  # 1024 row blocks: past the stand-in's 128 counters, as in a capture before a warm-up
    assert len(fake.launches) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m,k,groups", [(4608, 3072, None), (4608, 9216, 1), (4607, 3840, 3), (4608, 10240, 2),
                                        (100, 768, None), (1, 256, None)])
def test_one_pass_equals_two_passes(m, k, groups, monkeypatch):
    """kernels/int8/quant_hopper.py against the Triton passes, bit for bit (the same matrix-core sums): FLUX.3's and
    Z-Image's plain rows, rows not a multiple of 64, one row, each item size; -128 where a row's absmax is
    negative; every counter back at 0; again, and replayed in a CUDA graph."""
    x = rows_like_activations(m, k, seed=k + m, device="cuda")
    if int8_quant_hopper.unusable(x, 256):
        pytest.skip(int8_quant_hopper.unusable(x, 256))
    y = torch.zeros(2, 256, dtype=torch.float64)
    y[0, 0], y[1, 0] = -11.0, 11.0  # (test_f32_rows_and_minus_128's rows: they rotate to y exactly)
    x[:2] = 0
    x[:2, :256] = (y @ hadamard(256, torch.float64)).to(x)[:m]
    q, s = poisoned_outputs(m, k, "cuda")
    assert int8_quant_hopper.launch(x, q, s, groups), int8_quant_hopper.UNBUILT
    assert counters_left() == 0
    q_ref, s_ref = quantize_rows(x, 256, choices=Choices(hopper_quant=False))
    assert torch.equal(s, s_ref), f"{int((s != s_ref).sum())} scales differ"
    assert torch.equal(q, q_ref), f"{int((q != q_ref).sum())} codes differ"
    assert q[0, 0] == -128 and (m == 1 or q[1, 0] == 127)
    graph, stream, again, replayed = torch.cuda.CUDAGraph(), torch.cuda.Stream(), *(poisoned_outputs(m, k, "cuda")
                                                                                   for _ in range(2))
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the warm-up on the capture's stream makes its counters
        assert int8_quant_hopper.launch(x, *again, groups)
    stream.synchronize()
    assert torch.equal(again[0], q) and torch.equal(again[1], s)
    with torch.cuda.graph(graph, stream=stream):
        assert int8_quant_hopper.launch(x, *replayed, groups)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed[0], q) and torch.equal(replayed[1], s) and counters_left() == 0
