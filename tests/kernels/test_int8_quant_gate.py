"""An attention's output gate in OUT's quantizer prologue (kernels/int8/prologue.py; issues 36, 38): the rotate pass
(kernels/int8/quant.py) and the whole-rows pass (kernels/int8/quant_turned.py) against their references.

Krea 2's gate: a bf16 value a feature, QKV's last columns (rows wider than the gate), factor 1. LTX-2.5's: an f32
value a head, factor 2. The kernels' sigmoid is f32 arithmetic of their own (exp approximate on the GPU), so a gated
value may round to the other bf16 neighbour than torch's: the fused prologues' tolerance (assert_fused_close). A
zero gate with factor 2 multiplies by exactly 1: the plain rows' codes, bit for bit."""
import pytest
import torch
from conftest import assert_within_one_bf16_step, interpreted_only
from test_int8_quant import assert_fused_close, poisoned_outputs, rows_like_activations

from kernels import Choices
from kernels.int8 import quant as int8_quant
from kernels.int8.prologue import gated_rows
from kernels.int8.quant import quantize_rows, reference
from kernels.int8.quant_turned import quantize_turned, reference as turned_reference

GATES = ["feature", "head"]


def gate_inputs(m: int, k: int, kind: str, seed: int, device, heads: int = 4):
    """(rows x, quantize_rows' gate keywords): "feature", the last k columns of bf16 rows [m, 3k] (QKV's [q | k | v |
    gate] product: rows 3k apart); "head", f32 [m, heads] with factor 2."""
    g = torch.Generator().manual_seed(seed)
    x = rows_like_activations(m, k, seed=seed, device=device)
    if kind == "feature":
        wide = (2 * torch.randn(m, 3 * k, generator=g)).to(device, torch.bfloat16)
        return x, {"gate": wide[:, 2 * k:], "gate_factor": 1.0}
    return x, {"gate": (2 * torch.randn(m, heads, generator=g)).to(device), "gate_factor": 2.0}


@pytest.mark.parametrize("kind", GATES)
def test_gated_rows_are_the_torch_gates(kind):
    """gated_rows against the GPU block's and LTX-2.5's torch gates (bf16 products, the sigmoid rounded to bf16
    first): within one bf16 step of them (a quarter of the values differ), and never farther from the float64
    product than they are."""
    x, kw = gate_inputs(6, 256, kind, seed=1, device="cpu")
    u = gated_rows(x, kw["gate"], kw["gate_factor"])
    if kind == "feature":
        want, exact = x * torch.sigmoid(kw["gate"]), x.double() * torch.sigmoid(kw["gate"].double())
    else:
        want = (x.view(6, 4, 64) * (2 * torch.sigmoid(kw["gate"]))[..., None].to(x.dtype)).view(6, 256)
        exact = (x.double().view(6, 4, 64) * (2 * torch.sigmoid(kw["gate"].double()))[..., None]).view(6, 256)
    assert_within_one_bf16_step(u, want, allowance=2.0 ** -8 * want.float().abs())
    assert ((u.double() - exact).abs() <= (want.double() - exact).abs() + 2.0 ** -20 * exact.abs()).all()


# (M, K, group, heads): a head of 16 features (in a 16-group), of 64 (one group), of 128 (across 64-column blocks)
SHAPES = [(37, 64, 16, 4), (19, 192, 64, 3), (5, 512, 256, 4)]


@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("m,k,group,heads", SHAPES)
@pytest.mark.parametrize("launch", [{}, {"row_programs": 0, "num_stages": 2}], ids=["default", "block-a-program"])
def test_rotate_pass_takes_the_gate(m, k, group, heads, kind, launch, device):
    x, kw = gate_inputs(m, k, kind, seed=m + k, device=device, heads=heads)
    q, s = quantize_rows(x, group, **kw, out=poisoned_outputs(m, k, device), block_m=16, **launch)
    q_ref, s_ref = reference(x, group, **kw)
    assert not s.isnan().any()
    assert_fused_close(q, s, q_ref, s_ref, max_fraction=0.01)


@pytest.mark.parametrize("m,k,group,heads", SHAPES)
def test_zero_gate_doubled_is_the_plain_rows(m, k, group, heads, device):
    x, kw = gate_inputs(m, k, "head", seed=m, device=device, heads=heads)
    kw["gate"].zero_()
    q, s = quantize_rows(x, group, **kw, out=poisoned_outputs(m, k, device), block_m=16)
    q_plain, s_plain = quantize_rows(x, group, block_m=16)
    assert torch.equal(q, q_plain) and torch.equal(s, s_plain)
    assert all(torch.equal(a, b) for a, b in zip(reference(x, group, **kw), reference(x, group)))


@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("m,k,heads", [(5, 512, 4), (3, 768, 3)])
@pytest.mark.parametrize("launch", [{}, {"row_programs": 1, "rows": 2}], ids=["a-block-a-program", "walking"])
def test_whole_rows_pass_takes_the_gate(m, k, heads, kind, launch, device):
    """quant_turned's one pass with the gate against its reference, and its zero doubled gate against its plain rows
    bit for bit; a program a row block, or a few walking them (the next block read under this one's math), the
    same codes."""
    x, kw = gate_inputs(m, k, kind, seed=k, device=device, heads=heads)
    q, s = quantize_turned(x, None, out=poisoned_outputs(m, k, device), **kw, **launch)
    assert_fused_close(q, s, *turned_reference(x, None, **kw), max_fraction=0.01)
    assert_fused_close(q, s, *reference(x, 256, **kw), max_fraction=0.01)
    assert all(torch.equal(a, b) for a, b in zip((q, s), quantize_turned(x, None, **kw)))
    zero = {"gate": torch.zeros(m, heads, device=device), "gate_factor": 2.0}
    assert all(torch.equal(a, b) for a, b in zip(quantize_turned(x, None, **zero, **launch), quantize_turned(x, None)))


def test_quantize_rows_sends_many_gated_rows_to_the_whole_rows_pass(device, monkeypatch):
    calls = []
    monkeypatch.setattr(int8_quant, "WHOLE_ROWS_MIN_M", 16)
    monkeypatch.setattr(int8_quant.quant_turned, "quantize_turned",
                        lambda *a, **kw: calls.append(kw["gate"] is not None) or quantize_turned(*a, **kw))
    x, kw = gate_inputs(16, 512, "feature", seed=3, device=device)
    q, s = quantize_rows(x, 256, **kw)
    assert calls == [True]
    assert_fused_close(q, s, *reference(x, 256, **kw), max_fraction=0.01)
    passes = quantize_rows(x, 256, **kw, choices=Choices(whole_rows=False))
    assert calls == [True]
    assert_fused_close(q, s, *passes, max_fraction=0.01)
    blockwise = quantize_rows(x, 256, **kw, choices=Choices(whole_rows_walking=0))  # a program a row block
    assert calls == [True, True] and torch.equal(blockwise[0], q) and torch.equal(blockwise[1], s)
    calls.pop()
    wide, wide_kw = gate_inputs(16, 256 * (int8_quant.WHOLE_ROWS_MAX_GROUPS + 2), "feature", seed=4, device=device)
    q, s = quantize_rows(wide, 256, **wide_kw)  # Krea 2's OUT rows (24 groups) take the rotate pass: faster
    assert calls == [True]
    assert_fused_close(q, s, *reference(wide, 256, **wide_kw), max_fraction=0.01)


def test_bad_gates_raise(device):
    x, kw = gate_inputs(4, 64, "head", seed=0, device=device)
    for bad in ({"gate": kw["gate"][:, :3]}, {"gate": kw["gate"][:3]}, {"gate": kw["gate"].t().contiguous().t()},
                {"gate": kw["gate"].long()}, {**kw, "norm": "rms", "scale": torch.zeros(1, 64, device=device),
                                              "row_map": torch.zeros(4, dtype=torch.long, device=device)},
                {**kw, "act": "gelu_tanh"}):
        with pytest.raises(ValueError, match="gate"):
            quantize_rows(x, 16, **bad)
    with pytest.raises(ValueError, match="gate"):
        quantize_rows(x, 256, **kw, turned="v")
    with pytest.raises(ValueError, match="turned"):
        quantize_turned(torch.zeros(4, 256, dtype=torch.bfloat16, device=device), "v",
                        gate=torch.zeros(4, 4, device=device))


@interpreted_only
def test_callers_take_the_kernel(monkeypatch):
    """The gate as dit_core/gpu/block.py (Krea 2's block: the gate a view of QKV's product) and pieces.py (LTX-2.5's
    per-head gate) hand it over, through the kernel (the op table's capability check opened to the CPU: the
    interpreter runs every quantize_rows) against the references a CPU runs otherwise: within 1e-2 (0.0 here)."""
    import kernels
    from dataclasses import replace
    from conftest import rel_err
    from dit_core.arch import Arch
    from dit_core.block import Attention, Block
    from dit_core.gpu.block import GpuBlock
    from dit_core.gpu.pieces import GpuAttention, attention_rows, into
    from dit_core.modulation import Modulation
    from dit_core.sequence import Sequence, sequence_of
    from dit_core.weights import Linear
    cpu, g = torch.device("cpu"), torch.Generator().manual_seed(4)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5)  # noqa: E731
    gain = lambda n: 1 + 0.2 * torch.randn(n, generator=g)  # noqa: E731
    a = Arch(family="test", hidden=256, layers=1, refiner=0, heads=4, head=64, ffn=512, latents=16, patch=(2, 2),
             text_dim=64, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-5, qk_eps=1e-5, final_eps=1e-6,
             rope_axes=(16, 24, 24), rope_theta=256.0, norm="rms", kv_heads=2, attn_gate=True)
    block = GpuBlock.of(Block((lin(a.qkv_width, 256), lin(256, 256), lin(1024, 256), lin(256, 512), gain(256),
                               gain(256), gain(64), gain(64), None, None)).quantized(), cpu)
    rows, mods = 40, Modulation(*(0.3 * torch.randn(1, 256, generator=g) for _ in range(4)))
    x = torch.randn(rows, 256, generator=g)
    seq = sequence_of(torch.randint(0, 16, (rows, 3), generator=g), torch.zeros(rows, dtype=torch.long),
                      a.rope_axes, a.rope_theta)
    ltx = replace(a, kv_heads=0, attn_gate=False, qk_norm="across", rope_axes=(64,))
    w = GpuAttention.of(Attention(*(lin(256, 256).as_int8(64) for _ in range(4)), gain(256), gain(256),
                                  lin(4, 256)), cpu)
    angles = torch.randn(rows, 4, 16, generator=g)
    ltx_seq = Sequence(torch.zeros(rows, dtype=torch.long), angles.cos(), angles.sin())

    def both():
        y = into(torch.zeros(rows, 256), attention_rows(ltx, w, x, x, ltx_seq, ltx_seq), w, torch.ones(1, 256),
                 torch.zeros(rows, dtype=torch.long))
        return block.forward(a, x.clone(), mods, seq), y
    want = both()
    monkeypatch.setitem(kernels.OPS, "quantize_rows", replace(kernels.OPS["quantize_rows"], capable=lambda d: None))
    for got, expected in zip(both(), want):
        assert rel_err(got, expected) <= 1e-2


ROWS = 4608  # a 1024^2 image's rows and a prompt's


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind,k,heads", [("feature", 6144, 48), ("head", 4096, 32), ("head", 2048, 32)])
@pytest.mark.parametrize("whole_rows", [True, False], ids=["whole-rows", "passes"])
def test_gate_at_real_shapes(kind, k, heads, whole_rows):
    """Krea 2's OUT rows (48 heads x 128; the gate a bf16 row view, as QKV's last columns), LTX-2.5's video
    (32 x 128) and audio (32 x 64) OUT rows with their per-head gates: each pass against the reference."""
    x, kw = gate_inputs(ROWS, k, kind, seed=k, device="cuda", heads=heads)
    q, s = quantize_rows(x, 256, **kw, out=poisoned_outputs(ROWS, k, "cuda"), choices=Choices(whole_rows=whole_rows))
    assert_fused_close(q, s, *reference(x, 256, **kw), max_fraction=1e-3)
