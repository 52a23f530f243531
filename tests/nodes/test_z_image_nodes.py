"""The Z-Image nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, a whole graph against the
engine called directly, errors naming node and input, cancel, and the memory hook."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "nodes.md").read_text()


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.z_image as z
    return z


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """A tiny Z-Image, text encoder and VAE in ComfyUI's models folders (registered with folder_paths)."""
    import folder_paths
    from tiny_models import (
        qwen3_comfy_layout,
        random_qwen3,
        random_z_image,
        save_bfl,
        tiny_vae,
        z_image_comfy_layout,
    )
    root = tmp_path_factory.mktemp("models")
    for folder in ("diffusion_models", "text_encoders", "vae", "loras"):
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    save_file(z_image_comfy_layout(random_z_image(in_channels=16).state_dict()),
              root / "diffusion_models" / "z_image_tiny.safetensors")
    save_file(qwen3_comfy_layout(random_qwen3(hidden_size=32, head_dim=8)),
              root / "text_encoders" / "qwen3_tiny.safetensors")
    save_bfl(tiny_vae("two_level"), root / "vae" / "ae_tiny.safetensors")
    g = torch.Generator().manual_seed(4)
    save_file({"diffusion_model.layers.0.attention.to_q.lora_A.weight": 0.1 * torch.randn(4, 192, generator=g),
               "diffusion_model.layers.0.attention.to_q.lora_B.weight": 0.1 * torch.randn(192, 4, generator=g)},
              root / "loras" / "tiny_lora.safetensors")
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, root / "diffusion_models" / "vae_here.safetensors")
    return root


# docs/nodes.md: each node's inputs in order (the stock node's widgets, then ours) and its output type.
CONTRACT = {
    "SwiftDiTZImageLoader": (["unet_name", "weight_dtype", "linears"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageTextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTZImageTextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTZImageModelSamplingAuraFlow": (["model", "shift"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageLoraLoaderModelOnly": (["model", "lora_name", "strength_model"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageSampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive",
                               "negative", "latent_image", "denoise"], "LATENT"),
    "SwiftDiTZImageVAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTZImageVAEDecode": (["samples", "vae"], "IMAGE"),
}


def test_schemas_follow_the_contract(pack):
    assert sorted(n.GET_SCHEMA().node_id for n in pack.NODES) == sorted(CONTRACT)
    for node in pack.NODES:
        schema = node.GET_SCHEMA()
        inputs, output = CONTRACT[schema.node_id]
        assert f"`{schema.node_id}`" in DOC
        assert schema.category == "SwiftDiT/Z-Image" and schema.description
        assert [i.id for i in schema.inputs] == inputs
        assert [o.io_type for o in schema.outputs] == [output]
    seed = next(i for i in pack.ZImageSampler.GET_SCHEMA().inputs if i.id == "seed")
    assert seed.control_after_generate


def run(node, **kwargs):
    return node.execute(**kwargs).result


def graph(z, seed=7, width=16, height=12, steps=3, linears="as stored", lora=None):
    (model,) = run(z.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears=linears)
    if lora is not None:
        (model,) = run(z.ZImageLoraLoaderModelOnly, model=model, lora_name=lora[0], strength_model=lora[1])
    (model,) = run(z.ZImageModelSamplingAuraFlow, model=model, shift=3.0)
    (clip,) = run(z.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2")
    (positive,) = run(z.ZImageTextEncode, text="a red fox in the snow", clip=clip)
    negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None}]]  # ConditioningZeroOut
    latent = {"samples": torch.zeros(1, 16, height, width)}  # EmptySD3LatentImage
    (samples,) = run(z.ZImageSampler, model=model, seed=seed, steps=steps, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=negative, latent_image=latent, denoise=1.0)
    (vae,) = run(z.ZImageVAELoader, vae_name="ae_tiny.safetensors")
    (image,) = run(z.ZImageVAEDecode, samples=samples, vae=vae)
    return positive, samples, image


def test_graph_equals_the_engine(pack, models):
    from dit_core.families.z_image import ZImage
    from dit_core.qwen3_text import Qwen3TextEncoder
    from dit_core.sampling import ksample
    from dit_core.vae import ImageDecoder
    positive, samples, image = graph(pack)
    rows = Qwen3TextEncoder.load(models / "text_encoders" / "qwen3_tiny.safetensors", pack.TOKENIZER_DIR).encode(
        "a red fox in the snow")
    assert torch.equal(positive[0][0], rows) and positive[0][1]["attention_mask"].shape == rows.shape[:2]
    dit = ZImage.load(models / "diffusion_models" / "z_image_tiny.safetensors")
    expected = ksample(dit.denoised, 7, 3, 1.0, "res_multistep", "simple", torch.zeros(1, 16, 12, 16),
                       positive=rows, negative=rows * 0, shift=3.0)
    assert torch.equal(samples["samples"], expected)
    assert torch.equal(image, ImageDecoder.load(models / "vae" / "ae_tiny.safetensors").decode(expected))
    assert image.shape == (1, 24, 32, 3) and 0 <= image.min() and image.max() <= 1


def test_lora_node_merges_the_lora(pack, models):
    from dit_core.families.z_image import ZImage
    from dit_core.sampling import ksample
    positive, samples, _ = graph(pack, lora=("tiny_lora.safetensors", 0.7))
    dit = ZImage.load(models / "diffusion_models" / "z_image_tiny.safetensors",
                      loras=((models / "loras" / "tiny_lora.safetensors", 0.7),))
    rows = positive[0][0]
    expected = ksample(dit.denoised, 7, 3, 1.0, "res_multistep", "simple", torch.zeros(1, 16, 12, 16),
                       positive=rows, negative=rows * 0, shift=3.0)
    assert torch.equal(samples["samples"], expected)
    assert not torch.equal(samples["samples"], graph(pack)[1]["samples"])
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoraLoaderModelOnly · lora_name"):
        graph(pack, lora=("missing.safetensors", 1.0))


def test_models_stay_loaded_and_are_freed_with_comfyui(pack, models, caplog):
    import comfy.model_management
    from swiftdit_pack.nodes.base import LOADED, install_memory_hook
    install_memory_hook()
    graph(pack)
    with caplog.at_level("INFO", logger="SwiftDiT"):
        graph(pack, seed=8)
        assert "SwiftDiT: loaded" not in caplog.text  # the second prompt reuses the three models
        comfy.model_management.unload_all_models()
    assert "SwiftDiT: freed 3 models" in caplog.text and not LOADED._held


def test_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoader · unet_name: vae_here.safetensors: not a Z-Image"):
        run(pack.ZImageLoader, unet_name="vae_here.safetensors", weight_dtype="default", linears="as stored")
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoader · unet_name: '../secret.safetensors' is not in"):
        run(pack.ZImageLoader, unet_name="../secret.safetensors", weight_dtype="default", linears="as stored")
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageSampler · latent_image: .*patch grid"):
        graph(pack, width=15)


def test_cancel_interrupts_within_a_step(pack, models):
    import comfy.model_management
    comfy.model_management.interrupt_current_processing(True)
    try:
        with pytest.raises(comfy.model_management.InterruptProcessingException):
            graph(pack)
    finally:
        comfy.model_management.interrupt_current_processing(False)
    graph(pack)  # usable after
