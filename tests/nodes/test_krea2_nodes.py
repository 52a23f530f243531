"""The Krea 2 nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, the text-to-image graph
against the engine called directly, errors naming node and input."""
import pytest
import torch
from node_contract import assert_schemas_follow, pack_tokenizer_dir, run
from safetensors.torch import save_file

PROMPT = "a red fox in the snow"
# Krea 2 in small with the real 16 latent channels and the text fusion the tiny Qwen3-VL feeds (12 taps of 64).
TEXT = dict(text_hidden_dim=64, num_text_layers=12, text_num_attention_heads=2, text_num_key_value_heads=1)


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.krea2 as k
    return k


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """A tiny Krea 2 and a 36-layer tiny Qwen3-VL in ComfyUI's models folders."""
    import folder_paths
    from tiny_models import krea2_original_layout, qwen3_vl_layout, random_krea2, random_qwen3_vl
    root = tmp_path_factory.mktemp("models")
    for folder in ("diffusion_models", "text_encoders", "loras"):
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    save_file(krea2_original_layout(random_krea2(in_channels=64, **TEXT).state_dict(), "model.diffusion_model."),
              root / "diffusion_models" / "krea2_tiny.safetensors")
    save_file(qwen3_vl_layout(random_qwen3_vl(num_hidden_layers=36), "comfy"),
              root / "text_encoders" / "qwen3vl_krea2_tiny.safetensors")
    g = torch.Generator().manual_seed(1)
    save_file({"diffusion_model.blocks.0.attn.wq.lora_A.weight": 0.1 * torch.randn(4, 128, generator=g),
               "diffusion_model.blocks.0.attn.wq.lora_B.weight": 0.1 * torch.randn(128, 4, generator=g)},
              root / "loras" / "krea2_style_tiny.safetensors")
    save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 3072),
               "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(9216, 4)},
              root / "loras" / "flux1_lora.safetensors")
    return root


CONTRACT = {
    "SwiftDiTKrea2Loader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb"], "SWIFTDIT_MODEL"),
    "SwiftDiTKrea2LoraLoaderModelOnly": (["model", "lora_name", "strength_model"], "SWIFTDIT_MODEL"),
    "SwiftDiTKrea2ModelSamplingFlux": (["model", "max_shift", "base_shift", "width", "height"], "SWIFTDIT_MODEL"),
    "SwiftDiTKrea2TextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTKrea2TextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTKrea2TextEncodeQwenImageEditPlus": (["clip", "prompt", "vae", "image1", "image2", "image3"],
                                                 "CONDITIONING"),
    "SwiftDiTKrea2ReferenceLatentMethod": (["conditioning", "reference_latents_method"], "CONDITIONING"),
    "SwiftDiTKrea2Sampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative",
                              "latent_image", "denoise"], "LATENT"),
    "SwiftDiTKrea2VAEDecode": (["samples", "vae"], "IMAGE"),
}


def test_schemas_follow_the_contract(pack):
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/Krea 2")
    sampler = {i.id: i for i in pack.Krea2Sampler.GET_SCHEMA().inputs}
    assert (sampler["steps"].default, sampler["sampler_name"].default, sampler["scheduler"].default) == \
        (8, "euler", "simple")  # the Turbo template's KSampler
    assert "normal" not in sampler["scheduler"].options
    clip_type = next(i for i in pack.Krea2TextEncoderLoader.GET_SCHEMA().inputs if i.id == "type")
    assert clip_type.default == "krea2"
    from swiftdit_pack.nodes import NODES_BY_FAMILY
    assert NODES_BY_FAMILY["krea2"] == pack.NODES


def graph(k, seed=7, width=32, height=48, steps=3, cfg=1.0, lora=None):
    """The Turbo template's graph less the prompt refiner: loaders (the LoRA switch on with `lora`), text encode,
    ConditioningZeroOut as the negative, EmptyLatentImage's [1, 4, H/8, W/8] zeros, the sampler."""
    (model,) = run(k.Krea2Loader, unet_name="krea2_tiny.safetensors", weight_dtype="default", linears="as stored")
    if lora is not None:
        (model,) = run(k.Krea2LoraLoaderModelOnly, model=model, lora_name=lora, strength_model=0.8)
    (clip,) = run(k.Krea2TextEncoderLoader, clip_name="qwen3vl_krea2_tiny.safetensors", type="krea2")
    (positive,) = run(k.Krea2TextEncode, text=PROMPT, clip=clip)
    negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None}]]  # ConditioningZeroOut
    latent = {"samples": torch.zeros(1, 4, height // 8, width // 8)}
    (samples,) = run(k.Krea2Sampler, model=model, seed=seed, steps=steps, cfg=cfg, sampler_name="euler",
                     scheduler="simple", positive=positive, negative=negative, latent_image=latent, denoise=1.0)
    return model, positive, negative, samples


@pytest.mark.parametrize("cfg,lora", [(1.0, None), (2.5, None), (1.0, "krea2_style_tiny.safetensors")])
def test_t2i_graph_equals_the_engine(pack, models, cfg, lora):
    from dit_core.families.krea2 import SAMPLING_MU, Krea2, latent_format
    from dit_core.text.qwen3_vl import Krea2TextEncoder
    from dit_core.sampling.ksampler import ksample
    from dit_core.sampling.schedules import flux_sigma_table
    _, positive, negative, samples = graph(pack, cfg=cfg, lora=lora)
    rows = Krea2TextEncoder.load(models / "text_encoders" / "qwen3vl_krea2_tiny.safetensors",
                                 pack_tokenizer_dir()).encode(PROMPT)
    assert torch.equal(positive[0][0], rows[None]) and rows.shape[1:] == (12, 64)
    dit = Krea2.load(models / "diffusion_models" / "krea2_tiny.safetensors",
                     loras=((models / "loras" / lora, 0.8),) if lora else ())
    shift, scale = latent_format()
    expected = ksample(dit.denoised, 7, 3, cfg, "euler", "simple", torch.zeros(1, 4, 6, 4),
                       positive=dit.text_rows(rows)[None], negative=dit.text_rows(torch.zeros_like(rows))[None],
                       latent_shift=shift, latent_scale=scale,
                       latent_channels=16, sigma_table=flux_sigma_table(SAMPLING_MU))
    assert samples["samples"].shape == (1, 16, 1, 6, 4)  # Krea 2's latent, as stock VAEDecode takes it
    assert torch.equal(samples["samples"][:, :, 0], expected)


def test_sampler_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import ModelHandle, SwiftDiTError
    model, positive, negative, _ = graph(pack, steps=1)
    kw = dict(model=model, seed=0, steps=1, cfg=1.0, sampler_name="euler", scheduler="simple", positive=positive,
              negative=negative, latent_image={"samples": torch.zeros(1, 16, 1, 6, 4)}, denoise=1.0)
    assert run(pack.Krea2Sampler, **kw)[0]["samples"].shape == (1, 16, 1, 6, 4)  # Krea 2's own latent is taken
    cases = [({"model": ModelHandle("z_image", model.path, "stored")}, "model: a z_image model"),
             ({"scheduler": "normal"}, "scheduler: 'normal' is not supported"),
             ({"latent_image": {"samples": torch.zeros(1, 16, 2, 6, 4)}}, "latent_image: expected an image latent"),
             ({"latent_image": {"samples": torch.zeros(1, 16, 5, 4)}}, "latent_image: .*multiples of 16 pixels"),
             ({"positive": [[torch.zeros(1, 7, 64), {}]]}, "positive: not Krea 2 text rows")]
    for change, message in cases:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTKrea2Sampler · {message}"):
            run(pack.Krea2Sampler, **{**kw, **change})


def test_loader_errors_name_the_input(pack, models, tmp_path):
    from swiftdit_pack.nodes.base import SwiftDiTError
    from tiny_models import random_z_image, z_image_comfy_layout
    save_file(z_image_comfy_layout(random_z_image().state_dict()),
              models / "diffusion_models" / "z_image_not_krea2.safetensors")
    with pytest.raises(SwiftDiTError, match="SwiftDiTKrea2Loader · unet_name: .*not a Krea 2 diffusion model"):
        run(pack.Krea2Loader, unet_name="z_image_not_krea2.safetensors", weight_dtype="default",
            linears="as stored")
    (model,) = run(pack.Krea2Loader, unet_name="krea2_tiny.safetensors", weight_dtype="default", linears="as stored")
    with pytest.raises(SwiftDiTError, match="SwiftDiTKrea2LoraLoaderModelOnly · lora_name: .*another model"):
        run(pack.Krea2LoraLoaderModelOnly, model=model, lora_name="flux1_lora.safetensors", strength_model=1.0)
    with pytest.raises(SwiftDiTError, match="SwiftDiTKrea2TextEncode · text: .*shorten it"):
        (clip,) = run(pack.Krea2TextEncoderLoader, clip_name="qwen3vl_krea2_tiny.safetensors", type="krea2")
        run(pack.Krea2TextEncode, text="a red fox " * 400, clip=clip)


def test_lora_changes_the_image(pack, models):
    assert not torch.equal(graph(pack, lora="krea2_style_tiny.safetensors")[3]["samples"], graph(pack)[3]["samples"])


def stock_vae(seed=0):
    """Stock VAELoader's VAE of a tiny random Wan 2.1 VAE (qwen_image_vae's architecture)."""
    import comfy.sd
    from comfy.ldm.wan.vae import WanVAE
    torch.manual_seed(seed)
    wan = WanVAE(dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                 temperal_downsample=[False, True, True], dropout=0.0)
    state = {k: (1 + 0.1 * torch.randn_like(v)) if k.endswith("gamma") else 0.05 * torch.randn_like(v)
             for k, v in wan.state_dict().items()}  # ComfyUI's ops leave the weights uninitialized
    return comfy.sd.VAE(sd=state)


def test_stock_vae_decode_takes_the_sampler_latent(pack, models):
    """Stock VAELoader and VAEDecode decode the sampler's [B, 16, 1, H/8, W/8] with a Wan 2.1 VAE (qwen_image_vae's
    architecture; tiny and random here, as ComfyUI v0.3.75 builds it from the file's tensors)."""
    images = stock_vae().decode(graph(pack, steps=1)[3]["samples"])  # what VAEDecode runs
    assert images.shape == (1, 1, 48, 32, 3) and images.isfinite().all()


def test_our_vae_decode_gives_the_stock_decode(pack, models):
    """Our VAE Decode of the stock VAE Loader's Wan 2.1 VAE gives stock VAEDecode's image of the sampler's latent (its
    2-D decode of one frame; f32 on the CPU); the decoder is made once for that VAE, again for another."""
    from swiftdit_pack.nodes.memory import LOADED
    vae, samples = stock_vae(), graph(pack, steps=1)[3]
    want = vae.decode(samples["samples"]).reshape(-1, 48, 32, 3)  # what VAEDecode runs
    (image,) = run(pack.Krea2VAEDecode, samples=samples, vae=vae)
    assert image.shape == (1, 48, 32, 3) and (image - want).abs().max() < 1e-4
    decoder = LOADED._held["vae", "main"][1]
    run(pack.Krea2VAEDecode, samples=samples, vae=vae)
    assert LOADED._held["vae", "main"][1] is decoder
    other = stock_vae(seed=1)
    (again,) = run(pack.Krea2VAEDecode, samples=samples, vae=other)
    assert (again - other.decode(samples["samples"]).reshape(-1, 48, 32, 3)).abs().max() < 1e-4


def test_our_vae_decode_refuses_other_vaes_and_latents(pack, models):
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTKrea2VAEDecode · samples: .*Qwen-Image VAE latents"):
        run(pack.Krea2VAEDecode, samples={"samples": torch.zeros(1, 128, 4, 4)}, vae=stock_vae())
    with pytest.raises(SwiftDiTError, match="SwiftDiTKrea2VAEDecode · vae: expected the VAE of a stock VAE Loader"):
        run(pack.Krea2VAEDecode, samples={"samples": torch.zeros(1, 16, 1, 4, 4)}, vae="a VAE")


@pytest.mark.parametrize("size", [(1024, 1024), (832, 1216), (512, 512)])
def test_model_sampling_flux_takes_the_stock_shift(pack, models, size, monkeypatch):
    """The shift ModelSamplingFlux sets on a stock model for this size (its node run on a stand-in model), carried
    by our handle to the sampler's sigma table."""
    import importlib
    import sys
    from types import SimpleNamespace
    # The stock module imports ComfyUI's top-level `nodes` (for MAX_RESOLUTION), which this repo's nodes/ shadows:
    # imported here against a stand-in, and not left behind for other tests.
    name = "comfy_extras.nodes_model_advanced"
    monkeypatch.setitem(sys.modules, "nodes", SimpleNamespace(MAX_RESOLUTION=16384))
    kept = sys.modules.pop(name, None)
    try:
        ModelSamplingFlux = importlib.import_module(name).ModelSamplingFlux
    finally:
        sys.modules.pop(name, None)
        if kept is not None:
            sys.modules[name] = kept

    class Model:  # what the stock node asks of a ModelPatcher
        model = SimpleNamespace(model_config=None)

        def clone(self):
            return self

        def add_object_patch(self, name, obj):
            self.patched = obj
    stock = ModelSamplingFlux().patch(Model(), 1.15, 0.5, *size)[0].patched
    (model,) = run(pack.Krea2Loader, unet_name="krea2_tiny.safetensors", weight_dtype="default", linears="as stored")
    (shifted,) = run(pack.Krea2ModelSamplingFlux, model=model, max_shift=1.15, base_shift=0.5, width=size[0],
                     height=size[1])
    assert shifted.shift == stock.shift and model.shift == 1.15
    if size == (1024, 1024):
        assert abs(shifted.shift - 1.15) < 1e-12  # the Turbo default at 1 MP


@pytest.fixture
def tiny_reference(monkeypatch):
    """The style-reference node on the tiny files: the tiny tower's heads and DeepStack layer, and areas a tiny test
    runs fast (the stock node's 384^2 and 1024^2 are checked as constants)."""
    import swiftdit_pack.nodes.krea2_reference as ref
    assert (ref.VISION_AREA, ref.LATENT_AREA, ref.VISION) == (384 * 384, 1024 * 1024,
                                                              {"vision_heads": 16, "deepstack_layers": (5, 11, 17)})
    monkeypatch.setattr(ref, "VISION", {"vision_heads": 2, "deepstack_layers": (0,)})
    monkeypatch.setattr(ref, "VISION_AREA", 56 * 64)
    monkeypatch.setattr(ref, "LATENT_AREA", 64 * 80)
    return ref


def test_style_reference_graph_equals_the_engine(pack, models, tiny_reference):
    """The style-reference template's graph (its SamplerCustomAdvanced group as our KSampler): TextEncodeQwenImage
    EditPlus's role with a picture and the stock VAE, the reference method node, ConditioningZeroOut's negative
    (its references kept), the sampler; against the engine called directly: encode_reference of the picture at the
    vision area, the stock VAE's latent of it at the latent area in Krea 2's latent format, ksample with refs."""
    import comfy.utils
    from dit_core.families.krea2 import SAMPLING_MU, Krea2, latent_format
    from dit_core.sampling.ksampler import ksample, process_in
    from dit_core.sampling.schedules import flux_sigma_table
    from dit_core.text.qwen3_vl import Krea2TextEncoder
    ref, vae = tiny_reference, stock_vae()
    picture = torch.rand(1, 70, 60, 3, generator=torch.Generator().manual_seed(3))
    (model,) = run(pack.Krea2Loader, unet_name="krea2_tiny.safetensors", weight_dtype="default", linears="as stored")
    (clip,) = run(pack.Krea2TextEncoderLoader, clip_name="qwen3vl_krea2_tiny.safetensors", type="krea2")
    (encoded,) = run(ref.Krea2TextEncodeQwenImageEditPlus, clip=clip, prompt=PROMPT, vae=vae, image1=picture)
    (positive,) = run(ref.Krea2ReferenceLatentMethod, conditioning=encoded,
                      reference_latents_method="index_timestep_zero")
    negative = [[torch.zeros_like(positive[0][0]), {**positive[0][1], "pooled_output": None}]]
    kw = dict(model=model, seed=7, steps=2, cfg=1.0, sampler_name="euler", scheduler="simple", negative=negative,
              latent_image={"samples": torch.zeros(1, 4, 6, 4)}, denoise=1.0)
    (samples,) = run(pack.Krea2Sampler, positive=positive, **kw)

    def area(size):  # TextEncodeQwenImageEditPlus's resize: (60, 70) -> (55, 65) and (64, 80)
        return comfy.utils.common_upscale(picture.movedim(-1, 1), *size, "area", "disabled").movedim(1, -1)
    rows = Krea2TextEncoder.load(models / "text_encoders" / "qwen3vl_krea2_tiny.safetensors", pack_tokenizer_dir(),
                                 vision=True, vision_heads=2, deepstack_layers=(0,)).encode_reference(
        PROMPT, [area((55, 65))])
    assert torch.equal(positive[0][0], rows[None]) and positive[0][1]["reference_latents_method"] == \
        "index_timestep_zero"
    latent = vae.encode(area((64, 80)))
    assert latent.shape == (1, 16, 1, 10, 8) and torch.equal(positive[0][1]["reference_latents"][0], latent)
    shift, scale = latent_format()
    refs = (process_in(latent[:, :, 0], shift, scale)[0],)
    dit = Krea2.load(models / "diffusion_models" / "krea2_tiny.safetensors")
    expected = ksample(lambda x, sigma, c: dit.denoised(x, sigma, c, refs=refs), 7, 2, 1.0, "euler", "simple",
                       torch.zeros(1, 4, 6, 4), positive=dit.text_rows(rows)[None],
                       negative=dit.text_rows(torch.zeros_like(rows))[None], latent_shift=shift,
                       latent_scale=scale, latent_channels=16, sigma_table=flux_sigma_table(SAMPLING_MU))
    assert torch.equal(samples["samples"][:, :, 0], expected)
    text_only = [[positive[0][0], {k: v for k, v in positive[0][1].items() if k != "reference_latents"}]]
    assert not torch.equal(run(pack.Krea2Sampler, positive=text_only, **kw)[0]["samples"], samples["samples"])
    from swiftdit_pack.nodes.base import SwiftDiTError
    cases = [({"reference_latents_method": "index"}, "positive: reference latents placed by 'index'"),
             ({"reference_latents": [torch.zeros(1, 16, 2, 10, 8)]}, "positive: reference latent 0 is")]
    for change, message in cases:
        bad = [[positive[0][0], {**positive[0][1], **change}]]
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTKrea2Sampler · {message}"):
            run(pack.Krea2Sampler, positive=bad, **kw)
