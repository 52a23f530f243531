"""LTX-2.5's GPU form (LTX25.to / gpu_form: layers through dit_core/gpu/pieces.py and the GPU block's linears)
against the host path: on the CPU where every kernel takes its reference, and on CUDA (pytest -m gpu). Sizes the
kernels take: heads of 128 (video) and 64 (audio), widths in ConvRot groups of 64."""
from dataclasses import replace

import pytest
import torch
from conftest import attention_8bit_launches, interpreted_only, rel_err
from safetensors.torch import save_file
from tiny_models import int8_convrot_state, ltx25_comfy_layout, random_ltx25

from dit_core.arch import Arch
from dit_core.block import Attention, attend, mlp, modulated_norm
from dit_core.families.ltx25 import LTX25
from dit_core.families.ltx25_positions import Grid, Guide
from dit_core.gpu.options import Options
from dit_core.gpu.pieces import GpuAttention, attention_rows, into, mlp_into
from dit_core.sequence import Sequence
from dit_core.weights import Linear
from dit_core.gpu.staging import staged_bytes
from dit_core.gpu.streaming import StreamedBlocks

pytest.importorskip("diffusers")

GPU_SIZES = dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=128,
                 cross_attention_dim=256, audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=2,
                 audio_attention_head_dim=64, audio_cross_attention_dim=128, num_layers=2)
# no prompt AdaLN, video FF biases, ungated video attentions, no keyframe marker (reference/families/ltx25.md 9)
VARIANT = dict(use_prompt_adaln_single=False, ff_bias=True, gated_attn=False, use_keyframes_abs_pos_embedding=False)
GRID = Grid(frames=3, height=2, width=3)
GUIDED = Grid(frames=2, height=2, width=3, guides=(Guide(16, 17, 0.5),))  # a guide frame: the self-attention bias
AUDIO_ROWS, TEXT_ROWS = 7, 6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ltx25_gpu")
    config = '{"transformer": {"num_attention_heads": 2, "audio_num_attention_heads": 2}}'
    for name, overrides in (("tiny", {}), ("variant", VARIANT)):
        state = ltx25_comfy_layout(random_ltx25(seed=4, **GPU_SIZES, **overrides))
        save_file(state, d / f"{name}.safetensors", metadata={"config": config})
        save_file(int8_convrot_state(state, lambda key: ".transformer_blocks." in key, group=64),
                  d / f"{name}_int8.safetensors", metadata={"config": config})
    return d


def inputs(grid: Grid = GRID, seed: int = 5):
    """forward's arguments: random rows, a padded prompt row, the first latent frame conditioned and marked."""
    g = torch.Generator().manual_seed(seed)
    video, audio = torch.randn(grid.rows, 16, generator=g), torch.randn(AUDIO_ROWS, 16, generator=g)
    text_video, text_audio = torch.randn(TEXT_ROWS, 256, generator=g), torch.randn(TEXT_ROWS, 128, generator=g)
    mask = torch.ones(TEXT_ROWS)
    mask[-1] = 0
    first = torch.zeros(grid.rows)
    first[:grid.height * grid.width] = 1
    return video, audio, text_video, text_audio, grid, 0.7, 0.45, first, mask, first.bool()


PIECES = Arch(family="ltx25", hidden=256, layers=1, refiner=0, heads=4, head=64, ffn=1024, latents=16, patch=(1,),
              text_dim=128, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-6, qk_eps=1e-6, final_eps=1e-6,
              rope_axes=(64,), rope_theta=1e4, mlp="gelu_tanh", qk_norm="across")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_pieces_match_the_host(device):
    """dit_core/gpu/pieces.py against dit_core/block.py's attend and mlp, each added under a gate of two modulation
    rows: self-attention with per-head angles and a [rows, rows] bias, cross-attention on prompt rows with a key mask,
    the GELU MLP in chunks; INT8 within 1e-2 of the host's emulation, BF16 within 1e-2 of f32 (6.1e-3 and 2.1e-3 on
    the CPU: SDPA's bf16 q, k, v)."""
    a, rows, keys, dev = PIECES, 40, 12, torch.device(device)
    g = torch.Generator().manual_seed(0)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5, 0.1 * torch.randn(n, generator=g))  # noqa
    gain = lambda: 1 + 0.2 * torch.randn(a.width, generator=g)  # noqa: E731
    self_attn = Attention(lin(256, 256), lin(256, 256), lin(256, 256), lin(256, 256), gain(), gain(), lin(4, 256))
    text_attn = Attention(lin(256, 256), lin(256, 128), lin(256, 128), lin(256, 256), gain(), gain(), None)
    up, down = lin(1024, 256), lin(256, 1024)
    angles = torch.randn(rows, a.heads, 16, generator=g) * 3
    row_map = (torch.arange(rows) >= 25).long()
    seq = Sequence(row_map, angles.cos(), angles.sin())
    x, h = torch.randn(rows, 256, generator=g), torch.randn(rows, 256, generator=g)
    context = torch.randn(keys, 128, generator=g)
    gate = 0.5 * torch.randn(2, 256, generator=g)
    table = 0.3 * torch.randn(2, 3, 256, generator=g)
    shift, scale = table[:, 0], table[:, 1]  # as table_plus's rows: views 3 D apart
    key_bias = torch.zeros(keys)
    key_bias[-3:] = -10000.0
    bias = torch.randn(rows, rows, generator=g)
    int8 = lambda w: Attention(*(t.as_int8(64) if isinstance(t, Linear) else t for t in  # noqa: E731
                                 (w.q, w.k, w.v, w.out, w.q_norm, w.k_norm)), w.head_gate)

    def host(make, lin_of):
        sa, ta = make(self_attn), make(text_attn)
        y = x + gate[row_map] * attend(a, sa, h, h, seq, seq, bias)
        y = y + gate[row_map] * attend(a, ta, h, context, key_bias=key_bias)
        hm = modulated_norm(a, y, None, shift, scale, row_map)
        return y + gate[row_map] * mlp(hm, lin_of(up), lin_of(down), "gelu_tanh")

    def gpu(make, lin_of, gelu_in_up=False):
        from dit_core.gpu.block import GpuLinear
        on = lambda t: t.to(dev)  # noqa: E731
        o, gt = Options(mlp_chunk=16, gelu_in_up=gelu_in_up), on(gate)
        m = row_map.to(dev, torch.int32 if dev.type == "cuda" else torch.long)
        sa, ta = GpuAttention.of(make(self_attn), dev), GpuAttention.of(make(text_attn), dev)
        y, hd, s = on(x).clone(), on(h), seq.to(dev)
        into(y, attention_rows(a, sa, hd, hd, s, s, on(bias), o), sa, gt, m, o)
        into(y, attention_rows(a, ta, hd, on(context), bias=on(key_bias), options=o), ta, gt, m, o)
        return mlp_into(a, y, on(shift), on(scale), m, GpuLinear.of(lin_of(up), dev), GpuLinear.of(lin_of(down), dev),
                        gt, o).cpu()

    q8 = lambda t: t.as_int8(64)  # noqa: E731
    assert rel_err(gpu(int8, q8), host(int8, q8)) <= 1e-2
    # the MLP in ComfyUI's groups of 256: GELU in UP's epilogue, its rows turned for DOWN's codes (_gelu_in_up)
    q256 = lambda t: t.as_int8(256)  # noqa: E731
    assert rel_err(gpu(int8, q256, gelu_in_up=True), host(int8, q256)) <= 1e-2
    assert rel_err(gpu(int8, q256), host(int8, q256)) <= 1e-2
    # formats mixed within an attention (q and k INT8, v and OUT BF16): each format's rows made from the input
    mixed = lambda w: Attention(w.q.as_int8(64), w.k.as_int8(64), w.v, w.out, w.q_norm, w.k_norm, w.head_gate)  # noqa
    assert rel_err(gpu(mixed, q8), host(mixed, q8)) <= 1e-2
    same = lambda t: t  # noqa: E731
    assert rel_err(gpu(same, same), host(same, same)) <= 1e-2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_stacked_projections_equal_separate_ones(device):
    """GpuAttention stacks q, k and v's rows where they are stored alike (one product of a self-attention's rows, one
    of the keys' for a cross one): the same heads as the three products apart, bit for bit (a product's row is its
    own dot products); q, k, v views of the stack, so a staged layer holds each row once."""
    from dit_core.gpu.block import GpuLinear
    from dit_core.gpu.pieces import stacked_rows
    a, rows, keys, dev = PIECES, 24, 10, torch.device(device)
    g = torch.Generator().manual_seed(3)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5, 0.1 * torch.randn(n, generator=g))  # noqa
    gain = lambda: 1 + 0.2 * torch.randn(a.width, generator=g)  # noqa: E731
    int8 = lambda *ls: tuple(t.as_int8(64) for t in ls)  # noqa: E731
    self_attn = Attention(*int8(lin(256, 256), lin(256, 256), lin(256, 256), lin(256, 256)), gain(), gain())
    cross = Attention(*int8(lin(256, 256), lin(256, 128), lin(256, 128), lin(256, 256)), gain(), gain())
    mixed = Attention(*int8(lin(256, 256), lin(256, 256)), lin(256, 256), lin(256, 256), gain(), gain())
    angles = torch.randn(rows, a.heads, 16, generator=g) * 3
    seq = Sequence(torch.zeros(rows, dtype=torch.long), angles.cos(), angles.sin()).to(dev)
    x, context = torch.randn(rows, 256, generator=g).to(dev), torch.randn(keys, 128, generator=g).to(dev)
    for w, stacks, ctx in ((self_attn, 1, x), (cross, 2, context), (mixed, 3, x)):
        stacked = GpuAttention.of(w, dev)
        apart = GpuAttention(tuple(GpuLinear.of(t, dev) for t in (w.q, w.k, w.v)), stacked.sizes, stacked.out,
                             stacked.q_norm, stacked.k_norm, None)
        assert len(stacked.projections) == stacks and len(apart.projections) == 3
        got, want = (attention_rows(a, w, x, ctx, seq, seq if ctx is x else None) for w in (stacked, apart))
        for t, u in zip(*((r,) if isinstance(r, torch.Tensor) else r[:2] for r in (got, want))):
            assert torch.equal(t, u)
        if stacks < 3:
            base = stacked.projections[-1].weight
            assert stacked.v.weight.data_ptr() == base.data_ptr() + base.nbytes - stacked.v.weight.nbytes
            assert staged_bytes(stacked) < staged_bytes(apart) + 512  # each row once (alignment aside)
    assert stacked_rows((self_attn.q, cross.k)) is None  # other inputs: not stacked


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_head_gate_in_outs_quantizer(device, monkeypatch):
    """An INT8 OUT takes the per-head gate 2 sigmoid(linear(x, head_gate)) in its quantizer's prologue: attention_rows
    returns OUT's rows (codes, scales, None), quantize_rows given the gate's f32 [rows, heads] and factor 2; a BF16 OUT
    gets torch's gated bf16 rows. The INT8 branch against torch's bf16 gate before the quantizer (the previous form,
    the sigmoid rounded once more): 8.3e-3 on the CPU, codes moving at INT8's own rounding (test_pieces_match_the_host
    gives 6.8e-3 from the host's INT8 emulation either way), so within INT8's 2e-2."""
    from dit_core.gpu import block as block_gpu
    a, rows, dev = PIECES, 40, torch.device(device)
    g = torch.Generator().manual_seed(2)
    lin = lambda n: Linear(torch.randn(n, 256, generator=g) / 16, 0.1 * torch.randn(n, generator=g))  # noqa: E731
    w = Attention(*(lin(256) for _ in range(4)), 1 + 0.2 * torch.randn(256, generator=g),
                  1 + 0.2 * torch.randn(256, generator=g), lin(4))
    w8 = Attention(*(t.as_int8(64) for t in (w.q, w.k, w.v, w.out)), w.q_norm, w.k_norm, w.head_gate)
    angles = torch.randn(rows, a.heads, 16, generator=g) * 3
    seq = Sequence(torch.zeros(rows, dtype=torch.long), angles.cos(), angles.sin()).to(dev)
    h, gate = torch.randn(rows, 256, generator=g).to(dev), torch.ones(1, 256, device=dev)
    m, o = torch.zeros(rows, dtype=torch.int32 if dev.type == "cuda" else torch.long, device=dev), Options()
    gates, run = [], block_gpu.run
    monkeypatch.setattr(block_gpu, "run", lambda op, *args, **kw: (
        gates.append(kw.get("gate")) if op == "quantize_rows" else None) or run(op, *args, **kw))
    sa = GpuAttention.of(w8, dev)
    heads = attention_rows(a, sa, h, h, seq, seq, options=o)
    assert isinstance(heads, tuple) and heads[2] is None
    assert gates[-1].shape == (rows, a.heads) and gates[-1].dtype == torch.float32
    assert isinstance(attention_rows(a, GpuAttention.of(w, dev), h, h, seq, seq, options=o), torch.Tensor)
    fused = into(torch.zeros(rows, 256, device=dev), heads, sa, gate, m, o)

    def torch_gate(op, *args, **kw):  # the previous form: torch's bf16 gate, then the plain quantizer
        if op == "quantize_rows" and kw.get("gate") is not None:
            sig = (2 * torch.sigmoid(kw.pop("gate")))[..., None].to(args[0].dtype)
            args = ((args[0].view(rows, a.heads, -1) * sig).view(rows, -1), *args[1:])
        return run(op, *args, **kw)
    monkeypatch.setattr(block_gpu, "run", torch_gate)
    before = into(torch.zeros(rows, 256, device=dev), attention_rows(a, sa, h, h, seq, seq, options=o), sa, gate, m, o)
    assert rel_err(fused.cpu(), before.cpu()) <= 2e-2


@pytest.mark.parametrize("name", ["tiny", "variant"])
@pytest.mark.parametrize("grid", [GRID, GUIDED], ids=["plain", "guide"])
def test_gpu_form_matches_the_host(files, name, grid):
    """The GPU form on the CPU (the kernels' references): BF16 linears within 1e-2 of the host f32 path; INT8 ConvRot
    linears within 1e-2 of the host's INT8 emulation and 3e-2 of f32."""
    f32, int8 = (LTX25.load(files / f"{name}{suffix}.safetensors") for suffix in ("", "_int8"))
    args = inputs(grid)
    want, emulated = f32.forward(*args), int8.forward(*args)
    bf16 = f32.gpu_form(torch.device("cpu"), f32.default_options())
    assert isinstance(bf16.blocks[0].a2v, GpuAttention) and not bf16.blocks[0].a2v.q.int8
    for got, w in zip(bf16.forward(*args), want):
        assert rel_err(got, w) <= 1e-2
    gpu = int8.gpu_form(torch.device("cpu"), int8.default_options())
    assert gpu.blocks[1].video.down.int8 and gpu.blocks[0].v2a.k.int8
    for got, e, w in zip(gpu.forward(*args), emulated, want):
        assert rel_err(got, e) <= 1e-2 and rel_err(got, w) <= 3e-2


def test_quantizers_take_bf16_rows(files, monkeypatch):
    """The INT8 GPU form's quantizers read bf16 rows (the modulated rows, the gated attention outputs, the MLP's
    hidden), none the residual through a norm in their prologue, so the one-pass forms (bf16 rows only) take them;
    the prompt's key rows (f32, a prompt's few) are the one exception."""
    from dit_core.gpu import block as block_gpu, pieces
    int8 = LTX25.load(files / "tiny_int8.safetensors")
    gpu = int8.gpu_form(torch.device("cpu"), int8.default_options())
    seen = []
    for module in (block_gpu, pieces):  # (pieces binds block's run by name)
        monkeypatch.setattr(module, "run", lambda op, *args, _run=module.run, **kw: (
            seen.append((args[0].dtype, args[0].shape[0], kw.get("norm"))) if op == "quantize_rows" else None)
            or _run(op, *args, **kw))
    gpu.forward(*inputs())
    assert seen and all(norm is None for _, _, norm in seen)
    assert {rows for dtype, rows, _ in seen if dtype != torch.bfloat16} == {TEXT_ROWS}


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=interpreted_only), pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_8bit_attention_stays_near_f32(files, device, monkeypatch):
    """Options.attention_8bit: the video self-attentions (heads of 128, no bias) on kernels/attention_8bit.py, the
    rest as before; within 6e-2 of f32 (e4m3 p v: ~3.5% an attention). On the CPU the attention kernel itself runs
    (Triton's interpreter), the other ops their references."""
    f32, int8 = (LTX25.load(files / f"tiny{suffix}.safetensors") for suffix in ("", "_int8"))
    args = inputs(GRID)
    want = f32.forward(*args)
    dev = torch.device(device)
    launched = []
    if dev.type == "cpu":  # the attention op's launcher (which picks the 8-bit kernel where it takes the rows)
        from dit_core.gpu import pieces
        launched = attention_8bit_launches(monkeypatch, pieces)
    options = replace(int8.default_options(), attention_8bit=True)
    eight = int8.to(dev, options=options) if dev.type == "cuda" else int8.gpu_form(dev, options)
    plain = int8.to(dev) if dev.type == "cuda" else int8.gpu_form(dev, int8.default_options())
    got, before = eight.forward(*args), plain.forward(*args)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 6e-2
    assert not torch.equal(got[0], before[0])  # the kernel ran: the video rows moved from SDPA's
    assert dev.type == "cuda" or len(launched) == 2  # a video self-attention a layer (audio's heads of 64: SDPA)


def test_streamed_layers_equal_resident(files):
    """Layers (both streams of a block and its A<->V attentions) streamed through one CPU slot, none resident: the
    GPU form's numbers and the host's, equal to resident."""
    host = LTX25.load(files / "tiny_int8.safetensors")
    args = inputs()
    one = staged_bytes(host.blocks[0].on(torch.device("cpu")))
    gpu = host.gpu_form(torch.device("cpu"), host.default_options())
    streamed = replace(gpu, blocks=StreamedBlocks(host.blocks, "cpu", one, form=lambda b, where: b.on(where),
                                                  slots=1))
    assert not any(streamed.blocks.resident) and streamed.blocks.slot_bytes == one
    for s, g in zip(streamed.forward(*args), gpu.forward(*args)):
        assert torch.equal(s, g)
    host_one = staged_bytes(host.blocks[0])
    assert all(host.to("cpu", budget_bytes=2 * host_one).blocks.resident)
    slotted = replace(host, blocks=StreamedBlocks(host.blocks, "cpu", host_one, slots=1))
    for s, g in zip(slotted.forward(*args), host.forward(*args)):
        assert torch.equal(s, g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("grid", [GRID, GUIDED], ids=["plain", "guide"])
def test_gpu_matches_host(files, grid):
    """LTX25.to('cuda'): the kernels' INT8 products within 1e-2 of the host's INT8 emulation and 3e-2 of f32, BF16
    linears within 1e-2 of f32; velocities back on the inputs' device; layers streamed through one slot equal to
    resident ones."""
    f32, int8 = (LTX25.load(files / f"tiny{suffix}.safetensors") for suffix in ("", "_int8"))
    args = inputs(grid)
    want, emulated = f32.forward(*args), int8.forward(*args)
    for got, w in zip(f32.to("cuda").forward(*args), want):
        assert rel_err(got, w) <= 1e-2
    model = int8.to("cuda")
    got = model.forward(*args)
    for g, e, w in zip(got, emulated, want):
        assert g.device.type == "cpu" and rel_err(g, e) <= 1e-2 and rel_err(g, w) <= 3e-2
    cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    resident = model.forward(*cuda_args)
    assert resident[0].is_cuda
    one = staged_bytes(int8.blocks[0].on(torch.device("cpu")))
    streamed = replace(int8.to("cuda", budget_bytes=10 * one),
                       blocks=StreamedBlocks(int8.blocks, "cuda", one, form=lambda b, where: b.on(where), slots=1))
    assert not any(streamed.blocks.resident)
    for s, r in zip(streamed.forward(*cuda_args), resident):
        assert torch.equal(s, r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("grid", [GRID, GUIDED], ids=["plain", "guide"])
def test_graphed_step_equals_eager(files, grid):
    """LTX25.graphed(): the blocks and final layers replayed from a CUDA graph give forward()'s velocities bit for
    bit, at the capture's sigmas and at others (the steps' rows copied in); with a layer streamed it runs eagerly."""
    from dit_core.gpu.step_graph import capture_refusal
    if capture_refusal():
        pytest.skip(capture_refusal())
    model = LTX25.load(files / "tiny_int8.safetensors").to("cuda")
    step = model.graphed()
    for sigmas in ((0.7, 0.45), (0.3, 0.2), (0.7, 0.45)):
        args = list(inputs(grid))
        args[5:7] = sigmas
        for got, want in zip(step(*args), model.forward(*args)):
            assert got.device.type == "cpu" and torch.equal(got, want)
    assert len(step.graphs[0].graphs) == 1 and next(iter(step.graphs[0].graphs.values())) is not None
    step.clear()
    host = LTX25.load(files / "tiny_int8.safetensors")
    one = staged_bytes(host.blocks[0].on(torch.device("cpu")))
    streamed = replace(host.to("cuda", budget_bytes=10 * one),
                       blocks=StreamedBlocks(host.blocks, "cuda", one, form=lambda b, where: b.on(where), slots=1))
    assert not any(streamed.blocks.resident)
    eager = streamed.graphed()
    for got, want in zip(eager(*inputs(grid)), streamed.forward(*inputs(grid))):
        assert torch.equal(got, want)
    assert not eager.graphs[0].graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_audio_beside_video_on_gpu(files):
    """Options.concurrent_modes: the audio's self, prompt and MLP branches on a side stream beside the video's,
    eager and graphed, give the one-stream step's velocities bit for bit."""
    from dit_core.gpu.step_graph import capture_refusal
    model = LTX25.load(files / "tiny_int8.safetensors").to("cuda")
    serial = replace(model, options=replace(model.options, concurrent_modes=False))
    beside = replace(model, options=replace(model.options, concurrent_modes=True))
    want = serial.forward(*inputs(GRID))
    assert all(torch.equal(got, w) for got, w in zip(beside.forward(*inputs(GRID)), want))
    if not capture_refusal():
        step = beside.graphed()
        assert all(torch.equal(got, w) for got, w in zip(step(*inputs(GRID)), want))
        step.clear()


def test_dequantized_layers_are_bf16_of_the_int8_weights(files):
    """LTXBlock.dequantized (the bench's fidelity reference): every INT8 linear as BF16 of its codes turned back,
    float ones as they are; the model then runs its BF16 path, close to the INT8 one."""
    int8 = LTX25.load(files / "tiny_int8.safetensors")
    bf16 = replace(int8, blocks=tuple(b.dequantized() for b in int8.blocks))
    q, dq = int8.blocks[0].video.self_attn.q, bf16.blocks[0].video.self_attn.q
    assert q.quantized and dq.weight.dtype == torch.bfloat16 and torch.equal(dq.weight, q.as_float().weight)
    assert bf16.blocks[1].audio.down.weight.dtype == torch.bfloat16 and not bf16.blocks[0].v2a.out.quantized
    assert bf16.blocks[0].video.self_attn.head_gate is int8.blocks[0].video.self_attn.head_gate
    for got, want in zip(bf16.forward(*inputs()), int8.forward(*inputs())):
        assert rel_err(got, want) <= 3e-2
