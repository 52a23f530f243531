"""kernels/int8/linear.py against exact integer math: bf16 outputs and the gated f32 residual bit for bit (the
epilogue rounds as the reference does); with a LoRA within one bf16 step (its f32 sums run in another
order); the whole quantize + product path equal to dit_core.linear's INT8 ConvRot emulation."""
import pytest
import torch
from conftest import assert_within_one_bf16_step

from dit_core.linear import linear as host_linear
from dit_core.weights import Linear, quantize_convrot
from kernels.int8.linear import exact_products, int8_linear, int8_linear_gated, reference
from kernels.int8.quant import quantize_rows, rotation_input
from kernels.int8.quant_turned import TURNED, turned_digits
from kernels.int8.row_stats import reference as stats_reference
from kernels.int8 import split_tail
from kernels.int8.arrival_counters import counters_left
from kernels.int8.split_tail import split_of

SMALL_TILES = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
CASES = [(1, 32, 64), (7, 48, 96), (37, 80, 64), (40, 33, 160)]  # (M, N, K): one row, edges of every tile
# Tile loads: pointers, TMA descriptors (Hopper), each with one program a tile or persistent programs; the epilogue
# on the whole tile or on its column halves or quarters (SUBTILE).
LOADS = [{}, {"TMA": True}, {"PERSISTENT": True}, {"TMA": True, "PERSISTENT": True},
         {"TMA": True, "PERSISTENT": True, "SUBTILE": 2}, {"SUBTILE": 2}, {"TMA": True, "SUBTILE": 4}]
LOAD_IDS = ["pointers", "tma", "persistent", "tma-persistent", "tma-persistent-halves", "halves", "tma-quarters"]
ZIMAGE = [(3840, 11520), (3840, 3840), (3840, 20480), (10240, 3840)]  # (K, N): qkv, out, w1+w3, w2


def operands(m, n, k, seed, device, rank=0):
    g = torch.Generator().manual_seed(seed)
    ops = {"q": torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8),
           "s_x": torch.rand(m, generator=g) * 0.02,
           "w": torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
           "s_w": torch.rand(n, generator=g) * 0.002, "bias": torch.randn(n, generator=g).to(torch.bfloat16)}
    lora = {"lora_down": torch.randn(m, rank, generator=g).to(torch.bfloat16),
            "lora_up": (0.1 * torch.randn(n, rank, generator=g)).to(torch.bfloat16)} if rank else {}
    gated = {"residual": torch.randn(m, n, generator=g), "gate": torch.randn(3, n, generator=g),
             "row_map": torch.randint(0, 3, (m,), generator=g)}
    return tuple({key: t.to(device) for key, t in d.items()} for d in (ops, lora, gated))


def test_integer_products_are_exact(device):
    """Unit scales, gate 1, residual 0: the residual receives float(acc), exactly the int32 sums."""
    m, n, k = 37, 80, 160
    ops, _, _ = operands(m, n, k, seed=0, device=device)
    residual = torch.zeros(m, n, device=device)
    int8_linear_gated(ops["q"], torch.ones(m, device=device), ops["w"], torch.ones(n, device=device), None,
                      residual=residual, gate=torch.ones(1, n, device=device),
                      row_map=torch.zeros(m, dtype=torch.long, device=device), tiles=SMALL_TILES)
    assert torch.equal(residual, (ops["q"].double() @ ops["w"].double().t()).float())  # exact: |sums| < 2^53


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("loads", LOADS, ids=LOAD_IDS)
def test_bf16_output(m, n, k, with_bias, loads, device):
    ops, _, _ = operands(m, n, k, seed=m + n + k, device=device)
    if not with_bias:
        ops["bias"] = None
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    int8_linear(**ops, out=out, tiles={**SMALL_TILES, **loads})
    assert torch.equal(out, reference(**ops))


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("loads", LOADS, ids=LOAD_IDS)
# One gate row: read as a vector; "runs": rows 0-19 on gate row 0, the rest on row 1 (a packed sequence), so a
# tile within a run reads its shared gate row as a vector, a tile across the boundary gathers; 3: gathered.
@pytest.mark.parametrize("gate_rows", [3, 1, "runs"])
def test_gated_residual_epilogue(m, n, k, loads, gate_rows, device):
    ops, _, gated = operands(m, n, k, seed=m * n + k, device=device)
    if gate_rows == "runs":
        gated["gate"], gated["row_map"] = gated["gate"][:2], (torch.arange(m, device=device) >= 20).long()
    else:
        gated["gate"], gated["row_map"] = gated["gate"][:gate_rows], gated["row_map"] % gate_rows
    expected = reference(**ops, **{**gated, "residual": gated["residual"].clone()})
    assert int8_linear_gated(**ops, **gated, tiles={**SMALL_TILES, **loads}) is gated["residual"]
    assert torch.equal(gated["residual"], expected)


@pytest.mark.parametrize("m,n,k", CASES)
def test_gated_residual_with_an_addend(m, n, k, device):
    """residual += gate (y + addend): a parallel block's two branches under one gate, the other's bf16 output added
    in this product's epilogue (FLUX.3's attention output into the MLP's down projection)."""
    ops, _, gated = operands(m, n, k, seed=m + 7 * n + k, device=device)
    addend = torch.randn(m, n, device=device).to(torch.bfloat16)
    start = gated.pop("residual")
    expected = reference(**ops, **gated, residual=start.clone(), addend=addend)
    assert not torch.equal(expected, reference(**ops, **gated, residual=start.clone()))
    ours = int8_linear_gated(**ops, **gated, residual=start.clone(), addend=addend, tiles=SMALL_TILES)
    assert torch.equal(ours, expected)
    with pytest.raises(ValueError, match="addend must be contiguous bf16"):
        int8_linear_gated(**ops, **gated, residual=start.clone(), addend=addend.float())


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_gated_residual_with_the_next_norms_statistics(norm, device):
    """next_norm: the updated rows' norm statistics (the next block's first norm) into the given [2, M] view."""
    m, n, k = 37, 128, 64
    ops, _, gated = operands(m, n, k, seed=5, device=device)
    start = gated.pop("residual") + 3  # a mean away from 0: the layer norm's statistics differ from the RMS'
    expected = reference(**ops, **gated, residual=start.clone())
    out = torch.full((2, m + 2), float("nan"), device=device)
    rows = int8_linear_gated(**ops, **gated, residual=start.clone(), next_norm=(out[:, 1:1 + m], norm, 1e-6),
                             tiles=SMALL_TILES)
    assert torch.equal(rows, expected)
    torch.testing.assert_close(out[:, 1:1 + m], stats_reference(expected, norm, 1e-6), rtol=2e-6, atol=0)
    assert out[:, 0].isnan().all() and out[:, -1].isnan().all()
    # The statistics from their definition (float64), not from kernels/int8/row_stats.py's reference.
    rows64 = expected.double()
    mean = rows64.mean(-1) if norm == "layer" else torch.zeros_like(rows64[:, 0])
    inv = 1 / torch.sqrt((rows64 - mean[:, None]).pow(2).mean(-1) + 1e-6)
    torch.testing.assert_close(out[:, 1:1 + m].double(), torch.stack([mean, inv]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("loads", LOADS, ids=LOAD_IDS)
def test_swiglu_epilogue(m, n, k, loads, device):
    """SiLU(gate) up of the interleaved column pairs: the bf16 product then int8_quant's SwiGLU step (the path it
    replaces: the product written whole, the down projection's quantizer activating it), bit for bit here (on a GPU
    Triton's exp and torch's may differ by an ulp: within one bf16 step there)."""
    ops, _, _ = operands(m, 2 * n, k, seed=m + n * k, device=device)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert int8_linear(**ops, out=out, swiglu=True, tiles={**SMALL_TILES, **loads}) is out
    expected = reference(**ops, swiglu=True)
    assert torch.equal(expected, rotation_input(reference(**ops), act="swiglu"))
    if device.type == "cpu":
        assert torch.equal(out, expected)
    else:
        assert_within_one_bf16_step(out, expected)


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (37, 192, 96)])  # one row; a tile's rows past M, 3 blocks of 64
@pytest.mark.parametrize("loads", [{}, {"TMA": True, "PERSISTENT": True}, {"SUBTILE": 2}],
                         ids=["pointers", "tma-persistent", "halves"])
def test_swiglu_rows_turned(m, n, k, loads, device):
    """turn_hidden: SwiGLU's f32 rows turned along each 64 columns' digits d2 and d1 before their one bf16 rounding
    (int8_quant_turned.turned_f32, the epilogue's sums in its order): bit for bit here; turned back in float64, the
    plain rows within a bf16 step (each side rounded once); an epilogue narrower than 64 rows' pairs refused."""
    ops, _, _ = operands(m, 2 * n, k, seed=m + n * k, device=device)
    tiles = {**SMALL_TILES, "BLOCK_N": 128 * max(loads.get("SUBTILE", 1), 1), **loads}
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert int8_linear(**ops, out=out, tiles=tiles, swiglu=True, turn_hidden=True) is out
    expected = reference(**ops, swiglu=True, turn_hidden=True)
    if device.type == "cpu":
        assert torch.equal(out, expected)
    else:
        assert_within_one_bf16_step(out, expected)
    plain = reference(**ops, swiglu=True)
    back = turned_digits(out.double(), TURNED["hidden"])
    assert ((back - plain.double()).abs() <= 2.0 ** -7 * (plain.double().abs() + back.abs().amax())).all()
    assert not torch.equal(out, plain)
    with pytest.raises(ValueError, match="whole 128 columns"):
        int8_linear(**ops, tiles=SMALL_TILES, swiglu=True, turn_hidden=True)
    with pytest.raises(ValueError, match="blocks of 64"):
        int8_linear(**ops, turn_hidden=True)


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (37, 192, 96)])
@pytest.mark.parametrize("loads", [{}, {"TMA": True, "PERSISTENT": True}, {"SUBTILE": 2}],
                         ids=["pointers", "tma-persistent", "halves"])
def test_gelu_rows_plain_and_turned(m, n, k, loads, device):
    """gelu_tanh: the bf16 product's GELU (int8_quant's gelu_tanh step, the path it replaces, within a bf16 step:
    the exponential's form differs); turn_hidden: its f32 rows turned along each 64 columns' digit d2 before their
    one bf16 rounding, turned back in float64 the plain rows within a bf16 step; an epilogue narrower than 64
    columns refused, as is GELU with SwiGLU."""
    ops, _, _ = operands(m, n, k, seed=m + n * k, device=device)
    tiles = {**SMALL_TILES, "BLOCK_N": 64 * max(loads.get("SUBTILE", 1), 1), **loads}
    plain = reference(**ops, gelu_tanh=True)
    assert_within_one_bf16_step(plain, rotation_input(reference(**ops), act="gelu_tanh"))
    for turn in (False, True):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        assert int8_linear(**ops, out=out, tiles=tiles, gelu_tanh=True, turn_hidden=turn) is out
        assert_within_one_bf16_step(out, reference(**ops, gelu_tanh=True, turn_hidden=turn))
    back = turned_digits(out.double(), TURNED["v"])
    assert ((back - plain.double()).abs() <= 2.0 ** -7 * (plain.double().abs() + back.abs().amax())).all()
    assert not torch.equal(out, plain)
    with pytest.raises(ValueError, match="whole 64 columns"):
        int8_linear(**ops, tiles={**SMALL_TILES, "BLOCK_N": 32}, gelu_tanh=True, turn_hidden=True)
    with pytest.raises(ValueError, match="no GELU"):
        int8_linear(**ops, swiglu=True, gelu_tanh=True)


def test_the_tail_split_decision():
    """Z-Image's down projection at 1024^2 (540 tiles of 128 x 256 on 132 SMs, 80 K steps): the last 12 tiles in
    parts; FLUX.3 Klein's MLP output (432 tiles, 72 K steps) likewise; none where the waves come out even, the tail is
    over half a wave, or K is short (the out projections' 24-30 K steps: slower split, as measured)."""
    assert split_of(540, 132, 80) == (528, 8) and split_of(432, 132, 72) == (396, 3)
    assert split_of(528, 132, 80) == (528, 1) and split_of(2880, 132, 80) == (2880, 1)  # even; a tail of 108
    assert split_of(100, 132, 80) == (100, 1) and split_of(540, 132, 30) == (540, 1)  # under a wave; short K


@pytest.fixture
def short_k_split(monkeypatch):
    """Splits at the small shapes the interpreter runs (the H200's threshold, MIN_K_STEPS, is longer)."""
    monkeypatch.setattr(split_tail, "MIN_K_STEPS", 2)


# (M, N, K, wave): 9 tiles on 4 programs, the last in 2 parts; 6 tiles on 5, the last in 4 parts of uneven K runs.
SPLIT_CASES = [(37, 80, 64, 4), (40, 64, 480, 5)]
SPLIT_LOADS = [{}, {"TMA": True, "PERSISTENT": True}, {"TMA": True, "SUBTILE": 2}]


@pytest.mark.parametrize("m,n,k,wave", SPLIT_CASES)
@pytest.mark.parametrize("loads", SPLIT_LOADS, ids=["pointers", "tma-persistent", "tma-halves"])
def test_split_tail_equals_the_whole_tiles(m, n, k, wave, loads, device, short_k_split):
    """Every form with its last tiles split along K in a tail launch (kernels/int8/split_tail.py) equals the reference bit
    for bit, twice over (the counters are back at 0 after a launch)."""
    tiles = {**SMALL_TILES, **loads, "WAVE": wave}
    assert split_of(-(-m // 16) * -(-n // 32), wave, -(-k // 32))[1] > 1
    for seed in (1, 2):
        ops, _, gated = operands(m, n, k, seed=seed, device=device)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        assert torch.equal(int8_linear(**ops, out=out, tiles=tiles), reference(**ops))
        expected = reference(**ops, **{**gated, "residual": gated["residual"].clone()})
        assert torch.equal(int8_linear_gated(**ops, **gated, tiles=tiles), expected)
        half = {**ops, "w": ops["w"][: n // 2 * 2], "s_w": ops["s_w"][: n // 2 * 2], "bias": ops["bias"][: n // 2 * 2]}
        got = int8_linear(**half, swiglu=True, tiles=tiles)
        if device.type == "cpu":
            assert torch.equal(got, reference(**half, swiglu=True))
        else:
            assert_within_one_bf16_step(got, reference(**half, swiglu=True))
    assert counters_left() == 0


def test_split_tail_with_a_lora(device, short_k_split):
    """The LoRA's product in a split tile's epilogue (run by its last part) as in the whole tile's, bit for bit."""
    ops, lora, gated = operands(40, 64, 480, seed=5, device=device, rank=5)
    for tiles in ({**SMALL_TILES, "TMA": True, "PERSISTENT": True}, SMALL_TILES):
        whole = int8_linear(**ops, **lora, tiles=tiles)
        assert torch.equal(int8_linear(**ops, **lora, tiles={**tiles, "WAVE": 5}), whole)
        assert_within_one_bf16_step(whole, reference(**ops, **lora))
        expected = int8_linear_gated(**ops, **lora, **{**gated, "residual": gated["residual"].clone()}, tiles=tiles)
        by_reference = reference(**ops, **lora, **{**gated, "residual": gated["residual"].clone()})
        torch.testing.assert_close(expected, by_reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(int8_linear_gated(**ops, **lora, **gated, tiles={**tiles, "WAVE": 5}), expected)


@pytest.mark.parametrize("m,n,k", CASES[1:])
def test_lora_in_the_epilogue(m, n, k, device):
    ops, lora, gated = operands(m, n, k, seed=k, device=device, rank=5)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    got = int8_linear(**ops, **lora, out=out, tiles=SMALL_TILES)
    assert_within_one_bf16_step(got, reference(**ops, **lora))
    expected = reference(**ops, **lora, **{**gated, "residual": gated["residual"].clone()})
    int8_linear_gated(**ops, **lora, **gated, tiles=SMALL_TILES)
    torch.testing.assert_close(gated["residual"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n,group", [(7, 64, 48, 16), (19, 256, 40, 64)])
def test_quantize_then_product_equals_host_int8_linear(m, k, n, group, device):
    """kernels' quantize_rows + int8_linear == bf16 of dit_core.linear.linear on an INT8 ConvRot Linear."""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    codes, scale = quantize_convrot(torch.randn(n, k, generator=g), group)
    lin = Linear(codes, torch.randn(n, generator=g), scale, group)
    q, s = quantize_rows(x.to(device), group, block_m=16)
    out = int8_linear(q, s, codes.to(device), scale.reshape(-1).to(device), lin.bias.to(device),
                      tiles=SMALL_TILES)
    assert torch.equal(out.cpu(), host_linear(x, lin).to(torch.bfloat16))


def test_bad_arguments_raise():
    ops, _, _ = operands(4, 32, 64, seed=0, device="cpu")
    with pytest.raises(ValueError):
        int8_linear(ops["q"], ops["s_x"], ops["w"][:, :32], ops["s_w"])
    with pytest.raises(ValueError):
        int8_linear(ops["q"], ops["s_x"][:3], ops["w"], ops["s_w"])
    with pytest.raises(ValueError):
        int8_linear(ops["q"], ops["s_x"], ops["w"], ops["s_w"],
                    lora_down=torch.zeros(4, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="even"):
        int8_linear(ops["q"], ops["s_x"], ops["w"][:31], ops["s_w"][:31], swiglu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k,n", ZIMAGE)
def test_zimage_shapes(k, n):
    m = 4608
    ops, lora, gated = operands(m, n, k, seed=n, device="cuda", rank=32)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert torch.equal(int8_linear(**ops, out=out), reference(**ops))  # autotuned tiles
    expected = reference(**ops, **{**gated, "residual": gated["residual"].clone()})
    assert torch.equal(int8_linear_gated(**ops, **gated), expected)
    assert_within_one_bf16_step(int8_linear(**ops, **lora), reference(**ops, **lora))
    assert_within_one_bf16_step(int8_linear(**ops, swiglu=True), reference(**ops, swiglu=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_products_on_the_gpu_are_exact():
    """Without Triton the reference runs on the GPU: its INT8 products (torch._int_mm) equal float64's."""
    ops, _, _ = operands(4608, 3840, 10240, seed=3, device="cuda")
    assert torch.equal(exact_products(ops["q"], ops["w"]).double(), ops["q"].double() @ ops["w"].double().t())
