"""Z-Image on the shared block vs diffusers 0.42.1 ZImageTransformer2DModel on a tiny random instance."""

from dataclasses import replace

import pytest
import torch
from conftest import attention_plans, rel_err
from safetensors.torch import save_file
from tiny_models import Z_IMAGE_TINY, int8_convrot_state, random_z_image, z_image_comfy_layout

from dit_core.block import LINEARS
from dit_core.codecs.flux1_vae import SCALING, SHIFT
from dit_core.families.z_image import ZImage, stacked
from dit_core.weights import FirstBlocks, WeightsError

diffusers = pytest.importorskip("diffusers")
from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers
from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel


@pytest.fixture(scope="module")
def reference():
    model = random_z_image()
    state = z_image_comfy_layout(model.state_dict())
    state["norm_final.weight"] = torch.randn(Z_IMAGE_TINY["dim"])  # present in ComfyUI's file, unused
    return model, state


@pytest.fixture(scope="module")
def files(reference, tmp_path_factory):
    model, state = reference
    d = tmp_path_factory.mktemp("z_image")
    save_file(state, d / "z_image_f32.safetensors")
    save_file({"model.diffusion_model." + k: v.bfloat16() for k, v in state.items()}, d / "z_image_bf16.safetensors")
    int8 = int8_convrot_state(state, lambda key: ".attention." in key or ".feed_forward." in key)
    save_file(int8, d / "z_image_int8_convrot.safetensors")
    return d


def diffusers_out(model, latent, sigma, caption):
    with torch.no_grad():
        out = model(x=[latent[:, None]], t=torch.tensor([1.0 - sigma]), cap_feats=[caption], return_dict=False)[0]
    return out[0][:, 0]


def test_mapping_round_trips_through_diffusers_converter(reference):
    model, state = reference
    converted = convert_z_image_transformer_checkpoint_to_diffusers(dict(state))
    fresh = ZImageTransformer2DModel(**Z_IMAGE_TINY)
    fresh.load_state_dict(converted, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


@pytest.mark.parametrize("size,caption_len", [((8, 8), 32), ((8, 8), 7), ((6, 10), 45), ((2, 2), 1)])
def test_forward_matches_diffusers(reference, files, size, caption_len):
    model, _ = reference
    ours = ZImage.load(files / "z_image_f32.safetensors")
    torch.manual_seed(1)
    latent, caption = torch.randn(4, *size), torch.randn(caption_len, 32)
    for sigma in (1.0, 0.6429):
        expected = diffusers_out(model, latent, sigma, caption)
        assert rel_err(ours.output(latent, sigma, caption), expected) <= 1e-5


def test_stacked_modulation_linears_give_each_blocks_rows(reference, files):
    """ZImage.to(GPU) stacks the modulation linears (mod_stack: one product a step); the stacked rows give every
    block's Modulation as the linears one by one do, and the diffusers match holds with them."""
    model, _ = reference
    ours = ZImage.load(files / "z_image_f32.safetensors")
    stack, views = stacked(ours.noise_mods + ours.mods, torch.device("cpu"))
    fast = replace(ours, noise_mods=views[:len(ours.noise_mods)], mods=views[len(ours.noise_mods):], mod_stack=stack)
    temb = ours.time_embedding(ours.timestep(0.5), torch.float32)
    for one, each in zip(fast.modulations(temb), ours.modulations(temb), strict=True):
        for field in ("attn_scale", "attn_gate", "mlp_scale", "mlp_gate"):
            torch.testing.assert_close(getattr(one, field), getattr(each, field), rtol=1e-6, atol=1e-6)
    latent, caption = torch.randn(4, 8, 8), torch.randn(12, 32)
    assert rel_err(fast.output(latent, 0.5, caption), diffusers_out(model, latent, 0.5, caption)) <= 1e-5


def test_arch_read_from_file(files):
    a = ZImage.load(files / "z_image_f32.safetensors").arch
    assert (a.hidden, a.heads, a.head, a.layers, a.refiner, a.ffn, a.latents, a.text_dim) == (192, 6, 32, 2, 1, 512, 4, 32)
    assert (a.time_dim, a.time_hidden, a.rope_axes) == (192, 1024, (8, 12, 12))


def test_a_stand_in_of_first_blocks_runs_a_dry_pass(files):
    """What builds the first step's kernels beside a load (nodes/base.dit_loader): the file's first block of each
    stack (weights.FirstBlocks), the model's own sizes otherwise, through one pass as the sampler makes it."""
    whole = ZImage.load(files / "z_image_int8_convrot.safetensors")
    stand_in = ZImage.load(FirstBlocks(files / "z_image_int8_convrot.safetensors"))
    assert (len(stand_in.blocks), len(stand_in.noise), len(stand_in.context)) == (1, 1, 1) and len(whole.blocks) == 2
    assert replace(stand_in.arch, layers=whole.arch.layers) == whole.arch
    assert all(torch.equal(a.weight, b.weight) for a, b in zip(stand_in.blocks[0].w, whole.blocks[0].w)
               if hasattr(a, "weight"))
    assert stand_in.dry_pass(pixels=64, text_rows=5).shape == (1, whole.arch.latents, 8, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernels_built_beside_the_load_leave_the_first_step_none(files, monkeypatch, caplog, fresh_kernel_caches):
    """builds.built_beside on the GPU as ComfyUI calls it (in inference mode, every tensor through the loads'
    carrier, whose buffers the caller made first): the stand-in's dry pass builds every kernel the whole model's
    first pass launches (on Hopper, where kernels build ahead at all), and says nothing failed."""
    import logging

    from dit_core.gpu import staging
    from dit_core.gpu.builds import build_ahead, built_beside
    monkeypatch.setattr(staging, "CARRIER", staging.Carrier())
    monkeypatch.setattr(staging, "CARRIED", 1)
    path, cuda = files / "z_image_int8_convrot.safetensors", torch.device("cuda")
    with torch.inference_mode(), caplog.at_level(logging.INFO):
        staging.to_card(torch.zeros(8), cuda)
        beside = built_beside(lambda: ZImage.load(FirstBlocks(path), compute_on=cuda).to(cuda),
                              lambda model: model.dry_pass(pixels=256), cuda)
        whole = ZImage.load(path, compute_on=cuda).to(cuda)
        beside.join()
        after = build_ahead(lambda: whole.dry_pass(pixels=256), cuda)
    assert beside.built.kernels and after.kernels == 0 and after.stopped is None
    assert not [r for r in caplog.records if "not built" in r.getMessage()]


def test_prefixed_bf16_file_loads(reference, files):
    model, _ = reference
    ours = ZImage.load(files / "z_image_bf16.safetensors")
    latent, caption = torch.randn(4, 8, 6), torch.randn(9, 32)
    assert rel_err(ours.output(latent, 0.5, caption), diffusers_out(model, latent, 0.5, caption)) < 2e-2


def test_int8_forward_close_to_float(files):
    latent, caption = torch.randn(4, 8, 8), torch.randn(12, 32)
    plain = ZImage.load(files / "z_image_f32.safetensors")
    quantized = ZImage.load(files / "z_image_f32.safetensors", linears="int8")
    stored = ZImage.load(files / "z_image_int8_convrot.safetensors")
    assert all(b.w[0].quantized for b in stored.blocks + stored.noise + stored.context)
    ref = plain.output(latent, 0.75, caption)
    err = rel_err(stored.output(latent, 0.75, caption), ref)
    assert 1e-4 < err <= 3e-2  # INT8 noise is there, and small
    # Quantized at load, each linear takes the file's codes and scales where it takes the file's group (64); the
    # others (K 512: group 256 at load) differ, and the model stays as close to the file's as INT8 noise allows.
    same_group = 0
    for file_block, load_block in zip(stored.blocks + stored.noise + stored.context,
                                      quantized.blocks + quantized.noise + quantized.context):
        for file_linear, load_linear in ((file_block.w[i], load_block.w[i]) for i in LINEARS):
            if not file_linear.quantized or file_linear.group != load_linear.group:
                continue
            assert torch.equal(file_linear.weight, load_linear.weight)
            assert torch.equal(file_linear.scale, load_linear.scale)
            same_group += 1
    assert same_group >= 3 * len(stored.blocks + stored.noise + stored.context)  # QKV, OUT, UP at least
    assert 0 < rel_err(quantized.output(latent, 0.75, caption), stored.output(latent, 0.75, caption)) <= 3e-2
    # INT8 file dequantized to BF16 stays close to the float model too.
    back = ZImage.load(files / "z_image_int8_convrot.safetensors", linears="bf16")
    assert not back.blocks[0].w[0].quantized
    assert rel_err(back.output(latent, 0.75, caption), ref) <= 3e-2


def test_denoised_is_x_plus_sigma_out(files):
    ours = ZImage.load(files / "z_image_f32.safetensors")
    x, cond = torch.randn(2, 4, 4, 4), torch.randn(1, 5, 32)
    x0 = ours.denoised(x, 0.3, cond)
    assert torch.allclose(x0[1], x[1] + 0.3 * ours.output(x[1], 0.3, cond[0]))
    sigmas = []  # a given step (the graphed one on a GPU) replaces output(), once per image
    step = lambda latent, sigma, caption, check: sigmas.append(sigma) or ours.output(latent, sigma, caption)
    assert torch.equal(ours.denoised(x, 0.3, cond, step=step), x0) and sigmas == [0.3, 0.3]


def test_bad_inputs_name_what_is_wrong(files, tmp_path):
    ours = ZImage.load(files / "z_image_f32.safetensors")
    with pytest.raises(ValueError, match="patch grid"):
        ours.output(torch.randn(4, 7, 8), 1.0, torch.randn(3, 32))
    with pytest.raises(ValueError, match="conditioning"):
        ours.output(torch.randn(4, 8, 8), 1.0, torch.randn(3, 64))
    with pytest.raises(ValueError, match="latent_image"):
        ours.output(torch.randn(16, 8, 8), 1.0, torch.randn(3, 32))
    other = tmp_path / "flux_vae.safetensors"
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, other)
    with pytest.raises(WeightsError, match="flux_vae.safetensors: not a Z-Image"):
        ZImage.load(other)
    from safetensors.torch import load_file
    state = load_file(files / "z_image_f32.safetensors")
    del state["layers.1.feed_forward.w2.weight"]
    save_file(state, tmp_path / "broken.safetensors")
    with pytest.raises(WeightsError, match="broken.safetensors: tensor 'layers.1.feed_forward.w2.weight' is missing"):
        ZImage.load(tmp_path / "broken.safetensors")
    with pytest.raises(ValueError, match="linears"):
        ZImage.load(files / "z_image_f32.safetensors", linears="fp4")


def _merged_state(state, updates):
    """The float state with each (ComfyUI key, first row, A, B, factor) update added: the LoRA oracle."""
    out = dict(state)
    for key, first, down, up, factor in updates:
        w = out[key].clone()
        w[first:first + up.shape[0]] += factor * (up @ down)
        out[key] = w
    return out


def test_lora_merges_in_every_key_form(files, tmp_path):
    from safetensors.torch import load_file
    state = load_file(files / "z_image_f32.safetensors")
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05
    dim, rank = 192, 4
    a_q, b_q, a_o, b_o, a_w1, b_w1, a_w2, b_w2 = r(rank, dim), r(dim, rank), r(rank, dim), r(dim, rank), \
        r(rank, dim), r(512, rank), r(rank, 512), r(dim, rank)
    lora = {  # diffusers names (PEFT), ComfyUI names (kohya underscores with alpha), generic dotted names
        "diffusion_model.layers.0.attention.to_k.lora_A.weight": a_q,
        "diffusion_model.layers.0.attention.to_k.lora_B.weight": b_q,
        "transformer.layers.1.attention.to_out.0.lora_A.weight": a_o,
        "transformer.layers.1.attention.to_out.0.lora_B.weight": b_o,
        "lora_unet_noise_refiner_0_feed_forward_w1.lora_down.weight": a_w1,
        "lora_unet_noise_refiner_0_feed_forward_w1.lora_up.weight": b_w1,
        "lora_unet_noise_refiner_0_feed_forward_w1.alpha": torch.tensor(2.0),
        "diffusion_model.context_refiner.0.feed_forward.w2.lora_down.weight": a_w2,
        "diffusion_model.context_refiner.0.feed_forward.w2.lora_up.weight": b_w2,
    }
    save_file(lora, tmp_path / "lora.safetensors")
    s = 0.8
    expected = _merged_state(state, [
        ("layers.0.attention.qkv.weight", dim, a_q, b_q, s), ("layers.1.attention.out.weight", 0, a_o, b_o, s),
        ("noise_refiner.0.feed_forward.w1.weight", 0, a_w1, b_w1, s * 2 / rank),
        ("context_refiner.0.feed_forward.w2.weight", 0, a_w2, b_w2, s)])
    save_file(expected, tmp_path / "merged.safetensors")
    latent, caption = torch.randn(4, 6, 8), torch.randn(10, 32)
    with_lora = ZImage.load(files / "z_image_f32.safetensors", loras=((tmp_path / "lora.safetensors", s),))
    oracle = ZImage.load(tmp_path / "merged.safetensors").output(latent, 0.5, caption)
    plain = ZImage.load(files / "z_image_f32.safetensors").output(latent, 0.5, caption)
    assert rel_err(with_lora.output(latent, 0.5, caption), oracle) <= 1e-6
    assert rel_err(plain, oracle) > 1e-3  # the LoRA does change the output
    # On an INT8 file the merged linears are requantized: close to the float merge.
    int8 = ZImage.load(files / "z_image_int8_convrot.safetensors", loras=((tmp_path / "lora.safetensors", s),))
    assert int8.blocks[1].w[1].quantized
    assert rel_err(int8.output(latent, 0.5, caption), oracle) <= 3e-2


def test_lora_for_another_model_is_refused(files, tmp_path):
    save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 3072),
               "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(9216, 4)}, tmp_path / "flux_lora.safetensors")
    with pytest.raises(WeightsError, match="flux_lora.safetensors: a LoRA for another model"):
        ZImage.load(files / "z_image_f32.safetensors", loras=((tmp_path / "flux_lora.safetensors", 1.0),))
    save_file({"diffusion_model.layers.0.attention.qkv.lora_A.weight": torch.zeros(4, 3840),
               "diffusion_model.layers.0.attention.qkv.lora_B.weight": torch.zeros(11520, 4)},
              tmp_path / "big_lora.safetensors")
    with pytest.raises(WeightsError, match="big_lora.safetensors: LoRA layer 'layers.0.attention.qkv'.*another model size"):
        ZImage.load(files / "z_image_f32.safetensors", loras=((tmp_path / "big_lora.safetensors", 1.0),))
    save_file({"x": torch.zeros(2)}, tmp_path / "not_lora.safetensors")
    with pytest.raises(WeightsError, match="not_lora.safetensors: no LoRA tensors"):
        ZImage.load(files / "z_image_f32.safetensors", loras=((tmp_path / "not_lora.safetensors", 1.0),))


def test_forward_matches_comfyui_nextdit(comfy, tmp_path):
    """The second reference: ComfyUI v0.3.75's own NextDiT, built directly at width 1024 (below it ComfyUI's
    time-embedder width differs from diffusers'; reference/families/z_image.md section 11)."""
    import comfy.ops
    from comfy.ldm.lumina.model import NextDiT
    torch.manual_seed(5)
    model = NextDiT(patch_size=2, in_channels=4, dim=1024, n_layers=1, n_refiner_layers=1, n_heads=8,
                    n_kv_heads=8, multiple_of=1, ffn_dim_multiplier=8 / 3, norm_eps=1e-5, qk_norm=True,
                    cap_feat_dim=32, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512], rope_theta=256.0,
                    z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32,
                    operations=comfy.ops.disable_weight_init).eval()
    state = {}
    for k, v in model.state_dict().items():
        state[k] = torch.randn(v.shape) * (0.5 if v.dim() == 1 or v.shape[0] == 1 else v.shape[-1] ** -0.5)
    model.load_state_dict(state)
    save_file(state, tmp_path / "z_image_1024.safetensors")
    ours = ZImage.load(tmp_path / "z_image_1024.safetensors")
    latent, caption = torch.randn(4, 6, 10), torch.randn(13, 32)
    with torch.no_grad():
        v = model(latent[None], torch.tensor([0.7]), caption[None], num_tokens=13)[0]
    assert rel_err(ours.output(latent, 0.7, caption), -v) <= 1e-5


@pytest.mark.parametrize("sampler", ["euler", "res_multistep"])
def test_sampling_z_image_equals_comfyui_samplers(comfy, files, sampler):
    """Our KSampler over the tiny Z-Image equals ComfyUI's k-diffusion sampler driving the same model."""
    import comfy.k_diffusion.sampling as k
    import comfy.latent_formats
    import comfy.model_sampling
    import comfy.sample
    import comfy.samplers

    from dit_core.sampling.ksampler import ksample

    model = ZImage.load(files / "z_image_f32.safetensors")
    cond, latent = torch.randn(1, 9, 32), torch.zeros(1, 4, 6, 8)
    ours = ksample(model.denoised, 77, 4, 1.0, sampler, "simple", latent, positive=cond, shift=3.0,
                   latent_shift=SHIFT, latent_scale=SCALING)

    class Flow(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    class Config:
        sampling_settings = {"shift": 3.0, "multiplier": 1.0}

    sigmas = comfy.samplers.calculate_sigmas(Flow(Config()), "simple", 4)
    noise = comfy.sample.prepare_noise(latent, 77)
    x = sigmas[0] * noise  # CONST noise scaling of an empty latent
    denoiser = lambda x, sigma, **kw: model.denoised(x, sigma[0].item(), cond)
    run = {"euler": k.sample_euler, "res_multistep": k.sample_res_multistep}[sampler]
    expected = comfy.latent_formats.Flux().process_out(run(denoiser, x, sigmas, disable=True))
    assert rel_err(ours, expected) <= 1e-6


def load_with(files, lora, **kw):
    """The INT8-converted f32 file and the INT8 file with a LoRA merged, as the loaders make them."""
    return (ZImage.load(files / "z_image_f32.safetensors", linears="int8", **kw),
            ZImage.load(files / "z_image_int8_convrot.safetensors", loras=((lora, 0.8),), **kw))


def small_lora(tmp_path):
    g = torch.Generator().manual_seed(5)
    save_file({"diffusion_model.layers.0.attention.qkv.lora_A.weight": torch.randn(4, 192, generator=g) * 0.05,
               "diffusion_model.layers.0.attention.qkv.lora_B.weight": torch.randn(576, 4, generator=g) * 0.05},
              tmp_path / "lora.safetensors")
    return tmp_path / "lora.safetensors"


def test_load_arithmetic_where_asked_is_the_same_here(files, tmp_path):
    """compute_on (the loaders pass their GPU): quantization at load and a LoRA merged into INT8 linears computed on
    the device given; on the host's own device bit for bit the default, the linears staying on the host."""
    lora = small_lora(tmp_path)
    for got, want in zip(load_with(files, lora, compute_on=torch.device("cpu")), load_with(files, lora)):
        for b_got, b_want in zip(got.blocks, want.blocks):
            assert all(torch.equal(g, w) for g, w in zip(b_got.w, b_want.w) if isinstance(g, torch.Tensor))
            assert all(torch.equal(g.weight, w.weight) and torch.equal(g.scale, w.scale)
                       for g, w in zip(b_got.w, b_want.w) if hasattr(g, "scale") and g.scale is not None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_load_arithmetic_on_the_gpu_comes_back_to_the_host(files, tmp_path):
    """compute_on='cuda': the same codes as on the host but where the GPU's f32 rounding moves a value across a
    code boundary (at most one step, in a few codes), scales within f32 rounding; everything back on the host."""
    lora = small_lora(tmp_path)
    for got, want in zip(load_with(files, lora, compute_on=torch.device("cuda")), load_with(files, lora)):
        for b_got, b_want in zip(got.blocks, want.blocks):
            for g, w in zip(b_got.w, b_want.w):
                if getattr(g, "scale", None) is None:
                    continue
                assert g.weight.device.type == "cpu" and g.scale.device.type == "cpu"
                step = (g.weight.int() - w.weight.int()).abs()
                assert step.max() <= 1 and (step > 0).float().mean() <= 1e-3
                assert rel_err(g.scale, w.scale) <= 1e-6


def test_caption_refiners_attend_without_per_shape_plans(files, monkeypatch):
    """The context refiners' attention (the caption's rows: their shape changes with its length) asks SDPA for its
    unplanned back ends (cuDNN builds a plan for each new shape); the image step's blocks keep cuDNN first."""
    from dit_core.gpu.block import GpuBlock
    from dit_core.gpu.options import Options
    host = ZImage.load(files / "z_image_f32.safetensors")
    on_cpu = lambda blocks: tuple(GpuBlock.of(b, torch.device("cpu")) for b in blocks)  # noqa: E731
    gpu = replace(host, context=on_cpu(host.context), options=Options())
    asked = attention_plans(monkeypatch)
    caption = torch.randn(7, 32)
    assert rel_err(gpu._caption_rows(caption, torch.float32), host._caption_rows(caption, torch.float32)) <= 1e-2
    assert asked == [False] * len(host.context)
