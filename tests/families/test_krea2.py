"""Krea 2 on the shared block (grouped-query attention, attention gate) vs diffusers 0.42.1
Krea2Transformer2DModel, tiny and random."""

import weakref
from dataclasses import replace

import pytest
import torch
from conftest import attention_8bit_launches, attention_plans, interpreted_only, rel_err
from safetensors.torch import save_file
from tiny_models import KREA2_TINY, int8_convrot_state, krea2_original_layout, random_krea2, random_z_image

from dit_core import load_family
from dit_core.gpu.block import GpuBlock
from dit_core.families.krea2 import SAMPLING_MU, Krea2, latent_format, pack_tokens, unpack_tokens
from dit_core.sampling.ksampler import ksample, prepare_noise, process_in, process_out
from dit_core.sampling.schedules import calculate_sigmas, flux_sigma_table
from dit_core.gpu.staging import staged_bytes
from dit_core.gpu.streaming import StreamedBlocks
from dit_core.weights import BlocksOnUse, FirstBlocks, HeaderOnly, WeightsError

diffusers = pytest.importorskip("diffusers")
from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers

C = KREA2_TINY["in_channels"] // 4
TAPS, TEXT = KREA2_TINY["num_text_layers"], KREA2_TINY["text_hidden_dim"]


@pytest.fixture(scope="module")
def model():
    return random_krea2()


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("krea2")
    state = krea2_original_layout(model.state_dict())
    save_file(state, d / "krea2_f32.safetensors")
    save_file(krea2_original_layout(model.state_dict(), "model.diffusion_model."), d / "krea2_prefixed.safetensors")
    linear = lambda key: ".attn." in key or ".mlp." in key  # noqa: E731 - the blocks' and text blocks' linears
    save_file(int8_convrot_state(state, linear, group=16), d / "krea2_int8_convrot.safetensors")
    return d


def diffusers_out(model, latent, sigma, text, mask=None):
    """diffusers' velocity for latent [C, H, W] as its pipeline feeds the model: packed tokens, text rows at the
    origin, image tokens at (0, h, w) of the packed grid."""
    c, h, w = latent.shape
    tokens = latent.reshape(1, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, -1, c * 4)
    ids = torch.zeros(text.shape[0] + tokens.shape[1], 3)
    grid = torch.cartesian_prod(torch.arange(h // 2), torch.arange(w // 2)).float()
    ids[text.shape[0]:, 1:] = grid
    with torch.no_grad():
        out = model(hidden_states=tokens, encoder_hidden_states=text[None], timestep=torch.tensor([sigma]),
                    position_ids=ids, encoder_attention_mask=None if mask is None else mask[None],
                    return_dict=False)[0]
    return out[0].reshape(h // 2, w // 2, c, 2, 2).permute(2, 0, 3, 1, 4).reshape(c, h, w)


def test_original_layout_converts_back_to_diffusers(model):
    """The test's own name map is diffusers' converter inverted: converting it back gives the model's state."""
    back = convert_krea2_transformer_checkpoint_to_diffusers(krea2_original_layout(model.state_dict(),
                                                                                   "model.diffusion_model."))
    state = model.state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_tokens_pack_channel_major_and_back():
    z = torch.randn(C, 6, 8)
    tokens = pack_tokens(z)
    assert tokens.shape == (12, 4 * C)
    assert tokens[1, 2 * 4 + 1 * 2 + 0] == z[2, 1, 2]  # token (0, 1), channel 2, patch row 1, column 0
    assert torch.equal(unpack_tokens(tokens, 6, 8), z)


@pytest.mark.parametrize("name", ["krea2_f32", "krea2_prefixed"])
def test_transformer_matches_diffusers(model, files, name):
    torch.manual_seed(3)
    latent, text = torch.randn(C, 6, 8), torch.randn(5, TAPS, TEXT)
    ours = load_family("krea2", files / f"{name}.safetensors")
    assert isinstance(ours, Krea2)
    assert (ours.arch.kv_heads, ours.text_arch.kv_heads, ours.arch.rope_axes) == (2, 1, (8, 12, 12))
    for sigma in (1.0, 0.6546, 0.3109):
        ref = diffusers_out(model, latent, sigma, text)
        assert rel_err(ours.output(latent, sigma, text), ref) <= 1e-5


def test_a_stand_in_of_first_blocks_runs_a_dry_pass(files):
    """What builds the first step's kernels beside a load (nodes/base.dit_loader): the file's first block of each
    stack (weights.FirstBlocks: the main blocks' and the text fusion's), through one pass as the sampler makes it
    (the text fused, then denoised)."""
    path = files / "krea2_int8_convrot.safetensors"
    whole, stand_in = Krea2.load(path), Krea2.load(FirstBlocks(path))
    assert (len(stand_in.blocks), len(stand_in.layerwise), len(stand_in.refiners)) == (1, 1, 1)
    assert len(whole.blocks) > 1 and stand_in.tables.shape[0] == 1
    assert stand_in.dry_pass(pixels=64, text_rows=5).shape == (1, whole.arch.latents, 8, 8)


def test_padded_text_rows_are_dropped_exactly(model, files):
    """diffusers masks the padded text rows as keys; ours drops them (section 2): the same velocity."""
    torch.manual_seed(4)
    latent, text = torch.randn(C, 4, 4), torch.randn(7, TAPS, TEXT)
    mask = torch.tensor([True] * 5 + [False] * 2)
    ref = diffusers_out(model, latent, 0.75, text, mask)
    ours = Krea2.load(files / "krea2_f32.safetensors")
    assert rel_err(ours.output(latent, 0.75, text, mask), ref) <= 1e-5
    assert rel_err(ours.output(latent, 0.75, text[:5]), ref) <= 1e-5
    assert rel_err(diffusers_out(model, latent, 0.75, text), ref) > 1e-3  # the padded rows do matter unmasked


def test_int8_convrot_file_close_to_float(model, files):
    torch.manual_seed(5)
    latent, text = torch.randn(C, 4, 6), torch.randn(5, TAPS, TEXT)
    ref = diffusers_out(model, latent, 0.5, text)
    int8 = Krea2.load(files / "krea2_int8_convrot.safetensors")
    assert int8.blocks[0].w[0].quantized and int8.layerwise[0].w[0].quantized
    err = rel_err(int8.output(latent, 0.5, text), ref)
    assert 1e-4 < err <= 3e-2  # INT8 noise is there, and small
    quantized = Krea2.load(files / "krea2_f32.safetensors", linears="int8")
    assert rel_err(quantized.output(latent, 0.5, text), ref) <= 3e-2
    back = Krea2.load(files / "krea2_int8_convrot.safetensors", linears="bf16")
    assert not back.blocks[0].w[0].quantized


def test_lora_merges_in_diffusers_and_file_names(model, files, tmp_path):
    """A LoRA on q (diffusers' PEFT names), the attention gate (kohya names with alpha) and a text fusion block's
    MLP up (the file's names): the same velocity as diffusers' model with W + strength (alpha / rank) B A."""
    import copy
    g = torch.Generator().manual_seed(12)
    (a_q, b_q), (a_g, b_g), (a_u, b_u) = (
        (0.1 * torch.randn(4, cols, generator=g), 0.1 * torch.randn(rows, 4, generator=g))
        for rows, cols in ((128, 128), (128, 128), (64, TEXT)))
    save_file({"transformer.transformer_blocks.1.attn.to_q.lora_A.weight": a_q,
               "transformer.transformer_blocks.1.attn.to_q.lora_B.weight": b_q,
               "lora_unet_blocks_0_attn_gate.lora_down.weight": a_g, "lora_unet_blocks_0_attn_gate.lora_up.weight": b_g,
               "lora_unet_blocks_0_attn_gate.alpha": torch.tensor(2.0),
               "diffusion_model.txtfusion.refiner_blocks.0.mlp.up.lora_A.weight": a_u,
               "diffusion_model.txtfusion.refiner_blocks.0.mlp.up.lora_B.weight": b_u}, tmp_path / "lora.safetensors")
    strength = 0.7
    oracle = copy.deepcopy(model)
    with torch.no_grad():
        oracle.transformer_blocks[1].attn.to_q.weight += strength * b_q @ a_q
        oracle.transformer_blocks[0].attn.to_gate.weight += strength * 2.0 / 4 * b_g @ a_g
        oracle.text_fusion.refiner_blocks[0].ff.up.weight += strength * b_u @ a_u
    latent, text = torch.randn(C, 4, 4, generator=g), torch.randn(5, TAPS, TEXT, generator=g)
    ours = Krea2.load(files / "krea2_f32.safetensors", loras=((tmp_path / "lora.safetensors", strength),))
    want = diffusers_out(oracle, latent, 0.5, text)
    assert rel_err(ours.output(latent, 0.5, text), want) <= 1e-5
    assert rel_err(diffusers_out(model, latent, 0.5, text), want) > 1e-3  # the LoRA moves the output
    save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 3072),
               "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(9216, 4)}, tmp_path / "flux_lora.safetensors")
    with pytest.raises(WeightsError, match="flux_lora.safetensors: a LoRA for another model"):
        Krea2.load(files / "krea2_f32.safetensors", loras=((tmp_path / "flux_lora.safetensors", 1.0),))


def test_bad_inputs_name_the_fix(model, files, tmp_path):
    ours = Krea2.load(files / "krea2_f32.safetensors")
    with pytest.raises(ValueError, match="multiples of 16 pixels"):
        ours.output(torch.randn(C, 5, 8), 0.5, torch.randn(3, TAPS, TEXT))
    with pytest.raises(ValueError, match="tapped layers"):
        ours.output(torch.randn(C, 4, 4), 0.5, torch.randn(3, TEXT))
    with pytest.raises(ValueError, match=r"is not \[4, H, W\]"):
        ours.output(torch.randn(C + 1, 4, 4), 0.5, torch.randn(3, TAPS, TEXT))
    from tiny_models import z_image_comfy_layout
    save_file(z_image_comfy_layout(random_z_image().state_dict()), tmp_path / "z_image.safetensors")
    with pytest.raises(WeightsError, match="not a Krea 2 diffusion model.*krea2_turbo_int8_convrot"):
        Krea2.load(tmp_path / "z_image.safetensors")
    with pytest.raises(ValueError, match="linears must be one of"):
        Krea2.load(files / "krea2_f32.safetensors", linears="fp4")


def test_ksampler_turbo_matches_diffusers_euler(model, files):
    """ComfyUI's KSampler (euler, simple, 4 steps) on Krea 2's ModelSamplingFlux table with Krea2.denoised, against
    diffusers' transformer under the flow-match Euler step x += (sigma_next - sigma) v from the same noise."""
    ours = Krea2.load(files / "krea2_f32.safetensors")
    text = torch.randn(5, TAPS, TEXT, generator=torch.Generator().manual_seed(9))
    empty = torch.zeros(1, C, 6, 8)
    got = ksample(ours.denoised, 42, 4, 1.0, "euler", "simple", empty, positive=ours.text_rows(text)[None],
                  latent_shift=0.0, latent_scale=1.0, sigma_table=flux_sigma_table(SAMPLING_MU))
    sigmas = calculate_sigmas("simple", 4, table=flux_sigma_table(SAMPLING_MU))
    x = prepare_noise(empty, 42)[0]
    for sigma, sigma_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        x = x + (sigma_next - sigma) * diffusers_out(model, x, sigma, text)
    assert rel_err(got[0], x) <= 1e-5


def test_blocks_stream_within_a_budget(tmp_path):
    """Krea2.to(device, budget_bytes): one of four blocks resident, the others through the two streaming slots (on
    the CPU: host blocks, the same numerics): the same velocity bit for bit."""
    save_file(krea2_original_layout(random_krea2(seed=11, num_layers=4).state_dict()), tmp_path / "k.safetensors")
    model = Krea2.load(tmp_path / "k.safetensors", linears="int8")
    size = staged_bytes(model.blocks[0])
    streamed = model.to("cpu", budget_bytes=3 * size)  # two streaming slots and one resident block
    assert isinstance(streamed.blocks, StreamedBlocks) and sum(streamed.blocks.resident) == 1
    g = torch.Generator().manual_seed(10)
    latent, text = torch.randn(C, 4, 6, generator=g), torch.randn(5, TAPS, TEXT, generator=g)
    assert torch.equal(streamed.output(latent, 0.5, text), model.output(latent, 0.5, text))


def test_blocks_read_as_they_are_placed_leave_no_host_copy(tmp_path, monkeypatch):
    """Krea2.load(blocks_on_use=True) of an INT8 ConvRot file: the blocks' checks run on the header at load (the
    weights as meta tensors: the tiny model's count as large here), each block is read once as StreamedBlocks places
    it (its layout from the header; the next read while one is placed), and at most two blocks read before are alive
    when the next is read (the host holds no copy of the model); the placed blocks run bit for bit as the eagerly
    read ones (GPU blocks on the CPU: the kernels' references), with a LoRA merged into a part of a stacked INT8
    linear too."""
    monkeypatch.setattr(HeaderOnly, "SMALL", 1024)
    state = krea2_original_layout(random_krea2(seed=11, num_layers=4).state_dict())
    path = tmp_path / "k.safetensors"
    save_file(int8_convrot_state(state, lambda key: ".attn." in key or ".mlp." in key, group=16), path)
    eager, lazy = Krea2.load(path), Krea2.load(path, blocks_on_use=True)
    assert isinstance(eager.blocks, tuple) and isinstance(lazy.blocks, BlocksOnUse)
    assert all(b.w[0].weight.is_meta for b in lazy.blocks.shapes)
    read, reads, alive = lazy.blocks.read, [], []

    def tracked(i):
        assert sum(r() is not None for r in alive) <= 2, f"more blocks than two held when block {i} is read"
        block = read(i)
        reads.append(i)
        alive.append(weakref.ref(block.w[0].weight))
        return block
    lazy.blocks.read = tracked
    cpu, size = torch.device("cpu"), staged_bytes(GpuBlock.of(eager.blocks[0], torch.device("cpu")))
    placed = lambda m: replace(m, blocks=StreamedBlocks(m.blocks, cpu, 3 * size, form=GpuBlock.of))  # noqa: E731
    eager_placed, lazy_placed = placed(eager), placed(lazy)
    assert sorted(reads) == [0, 1, 2, 3] and 0 < sum(lazy_placed.blocks.resident) < 4
    g = torch.Generator().manual_seed(10)
    latent, text = torch.randn(C, 4, 6, generator=g), torch.randn(5, TAPS, TEXT, generator=g)
    assert torch.equal(lazy_placed.output(latent, 0.5, text), eager_placed.output(latent, 0.5, text))
    save_file({"diffusion_model.blocks.1.attn.wq.lora_A.weight": torch.randn(2, 128),
               "diffusion_model.blocks.1.attn.wq.lora_B.weight": torch.randn(128, 2)}, tmp_path / "lora.safetensors")
    merged = [Krea2.load(path, loras=((tmp_path / "lora.safetensors", 1.0),), blocks_on_use=on_use)
              for on_use in (False, True)]
    assert isinstance(merged[1].blocks, BlocksOnUse) and merged[1].blocks.shapes[1].w[0].weight.is_meta
    assert torch.equal(merged[0].blocks[1].w[0].weight, merged[1].blocks[1].w[0].weight)
    assert torch.equal(merged[0].blocks[1].w[0].scale, merged[1].blocks[1].w[0].scale)
    bad = dict(state, **{"blocks.2.attn.wq.weight": state["blocks.2.attn.wq.weight"][:-1]})
    save_file(bad, tmp_path / "bad.safetensors")
    with pytest.raises(WeightsError, match="blocks.2.attn"):
        Krea2.load(tmp_path / "bad.safetensors", blocks_on_use=True)


def test_latent_format_is_comfy_wan21(comfy):
    """Krea 2's latents as ComfyUI's Wan21 format takes them in and out ([B, 16, 1, H, W] there, one frame)."""
    z = 3 * torch.randn(2, 16, 5, 7)
    shift, scale = latent_format()
    wan21 = comfy.latent_formats.Wan21()
    torch.testing.assert_close(process_in(z, shift, scale), wan21.process_in(z[:, :, None])[:, :, 0])
    torch.testing.assert_close(process_out(z, shift, scale), wan21.process_out(z[:, :, None])[:, :, 0])


# A model whose linears the GPU kernels take as INT8 ConvRot at load (K of 64 or more: groups of 64 and 256).
GPU_SIZES = dict(attention_head_dim=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                 text_hidden_dim=64, text_num_attention_heads=2, text_intermediate_size=128,
                 axes_dims_rope=(16, 24, 24))
# INT8 on the GPU against the host's INT8 emulation: the kernels round the rotated rows to bf16 before the codes (as
# ComfyUI does, format doc section 5) and the emulation does not, so some codes differ by one and the difference
# grows through this small model (57 rows) to about INT8's own distance from BF16: 1.03e-2 through the kernels'
# references on the CPU (host INT8 against host BF16: 1.04e-2).
INT8_BOUND = 2e-2


@pytest.fixture(scope="module")
def gpu_sized(tmp_path_factory):
    """(file, latent, text, mask) of a model of GPU_SIZES."""
    path = tmp_path_factory.mktemp("krea2_gpu") / "krea2.safetensors"
    save_file(krea2_original_layout(random_krea2(seed=7, **GPU_SIZES).state_dict()), path)
    g = torch.Generator().manual_seed(8)
    return (path, torch.randn(C, 16, 12, generator=g), torch.randn(9, TAPS, GPU_SIZES["text_hidden_dim"], generator=g),
            torch.tensor([True] * 7 + [False] * 2))


def test_gpu_blocks_on_the_cpu_match_host(gpu_sized):
    """The GPU block's plain attention path (grouped-query heads and a gate: block_gpu._plain_heads) with the kernels'
    plain-torch references, as a CPU runs GpuBlocks, against the host blocks."""
    path, latent, text, mask = gpu_sized
    for linears, bound in (("bf16", 1e-2), ("int8", INT8_BOUND)):
        host = Krea2.load(path, linears=linears)
        on_cpu = lambda blocks: tuple(GpuBlock.of(b, torch.device("cpu")) for b in blocks)  # noqa: E731
        blocks = replace(host, layerwise=on_cpu(host.layerwise), refiners=on_cpu(host.refiners),
                         blocks=on_cpu(host.blocks))
        want = host.output(latent.double(), 0.6546, text.double(), mask).float()
        assert rel_err(blocks.output(latent, 0.6546, text, mask), want) <= bound, linears


def test_text_fusion_attends_without_per_shape_plans(gpu_sized, monkeypatch):
    """The text fusion's blocks (their shapes change with every prompt's length) ask SDPA for its unplanned back ends
    (cuDNN builds a plan for each new shape, 40-55 ms on an H100); the image step's blocks keep cuDNN first."""
    from dit_core.gpu.options import Options
    path, latent, text, mask = gpu_sized
    host = Krea2.load(path, linears="bf16")
    on_cpu = lambda blocks: tuple(GpuBlock.of(b, torch.device("cpu")) for b in blocks)  # noqa: E731
    gpu = replace(host, layerwise=on_cpu(host.layerwise), refiners=on_cpu(host.refiners), blocks=on_cpu(host.blocks),
                  options=Options())
    asked = attention_plans(monkeypatch)
    txt = gpu.text_rows(text, mask)
    assert asked == [False] * (len(host.layerwise) + len(host.refiners))
    asked.clear()
    gpu.velocity(latent, 0.6546, txt)
    assert asked == [True] * len(host.blocks)


@interpreted_only
def test_8bit_attention_in_the_plain_heads_path(tmp_path, monkeypatch):
    """Options.attention_8bit reaches Krea 2's grouped-query, gated attention (the GPU block's plain path): the 8-bit
    kernel itself (Triton's interpreter on the CPU; heads of 128) runs in every block and the output stays within
    6e-2 of the host's f64 model."""
    from dit_core.gpu import block
    from dit_core.gpu.options import Options
    sizes = {**GPU_SIZES, "attention_head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
             "axes_dims_rope": (32, 48, 48)}
    path = tmp_path / "krea2.safetensors"
    save_file(krea2_original_layout(random_krea2(seed=7, **sizes).state_dict()), path)
    g = torch.Generator().manual_seed(8)
    latent, text = torch.randn(C, 16, 12, generator=g), torch.randn(9, TAPS, GPU_SIZES["text_hidden_dim"], generator=g)
    mask = torch.tensor([True] * 7 + [False] * 2)
    host = Krea2.load(path, linears="int8")
    want = host.output(latent.double(), 0.6546, text.double(), mask).float()
    launched = attention_8bit_launches(monkeypatch, block)
    on_cpu = lambda blocks: tuple(GpuBlock.of(b, torch.device("cpu")) for b in blocks)  # noqa: E731
    gpu = replace(host, layerwise=on_cpu(host.layerwise), refiners=on_cpu(host.refiners), blocks=on_cpu(host.blocks),
                  options=Options(attention_8bit=True))
    assert rel_err(gpu.output(latent, 0.6546, text, mask), want) <= 6e-2
    assert len(launched) == len(host.blocks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_host(gpu_sized):
    """Krea2.to('cuda'): the INT8 kernels with the plain grouped-query, gated attention against the host's INT8
    emulation in f64 (INT8_BOUND) and the host's BF16 model (3e-2); BF16 linears on the GPU within 1e-2 of the
    host's."""
    path, latent, text, mask = gpu_sized
    int8, bf16 = (Krea2.load(path, linears=m) for m in ("int8", "bf16"))
    emulated = int8.output(latent.double(), 0.6546, text.double(), mask).float()
    want_bf16 = bf16.output(latent, 0.6546, text, mask)
    got = int8.to("cuda").output(latent.cuda(), 0.6546, text.cuda(), mask.cuda()).cpu()
    assert rel_err(got, emulated) <= INT8_BOUND
    assert rel_err(got, want_bf16) <= 3e-2
    got_bf16 = bf16.to("cuda").output(latent.cuda(), 0.6546, text.cuda(), mask.cuda()).cpu()
    assert rel_err(got_bf16, want_bf16) <= 1e-2


def test_denoised_runs_the_step_it_is_given_and_graphed_is_velocity_on_the_cpu(gpu_sized):
    """The sampler hands denoised its graphed step (graphed(): on the CPU velocity itself); the step sees each
    latent of the batch with sigma, its text rows and the references."""
    path, latent, text, mask = gpu_sized
    model = Krea2.load(path, linears="bf16")
    assert model.graphed() == model.velocity
    txt, seen = model.text_rows(text, mask), []

    def step(x, sigma, rows, check=None, *, refs=()):
        seen.append((tuple(x.shape), sigma, rows is txt, refs))
        return model.velocity(x, sigma, rows, check, refs=refs)

    x = torch.stack([latent, -latent])
    got = model.denoised(x, 0.6546, txt[None], step=step)
    assert torch.equal(got, model.denoised(x, 0.6546, txt[None]))
    assert seen == [((C, 16, 12), 0.6546, False, ())] * 2  # each row of txt[None], as denoised takes it


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_step_replays_the_eager_step(gpu_sized):
    """Krea2.graphed() on the GPU: a captured step per shape, equal to the eager velocity bit for bit, for two
    sigmas (an input of the graph, not a constant in it); with a reference it runs eagerly; its text fusion is
    made once a tensor."""
    path, latent, text, mask = gpu_sized
    model = Krea2.load(path, linears="int8").to("cuda")
    txt, latent = model.text_rows(text.cuda(), mask.cuda()), latent.cuda()
    step = model.graphed()
    for sigma in (0.6546, 0.25):
        assert torch.equal(step(latent, sigma, txt), model.velocity(latent, sigma, txt))
    assert len(step.graphs[0].graphs) == 1 and next(iter(step.graphs[0].graphs.values())) is not None
    ref = (latent[:, :8, :8],)
    assert torch.equal(step(latent, 0.5, txt, refs=ref), model.velocity(latent, 0.5, txt, refs=ref))
    rows = text.cuda()  # the text fusion kept across sampler runs: made once for the same tensor
    kept = step.text_rows(rows, torch.float32)
    assert torch.equal(kept, model.text_rows(rows)) and step.text_rows(rows, torch.float32) is kept
    step.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_prompt_of_another_length_builds_no_kernel(gpu_sized):
    """The whole INT8 step (gated attention in the OUT quantizer, grouped-query heads, the text fused once) at 9
    prompt rows, then at 8 and 16 (rows past the image's of another divisibility by 16): no Triton kernel built again
    (kernels/jit.py), as a new prompt in the server should find them."""
    from triton import knobs
    path, latent, text, mask = gpu_sized
    model = Krea2.load(path, linears="int8").to("cuda")
    latent = latent.cuda()
    model.velocity(latent, 0.5, model.text_rows(text.cuda(), mask.cuda()))
    built, previous = [], knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda *, fn, key, **_: built.append(fn.name) and False
    try:
        for rows in (8, 16):
            longer = torch.randn(rows, *text.shape[1:], generator=torch.Generator().manual_seed(rows)).cuda()
            model.velocity(latent, 0.5, model.text_rows(longer, torch.ones(rows, dtype=torch.bool, device="cuda")))
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = previous
    assert not built, built
