"""GpuBlock on the CPU (every kernel falls back to its plain-torch reference) against the host block: forward and
the parallel block (with and without the keys_values hook), INT8 against the INT8 emulation and BF16 against the
BF16 host block, each within 1e-2. tests/dit_core/test_block_gpu.py runs the same on the GPU (pytest -m gpu)."""
from dataclasses import replace

import pytest
import torch
from conftest import rel_err
from tiny_models import random_block

from dit_core.gpu import block as block_gpu
from dit_core.arch import Arch
from dit_core.block import DOWN, OUT, QKV, UP, Block
from dit_core.gpu.block import GpuBlock, NormStats
from dit_core.gpu.options import Options
from dit_core.modulation import Modulation
from dit_core.sequence import sequence_of
from dit_core.weights import Linear
from dit_core.sampling.step_cache import StepCache, joint_blocks
from kernels.int8.quant_turned import turned_rows

CPU = torch.device("cpu")
SMALL_CHUNKS = Options(mlp_chunk=64)  # several MLP chunks at these row counts


def arch(norm: str, rope_axes=(8, 12, 12)) -> Arch:
    """(8, 12, 12): rotary on half of each head, so QKV's product and head_norm_rope run apart; (16, 24, 24): every
    column turned, the fused QKV (and v turned for OUT: _turns_v)."""
    return Arch(family="test", hidden=256, layers=1, refiner=0, heads=4, head=64, ffn=512, latents=16, patch=(2, 2),
                text_dim=64, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-5, qk_eps=1e-5, final_eps=1e-6,
                rope_axes=rope_axes, rope_theta=256.0, norm=norm)


def inputs(a: Arch, rows: int, group: int):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, a.hidden, generator=g)
    mods = Modulation(*(0.3 * torch.randn(2, a.hidden, generator=g) for _ in range(4)),
                      attn_shift=0.1 * torch.randn(2, a.hidden, generator=g))
    row_map = (torch.arange(rows) >= rows // 3).long()
    seq = sequence_of(torch.randint(0, 64, (rows, 3), generator=g), row_map, a.rope_axes, a.rope_theta, group=group)
    return x, mods, seq


def hosts(block: Block):
    """(GpuBlock, host block, input dtype of the host) for INT8 and for BF16."""
    int8, bf16 = block.quantized(), block.dequantized(torch.bfloat16)
    return [(GpuBlock.of(int8, CPU), int8, torch.float64), (GpuBlock.of(bf16, CPU), bf16, torch.float32)]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Every GpuBlock call here runs with SMALL_CHUNKS unless it passes options of its own."""
    for name in ("forward", "parallel"):
        method = getattr(GpuBlock, name)
        monkeypatch.setattr(GpuBlock, name, lambda self, *args, options=None, _method=method, **kw: _method(
            self, *args, options=options or SMALL_CHUNKS, **kw))


@pytest.mark.parametrize("norm,sandwich", [("rms", True), ("rms", False), ("layer", False)])
@pytest.mark.parametrize("rows,group", [(150, 0), (128, 32)])
def test_forward_matches_host(norm, sandwich, rows, group):
    a = arch(norm)
    x, mods, seq = inputs(a, rows, group)
    for gpu, host, dtype in hosts(random_block(a, sandwich)):
        ref = host.forward(a, x.to(dtype), mods, seq).float()
        assert rel_err(gpu.forward(a, x.clone(), mods, seq), ref) <= 1e-2


@pytest.mark.parametrize("parallel", [False, True], ids=["forward", "parallel"])
def test_attention_wider_than_the_residual(parallel):
    """MiniMax H3's shape: attention heads x head wider than the residual (7168 over 5376 there; 384 over 256
    here), rotary on three quarters of each head (96 of 128 there: QKV's product and head_norm_rope run apart)."""
    a = replace(arch("rms", rope_axes=(16, 16, 16)), heads=6, inner=384)
    x, mods, seq = inputs(a, 150, 0)
    for gpu, host, dtype in hosts(random_block(a, sandwich=False, seed=7)):
        run = (lambda b, *args: b.parallel(*args)) if parallel else (lambda b, *args: b.forward(*args))
        ref = run(host, a, x.to(dtype), mods, seq).float()
        assert rel_err(run(gpu, a, x.clone(), mods, seq), ref) <= 1e-2


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("rows,group", [(150, 0), (128, 32)])
def test_parallel_matches_host(norm, rows, group):
    a = arch(norm)
    x, mods, seq = inputs(a, rows, group)
    for gpu, host, dtype in hosts(random_block(a, sandwich=False)):
        ref = host.parallel(a, x.to(dtype), mods, seq).float()
        before = x.clone()
        assert rel_err(gpu.parallel(a, x, mods, seq), ref) <= 1e-2
        assert torch.equal(x, before)  # a new tensor: the step cache reads x after the block


@pytest.mark.parametrize("group", [0, 32])
def test_parallel_hook_sees_the_host_keys_and_values(group):
    a = arch("layer")
    x, mods, seq = inputs(a, 128, group)
    seen = {}

    def record(name):
        def hook(k, v):
            seen[name] = (k.float(), v.float())
            return k, v
        return hook

    for gpu, host, dtype in hosts(random_block(a, sandwich=False, seed=3)):

        ref = host.parallel(a, x.to(dtype), mods, seq, record("host")).float()
        assert rel_err(gpu.parallel(a, x, mods, seq, record("gpu")), ref) <= 1e-2
        for ours, theirs in zip(seen["gpu"], seen["host"]):
            assert ours.shape == theirs.shape == (128, a.heads, a.head)
            assert rel_err(ours, theirs) <= 1e-2


def test_parallel_hook_may_add_keys_and_values():
    """Keys and values kept from another step (RefSlots): more key rows than query rows."""
    a = arch("layer")
    x, mods, seq = inputs(a, 100, 0)
    g = torch.Generator().manual_seed(5)
    extra = [torch.randn(40, a.heads, a.head, generator=g) for _ in range(2)]
    hook = lambda k, v: (torch.cat([k, extra[0].to(k.dtype)]), torch.cat([v, extra[1].to(v.dtype)]))  # noqa: E731
    for gpu, host, dtype in hosts(random_block(a, sandwich=False, seed=4)):
        ref = host.parallel(a, x.to(dtype), mods, seq, hook).float()
        assert rel_err(gpu.parallel(a, x, mods, seq, hook), ref) <= 1e-2
        assert rel_err(ref, host.parallel(a, x.to(dtype), mods, seq).float()) > 1e-2  # the hook mattered


class _KeepingInputs:
    """A GpuBlock that always keeps its input (the copy the in-place path saves)."""

    def __init__(self, block: GpuBlock):
        self.block = block

    def parallel(self, a, x, m, s, keys_values=None, keep_input=True, carry=None, options=None):
        return self.block.parallel(a, x, m, s, keys_values, keep_input=True, carry=carry, options=options)


def test_joint_blocks_in_place_equal_copies_under_the_step_cache():
    """joint_blocks lets blocks 2.. update their rows in place: StepCache reads only the inputs of blocks 0 and 1.
    Over steps that skip and steps that run, the outputs and decisions equal those of blocks that copy."""
    a = arch("layer")
    x, mods, seq = inputs(a, 96, 0)
    blocks = [GpuBlock.of(random_block(a, sandwich=False, seed=10 + i).quantized(), CPU) for i in range(4)]
    caches = StepCache(limit=0.3), StepCache(limit=0.3)
    g = torch.Generator().manual_seed(6)
    for change in (0.0, 1e-3, 1.0, 1e-3, 1e-3):  # small changes skip, the large one runs every block
        x_step = x + change * torch.randn(x.shape, generator=g)
        kept = x_step.clone()
        got = joint_blocks(blocks, a, x_step, mods, seq, lambda: None, 64, caches[0])
        want = joint_blocks([_KeepingInputs(b) for b in blocks], a, kept.clone(), mods, seq, lambda: None, 64,
                            caches[1])
        assert torch.equal(got, want) and torch.equal(x_step, kept)  # the step's input untouched
    assert caches[0].changes == caches[1].changes and caches[0].skipped == 2


@pytest.mark.parametrize("sandwich", [True, False])
def test_norm_statistics_carried_between_blocks(sandwich):
    """Two blocks with NormStats carried: the second block's first norm reads the statistics the first block's last
    kernel wrote (the gated-residual kernel after a sandwich norm, else DOWN's gated epilogue: no statistics
    launch), giving what the uncarried blocks give."""
    a = arch("rms")
    x, mods, seq = inputs(a, 150, 0)
    gpu = GpuBlock.of(random_block(a, sandwich).quantized(), CPU)
    plain = gpu.forward(a, gpu.forward(a, x.clone(), mods, seq), mods, seq)
    carry = NormStats.of(x)
    y = gpu.forward(a, x.clone(), mods, seq, carry)
    assert carry.ready
    assert rel_err(gpu.forward(a, y, mods, seq, carry), plain) <= 1e-6
    passes = Options(carry_norms=False)  # every norm's statistics by a pass of its own (the MLP's too)
    assert rel_err(gpu.forward(a, gpu.forward(a, x.clone(), mods, seq, options=passes), mods, seq, options=passes),
                   plain) <= 1e-6
    carry.values[1] *= 2  # the statistics are read: wrong ones change the block's output
    assert rel_err(gpu.forward(a, x.clone(), mods, seq, carry), gpu.forward(a, x.clone(), mods, seq)) > 1e-2


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norm_statistics_carried_between_parallel_blocks(norm):
    """Two parallel blocks with NormStats carried: the second block's norm reads the statistics the first block's
    gated DOWN product wrote with its output (next_norm), giving what the uncarried blocks give; a BF16 block
    writes none (ready stays False)."""
    a = arch(norm)
    x, mods, seq = inputs(a, 150, 0)
    gpu = GpuBlock.of(random_block(a, sandwich=False).quantized(), CPU)
    plain = gpu.parallel(a, gpu.parallel(a, x, mods, seq), mods, seq)
    carry = NormStats.of(x)
    y = gpu.parallel(a, x, mods, seq, carry=carry)
    assert carry.ready
    assert rel_err(gpu.parallel(a, y, mods, seq, carry=carry), plain) <= 1e-6
    carry.values[1] *= 2  # the statistics are read: wrong ones change the block's output
    assert rel_err(gpu.parallel(a, x, mods, seq, carry=carry), gpu.parallel(a, x, mods, seq)) > 1e-2
    GpuBlock.of(random_block(a, sandwich=False).dequantized(torch.bfloat16), CPU).parallel(a, x, mods, seq,
                                                                                          carry=carry)
    assert not carry.ready


@pytest.mark.parametrize("norm,sandwich", [("rms", True), ("layer", False)])
def test_v_turned_for_out(norm, sandwich):
    """The fused QKV turns v where OUT is INT8 ConvRot of 256 (_turns_v), and OUT's rows take the turned
    quantizer: forward and parallel still match the host block, whose v is not turned; a keys_values hook sees v
    turned and may add rows it kept from the same block."""
    a = arch(norm, rope_axes=(16, 24, 24))
    x, mods, _ = inputs(a, 128, 0)
    positions, row_map = torch.randint(0, 64, (128, 3), generator=torch.Generator().manual_seed(1)), torch.zeros(128)
    seq, first_rows = (sequence_of(positions[:n], row_map[:n].long(), a.rope_axes, a.rope_theta) for n in (128, 100))
    block = random_block(a, sandwich, seed=7)
    gpu, host = GpuBlock.of(block.quantized(), CPU), block.quantized()
    assert block_gpu._turns_v(a, gpu.w[QKV], gpu.w[OUT], seq)
    assert not block_gpu._turns_v(a, gpu.w[QKV], GpuBlock.of(block.dequantized(), CPU).w[OUT], seq)  # BF16 OUT
    ref = host.forward(a, x.double(), mods, seq).float()
    assert rel_err(gpu.forward(a, x.clone(), mods, seq), ref) <= 1e-2
    seen, kept = {}, {}

    def record(name):
        def hook(k, v):
            seen[name] = v.float()
            return k, v
        return hook
    ref = host.parallel(a, x.double(), mods, seq, record("host")).float()
    assert rel_err(gpu.parallel(a, x, mods, seq, record("gpu")), ref) <= 1e-2
    assert rel_err(seen["gpu"], turned_rows(seen["host"]).float()) <= 1e-2

    def keep(k, v):  # StepCache's refresh: the last 28 rows' keys and values kept, then given back
        kept.update(k=k[100:].clone(), v=v[100:].clone())
        return k, v
    whole = gpu.parallel(a, x, mods, seq, keep)
    for v_kept, err in ((kept["v"], 1e-3), (turned_rows(kept["v"]), None)):  # as kept; turned back (wrong)
        again = gpu.parallel(a, x[:100], mods, first_rows,
                             lambda k, v: (torch.cat([k, kept["k"]]), torch.cat([v, v_kept])))
        assert (rel_err(again, whole[:100]) <= err) if err else (rel_err(again, whole[:100]) > 1e-2)


@pytest.mark.parametrize("norm,sandwich", [("rms", True), ("layer", False)])
def test_hidden_rows_turned_for_down(norm, sandwich, monkeypatch):
    """UP's SwiGLU epilogue turns the hidden rows where UP and DOWN are INT8 and DOWN's groups are 256
    (_turns_hidden), and DOWN's quantizer takes them as turned: forward and parallel match the host block either
    way, and the turn changes the rows DOWN quantizes (so the path ran)."""
    a = arch(norm, rope_axes=(16, 24, 24))
    x, mods, seq = inputs(a, 128, 0)
    block = random_block(a, sandwich, seed=9)
    gpu, host = GpuBlock.of(block.quantized(), CPU), block.quantized()
    assert block_gpu._turns_hidden(gpu.w[UP], gpu.w[DOWN])
    assert not block_gpu._turns_hidden(gpu.w[UP], GpuBlock.of(block.dequantized(), CPU).w[DOWN])  # BF16 DOWN
    turned, run = [], block_gpu.run
    monkeypatch.setattr(block_gpu, "run", lambda op, *args, **kw: (
        turned.append(kw.get("turned")) if op == "quantize_rows" else None) or run(op, *args, **kw))
    outputs = {}
    for turn in (True, False):
        options = replace(SMALL_CHUNKS, turn_hidden=turn)
        turned.clear()
        for step in ("forward", "parallel"):
            ref = getattr(host, step)(a, x.double(), mods, seq).float()
            outputs[turn, step] = getattr(gpu, step)(a, x.clone(), mods, seq, options=options)
            assert rel_err(outputs[turn, step], ref) <= 1e-2, (turn, step)
        assert ("hidden" in turned) == turn
    for step in ("forward", "parallel"):
        assert not torch.equal(outputs[True, step], outputs[False, step])


def test_attention_gate_in_outs_quantizer(monkeypatch):
    """Krea 2's shape, grouped-query heads and an attention gate (the plain path, block_gpu._plain_heads): an INT8
    OUT's quantizer takes the gate in its prologue (quantize_rows gate=, a bf16 view of QKV's last columns), a BF16
    OUT's rows torch's gate. Both within 1e-2 of the host block; INT8 also against torch's bf16 gate before the
    quantizer (the previous form: the sigmoid rounded to bf16 once more), within 1e-2."""
    a = replace(arch("rms", rope_axes=(16, 24, 24)), kv_heads=2, attn_gate=True)
    g = torch.Generator().manual_seed(3)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5)  # noqa: E731
    gain = lambda n: 1 + 0.2 * torch.randn(n, generator=g)  # noqa: E731
    block = Block((lin(a.qkv_width, a.hidden), lin(a.hidden, a.width), lin(2 * a.ffn, a.hidden), lin(a.hidden, a.ffn),
                   gain(a.hidden), gain(a.hidden), gain(a.head), gain(a.head), None, None))
    x, mods, seq = inputs(a, 150, 0)
    gates, run = [], block_gpu.run
    monkeypatch.setattr(block_gpu, "run", lambda op, *args, **kw: (
        gates.append(kw.get("gate")) if op == "quantize_rows" else None) or run(op, *args, **kw))
    for gpu, host, dtype in hosts(block):
        ref = host.forward(a, x.to(dtype), mods, seq).float()
        assert rel_err(gpu.forward(a, x.clone(), mods, seq), ref) <= 1e-2
    gated = [t for t in gates if t is not None]
    assert len(gated) == 1 and gated[0].shape == (150, a.width) and gated[0].dtype == torch.bfloat16
    fused = GpuBlock.of(block.quantized(), CPU).forward(a, x.clone(), mods, seq)

    def torch_gate(op, *args, **kw):
        if op == "quantize_rows" and kw.get("gate") is not None:
            args = (args[0] * torch.sigmoid(kw.pop("gate")), *args[1:])
        return run(op, *args, **kw)
    monkeypatch.setattr(block_gpu, "run", torch_gate)
    assert rel_err(fused, GpuBlock.of(block.quantized(), CPU).forward(a, x.clone(), mods, seq)) <= 1e-2
