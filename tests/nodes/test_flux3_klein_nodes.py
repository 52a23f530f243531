"""The FLUX.3 Klein nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, whole graphs (text to
image, and an edit with references as ReferenceLatent puts them) against the engine called directly, errors
naming node and input."""
import pytest
import torch
from node_contract import assert_schemas_follow, pack_tokenizer_dir, run
from safetensors.torch import save_file

PROMPT = "a red fox in the snow"


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.flux3_klein as k
    return k


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """A tiny FLUX.3 Klein (128 latent channels, text rows of 8 x 64), Qwen3-VL text encoder and FLUX.2 VAE in
    ComfyUI's models folders."""
    import folder_paths
    from tiny_models import (
        flux3_bfl_layout,
        qwen3_vl_layout,
        random_flux3,
        random_qwen3_vl,
        save_flux2_vae,
        tiny_flux2_vae,
    )
    root = tmp_path_factory.mktemp("models")
    for folder in ("diffusion_models", "text_encoders", "vae"):
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    dit = random_flux3(in_channels=128, cond_in_channels=128, joint_attention_dim=8 * 64)
    save_file(flux3_bfl_layout(dit.state_dict(), "model.diffusion_model."),
              root / "diffusion_models" / "flux3_klein_tiny.safetensors")
    save_file(qwen3_vl_layout(random_qwen3_vl(), "comfy"), root / "text_encoders" / "qwen3vl_tiny.safetensors")
    # 32 norm groups, as the real FLUX.2 VAE (the loader reads them as FLUX VAEs have them)
    save_flux2_vae(tiny_flux2_vae(block_out_channels=(32, 32, 64, 64), norm_num_groups=32),
                   root / "vae" / "flux2_vae_tiny.safetensors")
    return root


CONTRACT = {
    "SwiftDiTFlux3KleinLoader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb"], "SWIFTDIT_MODEL"),
    "SwiftDiTFlux3KleinTextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTFlux3KleinTextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTFlux3KleinSampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive",
                                   "negative", "latent_image", "denoise", "cache", "refresh"], "LATENT"),
    "SwiftDiTFlux3KleinVAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTFlux3KleinVAEDecode": (["samples", "vae"], "IMAGE"),
    "SwiftDiTFlux3KleinVAEEncode": (["pixels", "vae"], "LATENT"),
}


def test_schemas_follow_the_contract(pack):
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/FLUX.3 Klein")
    sampler = {i.id: i for i in pack.Flux3KleinSampler.GET_SCHEMA().inputs}
    assert sampler["seed"].control_after_generate
    assert (sampler["cache"].default, sampler["refresh"].default, sampler["steps"].default) == (0.3, 0, 16)
    clip_type = next(i for i in pack.Flux3KleinTextEncoderLoader.GET_SCHEMA().inputs if i.id == "type")
    assert clip_type.default == "flux3"  # the templates' CLIPLoader type
    from swiftdit_pack.nodes import NODES_BY_FAMILY
    assert NODES_BY_FAMILY["flux3_klein"] == pack.NODES


def test_loader_takes_a_gpu_budget_and_reports_the_model(pack, models):
    out = pack.Flux3KleinLoader.execute(unet_name="flux3_klein_tiny.safetensors", weight_dtype="default",
                                        linears="as stored", gpu_budget_gb=2.5)
    assert out.result[0].gpu_budget_gb == 2.5  # on the CPU the host path keeps its blocks in RAM
    assert out.ui["text"][0].startswith("flux3_klein_tiny.safetensors: ") and "host memory" in out.ui["text"][0]


def graph(k, seed=7, width=32, height=48, steps=4, cache=0.3, refresh=0, reference=None, cfg=1.0):
    """The distilled t2i template's graph (upsampler off), or the edit one when `reference` (an IMAGE) is given:
    our VAE encode then stock ReferenceLatent on both conditionings, as ReferenceMultiLatent wires them."""
    from comfy_extras.nodes_edit_model import ReferenceLatent
    (model,) = run(k.Flux3KleinLoader, unet_name="flux3_klein_tiny.safetensors", weight_dtype="default",
                   linears="as stored")
    (clip,) = run(k.Flux3KleinTextEncoderLoader, clip_name="qwen3vl_tiny.safetensors", type="flux3")
    (positive,) = run(k.Flux3KleinTextEncode, text=PROMPT, clip=clip)
    negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None}]]  # ConditioningZeroOut
    (vae,) = run(k.Flux3KleinVAELoader, vae_name="flux2_vae_tiny.safetensors")
    if reference is not None:
        (ref,) = run(k.Flux3KleinVAEEncode, pixels=reference, vae=vae)
        positive = ReferenceLatent.execute(positive, ref).result[0]
        negative = ReferenceLatent.execute(negative, ref).result[0]
    latent = {"samples": torch.zeros(1, 128, height // 16, width // 16)}  # EmptyFlux2LatentImage
    (samples,) = run(k.Flux3KleinSampler, model=model, seed=seed, steps=steps, cfg=cfg, sampler_name="euler",
                     scheduler="simple", positive=positive, negative=negative, latent_image=latent, denoise=1.0,
                     cache=cache, refresh=refresh)
    (image,) = run(k.Flux3KleinVAEDecode, samples=samples, vae=vae)
    return positive, samples, image


def engine(models, rows, seed, width, height, steps, cache, refresh=0, references=()):
    from dit_core.families.flux3_klein import Flux3Klein
    from dit_core.sampling.klein import flux_noise, sample_klein
    from dit_core.sampling.schedules import klein_sigmas
    from dit_core.sampling.step_cache import StepCache
    dit = Flux3Klein.load(models / "diffusion_models" / "flux3_klein_tiny.safetensors")
    step_cache = StepCache(cache)
    x = sample_klein(dit, flux_noise(seed, height, width)[0], klein_sigmas(steps, 16.0), rows[0], references,
                     step_cache, refresh)
    return x[None], step_cache


@pytest.mark.parametrize("cache", [0.0, 1.0])  # 1.0: this tiny model skips steps (0.3 skips none of its 4)
def test_t2i_graph_equals_the_engine(pack, models, cache, caplog):
    from dit_core.text.qwen3_vl import Qwen3VLTextEncoder
    from dit_core.codecs.flux2_vae import Flux2VAE
    with caplog.at_level("INFO", logger="SwiftDiT"):
        positive, samples, image = graph(pack, cache=cache)
    rows = Qwen3VLTextEncoder.load(models / "text_encoders" / "qwen3vl_tiny.safetensors",
                                   pack_tokenizer_dir()).encode(PROMPT)
    assert torch.equal(positive[0][0], rows) and rows.shape[2] == 8 * 64 and rows.shape[1] % 80 == 0
    assert positive[0][1]["pooled_output"] is None
    expected, step_cache = engine(models, rows, 7, 32, 48, 4, cache)
    assert torch.equal(samples["samples"], expected)
    vae = Flux2VAE.load(models / "vae" / "flux2_vae_tiny.safetensors")
    assert torch.equal(image, vae.decode(expected))
    assert image.shape == (1, 48, 32, 3) and 0 <= image.min() and image.max() <= 1
    reported = f"step cache {cache:.3g} skipped {step_cache.skipped} of 4 steps"
    assert (reported in caplog.text) == (cache > 0)
    if cache > 0:  # the widget reached the sampler: steps were skipped, so the image is not the uncached one
        assert step_cache.skipped > 0
        assert not torch.equal(expected, engine(models, rows, 7, 32, 48, 4, 0.0)[0])


def test_edit_graph_equals_the_engine(pack, models):
    from dit_core.codecs.flux2_vae import Flux2VAE
    reference = torch.rand(1, 32, 48, 3, generator=torch.Generator().manual_seed(3))
    positive, samples, _ = graph(pack, reference=reference, refresh=2)
    refs = positive[0][1]["reference_latents"]
    vae = Flux2VAE.load(models / "vae" / "flux2_vae_tiny.safetensors")
    assert len(refs) == 1 and torch.equal(refs[0], vae.encode(reference)) and refs[0].shape == (1, 128, 2, 3)
    expected, _ = engine(models, positive[0][0], 7, 32, 48, 4, 0.3, refresh=2, references=[refs[0][0]])
    assert torch.equal(samples["samples"], expected)
    assert not torch.equal(samples["samples"], graph(pack)[1]["samples"])  # the reference is used


def test_image_to_image_graph_equals_the_engine(pack, models):
    """denoise 0.6 on our VAE encode of an image: KSampler's image to image (the tail of the schedule of
    int(steps / denoise) steps from the noised latent); denoise 0 returns the latent."""
    from dit_core.families.flux3_klein import Flux3Klein
    from dit_core.sampling.ksampler import prepare_noise
    from dit_core.sampling.klein import sample_klein
    from dit_core.sampling.schedules import klein_sigmas
    image = torch.rand(1, 32, 48, 3, generator=torch.Generator().manual_seed(4))
    (vae,) = run(pack.Flux3KleinVAELoader, vae_name="flux2_vae_tiny.safetensors")
    (latent,) = run(pack.Flux3KleinVAEEncode, pixels=image, vae=vae)
    (samples,) = graph_with(pack, denoise=0.6, latent=latent)
    (clip,) = run(pack.Flux3KleinTextEncoderLoader, clip_name="qwen3vl_tiny.safetensors", type="flux3")
    (positive,) = run(pack.Flux3KleinTextEncode, text=PROMPT, clip=clip)
    dit = Flux3Klein.load(models / "diffusion_models" / "flux3_klein_tiny.safetensors")
    x = latent["samples"]
    expected = sample_klein(dit, prepare_noise(x, 0)[0], klein_sigmas(2, 16.0, 0.6), positive[0][0][0],
                            latent=x[0])
    assert torch.equal(samples["samples"][0], expected)
    assert graph_with(pack, denoise=0.0, latent=latent)[0] is latent


def test_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import SwiftDiTError
    k = pack
    save_file({"x": torch.zeros(1)}, models / "diffusion_models" / "not_flux3.safetensors")
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinLoader · unet_name: .*not a FLUX.3"):
        run(k.Flux3KleinLoader, unet_name="not_flux3.safetensors", weight_dtype="default", linears="as stored")
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinVAELoader · vae_name: 'missing.safetensors' is not"):
        run(k.Flux3KleinVAELoader, vae_name="missing.safetensors")
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinSampler · latent_image: expected a FLUX.2 latent"):
        graph_with(k, latent={"samples": torch.zeros(1, 16, 3, 2)})
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinSampler · positive: reference latent 0"):
        graph_with(k, reference=torch.zeros(1, 16, 3, 2))
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinSampler · negative: empty conditioning"):
        graph_with(k, negative=[])
    (clip,) = run(k.Flux3KleinTextEncoderLoader, clip_name="qwen3vl_tiny.safetensors", type="flux3")
    with pytest.raises(SwiftDiTError, match=r"SwiftDiTFlux3KleinTextEncode · text: the prompt is \d+ tokens .*more "
                                            r"than the text encoder's 8192; shorten it"):
        run(k.Flux3KleinTextEncode, text="a cat " * 4200, clip=clip)
    (vae,) = run(k.Flux3KleinVAELoader, vae_name="flux2_vae_tiny.safetensors")
    with pytest.raises(SwiftDiTError, match="SwiftDiTFlux3KleinVAEDecode · samples: .*FLUX.2 latents"):
        run(k.Flux3KleinVAEDecode, samples={"samples": torch.zeros(1, 16, 3, 2)}, vae=vae)


def graph_with(k, denoise=1.0, latent=None, reference=None, negative=None):
    (model,) = run(k.Flux3KleinLoader, unet_name="flux3_klein_tiny.safetensors", weight_dtype="default",
                   linears="as stored")
    (clip,) = run(k.Flux3KleinTextEncoderLoader, clip_name="qwen3vl_tiny.safetensors", type="flux3")
    (positive,) = run(k.Flux3KleinTextEncode, text=PROMPT, clip=clip)
    if reference is not None:
        positive = [[positive[0][0], {**positive[0][1], "reference_latents": [reference]}]]
    return run(k.Flux3KleinSampler, model=model, seed=0, steps=2, cfg=1.0, sampler_name="euler",
               scheduler="simple", positive=positive, negative=positive if negative is None else negative,
               latent_image=latent or {"samples": torch.zeros(1, 128, 2, 2)}, denoise=denoise, cache=0.0,
               refresh=0)
