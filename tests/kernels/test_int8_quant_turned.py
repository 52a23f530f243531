"""kernels/int8/quant_turned.py: plain rows, or an attention's output whose v was turned along each 64 columns' top
digit, to INT8 ConvRot codes in one pass.

Against the float64 rotation of the same rows (test_int8_quant's assert_codes_match_float64: the matrix cores' f32 sums
may round a value lying within their error of a bf16 midpoint the other way; every other code and scale equal). For
turned rows t the unturned rows are t ((H4 / 2) (x) I_16) in float64 (the factor is its own inverse). Against the
rotate pass on the unturned bf16 rows u, turned rows t = bf16(u ((H4 / 2) (x) I_16)) carry one bf16 rounding more:
codes move by one or two at a few percent of values, scales by a bf16 step at most (checked, and bounded, below)."""
import pytest
import torch
from conftest import GLUON_BUILD, gluon_builds
from test_int8_quant import assert_codes_match_float64, poisoned_outputs, rows_like_activations

from kernels import Choices

from kernels.int8 import quant as int8_quant, quant_turned_hopper as int8_quant_turned_hopper
from kernels.int8.hadamard import hadamard
from kernels.int8.quant_turned import (MAX_K, TURNED, fits, quantize_turned, reference, rest_operand, turned_digits,
                                      turned_f32, turned_rows)


@pytest.mark.parametrize("m,k", [(1, 256), (37, 768), (5, 3072), (3, 3840)])  # one row, odd rows, Klein, Z-Image
@pytest.mark.parametrize("rows,row_programs", [(1, 0), (2, 0), (2, 1)])  # (row_programs 1: the blocks walked)
@pytest.mark.parametrize("turned", ["v", "hidden", None])
def test_codes_equal_float64_rotation(m, k, rows, row_programs, turned, device):
    t = rows_like_activations(m, k, seed=m + k, device=device)
    q, s = quantize_turned(t, turned, out=poisoned_outputs(m, k, device), rows=rows, row_programs=row_programs)
    assert_codes_match_float64(q, s, turned_digits(t, TURNED[turned]) if turned else t, 256, max_fraction=0)
    q_ref, s_ref = reference(t, turned)
    assert (q.int() - q_ref.int()).abs().max() <= 2 and ((s - s_ref).abs() <= 2.0 ** -7 * s_ref).all()


def test_minus_128_and_a_zero_row(device):
    """A negative absmax can quantize to -128 (format doc section 5), as int8_quant's test_f32_rows_and_minus_128."""
    y = torch.zeros(3, 256, dtype=torch.float64)
    y[0, 0], y[1, 0] = -11.0, 11.0  # bf16(11/127) < 11/127, so 11 / it rounds to 127.5 in bf16
    for turned in (None, "v", "hidden"):
        u = y @ hadamard(256, torch.float64)  # rotates back to y exactly (each value +-11/16)
        t = turned_rows(u, TURNED[turned]) if turned else u.to(torch.bfloat16)  # exact in bf16 each way
        q, s = quantize_turned(t.to(device), turned, out=poisoned_outputs(3, 256, device))
        assert q[0, 0] == -128 and q[1, 0] == 127 and (q[:2, 1:] == 0).all() and (q[2] == 0).all()
        assert torch.equal(s.cpu(), torch.tensor([11 / 127, 11 / 127, 1e-30], dtype=torch.float32))


def test_as_the_rotate_pass_of_the_unturned_rows(device):
    """The whole path, u -> t = bf16(u ((H4 / 2) (x) I_16)) -> codes, against int8_quant's codes of u: one rounding
    more."""
    u = rows_like_activations(64, 3840, seed=3, device=device)
    q, s = quantize_turned(turned_rows(u))
    q_u, s_u = int8_quant.reference(u, 256)
    assert ((s - s_u).abs() <= 2.0 ** -7 * s_u).all()
    assert (q.int() - q_u.int()).abs().max() <= 2
    assert (q != q_u).float().mean() < 0.1


def test_quantize_rows_takes_turned_rows(device):
    t = rows_like_activations(7, 512, seed=1, device=device)
    for turned in TURNED:
        q, s = int8_quant.quantize_rows(t, 256, turned=turned)
        q_ref, s_ref = quantize_turned(t, turned)
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
        assert int8_quant.reference(t, 256, turned=turned)[1].allclose(s, rtol=2.0 ** -7)
    with pytest.raises(ValueError, match="turned rows"):
        int8_quant.quantize_rows(t, 64, turned="v")
    with pytest.raises(ValueError, match="turned rows"):
        int8_quant.quantize_rows(t, 256, turned="q")
    with pytest.raises(ValueError, match="turned rows"):
        int8_quant.quantize_rows(t.float(), 256, norm="rms", scale=torch.zeros(1, 512, device=device),
                                 row_map=torch.zeros(7, dtype=torch.long, device=device), turned="v")


def test_hidden_rows_past_whole_rows_take_the_passes_with_the_rest_as_operand(device):
    """Turned rows longer than MAX_K (the MLP's hidden rows: 9216, 10240) where no Gluon kernel runs: the rotate and
    codes passes, their 64-column operand the factors the producer left (rest_operand), against the float64
    rotation."""
    for turned in TURNED:
        t = rows_like_activations(3, MAX_K + 256, seed=4, device=device)
        q, s = int8_quant.quantize_rows(t, 256, turned=turned, out=poisoned_outputs(3, MAX_K + 256, device))
        assert_codes_match_float64(q, s, turned_digits(t, TURNED[turned]), 256, max_fraction=0)


def test_rest_operand_completes_the_rotation():
    """Each turn's digits, then the rest (rest_operand, doubled), give H_64 exactly; turned_f32 is the float64 turn
    within f32 sums' rounding; each factor is its own inverse."""
    u = torch.randn(5, 256, dtype=torch.float64)
    full = (u.reshape(5, 4, 64) @ hadamard(64, torch.float64)).reshape(5, 256)
    for turned, digits in TURNED.items():
        rest = rest_operand(turned, 64, torch.device("cpu")).double() * 2
        assert torch.allclose((turned_digits(u, digits).reshape(5, 4, 64) @ rest).reshape(5, 256), full, atol=1e-12)
        assert torch.allclose(turned_digits(turned_digits(u, digits), digits), u, atol=1e-12)
    assert torch.equal(rest_operand(None, 64, torch.device("cpu")).double(), hadamard(64, torch.float64) / 2)
    assert torch.allclose(turned_f32(u.float()).double(), turned_digits(u, TURNED["hidden"]), rtol=0, atol=1e-6)


def test_fits():
    assert fits(3840, 256) and fits(3072, 256) and fits(MAX_K, 256)
    assert not fits(3840, 64) and not fits(3000, 256) and not fits(MAX_K + 256, 256) and not fits(0, 256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [3072, 3840])
@pytest.mark.parametrize("turned", ["v", None])
def test_attention_output_shapes(k, turned):
    """Klein's and Z-Image's attention outputs at 1024^2 (4608 rows): the float64 rotation's codes (at most 1e-5 of
    them across a midpoint)."""
    u = rows_like_activations(4608, k, seed=k, device="cuda")
    t = turned_rows(u) if turned else u
    q, s = quantize_turned(t, turned, out=poisoned_outputs(4608, k, "cuda"))
    assert_codes_match_float64(q, s, turned_digits(t) if turned else t, 256, max_fraction=1e-5)


def test_quantize_rows_takes_many_plain_bf16_rows_in_one_pass(device, monkeypatch):
    """Plain bf16 rows from WHOLE_ROWS_MIN_M rows on (lowered here) go through this pass; f32 rows, normed rows and
    rows of more than WHOLE_ROWS_MAX_GROUPS groups do not."""
    calls = []
    monkeypatch.setattr(int8_quant, "WHOLE_ROWS_MIN_M", 16)
    monkeypatch.setattr(int8_quant.quant_turned, "quantize_turned",
                        lambda *a, **kw: calls.append(kw["turned"]) or quantize_turned(*a, **kw))
    x = rows_like_activations(16, 512, seed=2, device=device)
    q, s = int8_quant.quantize_rows(x, 256)
    assert calls == [None]
    assert_codes_match_float64(q, s, x, 256, max_fraction=0)
    int8_quant.quantize_rows(x[:15], 256)
    int8_quant.quantize_rows(x.float(), 256)
    int8_quant.quantize_rows(rows_like_activations(16, 256 * (int8_quant.WHOLE_ROWS_MAX_GROUPS + 1), seed=3,
                                                   device=device), 256)
    assert calls == [None]


BUILD = GLUON_BUILD + """
from kernels.int8 import quant_turned_hopper as kt
sig = {"t_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp32", "K": "i32", "GROUPS_P2": "constexpr"}
found = {}
for groups_p2 in (16, 32):  # K 3072 and 3840; 8192
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}  # what triton.jit assumes at the H200's launches
    src = GluonASTSource(kt._turned_codes_hopper_kernel, sig, {(4,): groups_p2}, attrs)
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2, "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    found[groups_p2] = {"loads": len(re.findall(r"ld\\.global[.\\w]*\\.v4\\.b32", ptx)),
                        "stores": len(re.findall(r"st\\.global[.\\w]*\\.v4\\.b32", ptx)),
                        "shuffles": ptx.count("shfl.sync"), "shared": built.metadata.shared}
print(json.dumps(found))
"""


def test_hopper_kernel_builds_with_h16_in_each_threads_registers():
    """The Gluon kernel for sm_90a (CI has no GPU): each thread's 16 columns of a block load and store as 16-byte
    vectors (bf16 in, int8 out), and the butterflies move no data between threads (shuffles only in the row's
    absmax: two warps' lanes; shared memory only for the warps' partial maxima)."""
    found = gluon_builds(BUILD)
    for groups_p2, built in found.items():
        reps = int(groups_p2) // 16  # a warp's lanes cover 8 groups: the layout wraps past 16
        assert built["loads"] == 4 * 2 * reps and built["stores"] == 4 * reps, (groups_p2, built)
        assert built["shuffles"] <= 16 and built["shared"] <= 64, (groups_p2, built)


def test_hopper_kernel_off_the_gpu_says_why():
    """The rows' answers on any machine (groups short of a power of two; hidden rows larger than shared memory),
    then the machine's."""
    off = ("off, no Gluon, unbuilt or interpreted", "not a Hopper GPU")
    assert int8_quant_turned_hopper.unusable(torch.zeros(4, 3072, dtype=torch.bfloat16)).startswith("a row's groups")
    assert int8_quant_turned_hopper.unusable(torch.zeros(4, 3840, dtype=torch.bfloat16)) in off
    assert int8_quant_turned_hopper.unusable(torch.zeros(1, 3072, dtype=torch.bfloat16), "hidden") in off
    assert int8_quant_turned_hopper.unusable(torch.zeros(1, 99 * 1024, dtype=torch.bfloat16), "hidden") == \
        "a row's rotated values larger than shared memory"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("m,k", [(4608, 3072), (4608, 3840), (512, 3072), (3, 8192), (1, 256)])
def test_hopper_kernel_against_the_triton_kernel(m, k):
    """The Gluon kernel gives the float64 rotation's codes as the Triton kernel does (each within its f32 sums'
    midpoints; the two agree on all but those); quantize_turned takes it where a row's groups come within 1/16 of a
    power of two (K 3072, 12 groups of 16, goes to Triton's kernel: faster there)."""
    u = rows_like_activations(m, k, seed=m + k, device="cuda")
    t = turned_rows(u)
    hopper = poisoned_outputs(m, k, "cuda")
    assert int8_quant_turned_hopper.launch(t, *hopper), int8_quant_turned_hopper.UNBUILT
    assert (int8_quant_turned_hopper.unusable(t) is None) == (k != 3072)
    triton_codes = quantize_turned(t, out=poisoned_outputs(m, k, "cuda"), hopper=False)
    for q, s in (hopper, triton_codes):
        assert_codes_match_float64(q, s, turned_digits(t), 256, max_fraction=1e-5)
    assert (hopper[0] != triton_codes[0]).float().mean() <= 1e-5


HIDDEN_BUILD = GLUON_BUILD + """
from kernels.int8 import quant_turned_hopper as kt
sig = {"t_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp32", "K": "i32", "CHUNKS": "constexpr", "CH": "constexpr",
       "TURNED_V": "constexpr"}
found = {}
# K 10240 by chunks of 4 groups a warp (hidden rows); K 16384 by chunks of 8 (v turned: LTX-2.5's GELU rows)
for chunks, ch, warps, v in ((10, 4, 1, False), (5, 8, 2, False), (8, 8, 1, True), (4, 16, 2, True)):
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    src = GluonASTSource(kt._long_codes_hopper_kernel, sig, {(4,): chunks, (5,): ch, (6,): v}, attrs)
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": warps, "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    found[f"{'v' if v else 'hidden'} {warps}"] = {"loads": len(re.findall(r"ld\\.global[.\\w]*\\.v4\\.b32", ptx)),
                    "code stores": len(re.findall(r"st\\.global[.\\w]*\\.v2\\.b32", ptx)),
                    "shared stores": len(re.findall(r"st\\.shared\\.v4\\.b32", ptx)),
                    "v4 code stores": len(re.findall(r"st\\.global[.\\w]*\\.v4\\.b32", ptx)),
                    "shuffles": ptx.count("shfl.sync"), "shared": built.metadata.shared}
print(json.dumps(found))
"""


def test_long_rows_kernel_builds_with_its_digits_in_each_threads_registers():
    """The Gluon kernel for rows of any length, for sm_90a: hidden rows' 8 columns of each block a thread (d0) load
    as one 16-byte vector (a chunk's four blocks, then the next chunk's under them), their codes leave as 8 bytes
    and their rotated values wait in shared memory as 16 bytes; v-turned rows' 16 columns (d1 and d0) as two
    vectors, their codes as 16 bytes; no shuffles but the row's absmax (5 steps across a warp's lanes, one more for
    the warps); shared memory K x 2 bytes."""
    found = gluon_builds(HIDDEN_BUILD)
    for name, built in found.items():
        v, warps = name.split()[0] == "v", int(name.split()[1])
        k = 16384 if v else 10240
        assert built["loads"] == (16 if v else 8) and built["shared stores"] == (8 if v else 4), (name, built)
        assert (built["v4 code stores"], built["code stores"]) == ((4, 0) if v else (0, 4)), (name, built)
        assert built["shuffles"] <= 5 + warps and k * 2 <= built["shared"] <= k * 2 + 64, (name, built)


def test_long_v_turned_rows_take_the_passes():
    """v-turned rows longer than quantize_turned takes (UP's turned GELU rows) go to the rotate and codes passes
    with the rest of the rotation as their operand, off Hopper: the float64 rotation's codes."""
    t = turned_rows(rows_like_activations(3, MAX_K + 256, seed=7, device="cpu"), TURNED["v"])
    q, s = int8_quant.quantize_rows(t, 256, turned="v")
    assert_codes_match_float64(q, s, turned_digits(t, TURNED["v"]), 256, max_fraction=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("turned,m,k", [("hidden", 4608, 9216), ("hidden", 4608, 10240), ("hidden", 512, 9216),
                                         ("hidden", 3, 8448), ("hidden", 1, 256), ("v", 4608, 16384),
                                         ("v", 130, 16384), ("v", 3, 8448)])
@pytest.mark.parametrize("warps,groups", [(1, None), (2, None), (1, 8)])
def test_long_rows_kernel_against_the_passes(turned, m, k, warps, groups):
    """The Gluon kernel for rows of any length (quantize_rows takes it on Hopper for hidden rows, and v-turned rows
    past quantize_turned's) against the float64 rotation, and against the Triton passes with the rest of the
    rotation as their operand (all but f32 sums' midpoints equal)."""
    t = turned_rows(rows_like_activations(m, k, seed=m + k, device="cuda"), TURNED[turned])
    hopper = poisoned_outputs(m, k, "cuda")
    assert int8_quant_turned_hopper.launch_long(t, *hopper, turned, warps, groups), int8_quant_turned_hopper.UNBUILT
    assert int8_quant_turned_hopper.unusable(t, turned, long=True) is None
    passes = int8_quant.quantize_rows(t, 256, turned=turned, out=poisoned_outputs(m, k, "cuda"),
                                      choices=Choices(hopper_turned_quant=False))
    for q, s in (hopper, passes):
        assert_codes_match_float64(q, s, turned_digits(t, TURNED[turned]), 256, max_fraction=1e-5)
    assert (hopper[0] != passes[0]).float().mean() <= 1e-5
