"""Krea 2's style reference on the host path, tiny and random: the transformer step with reference rows
(dit_core/families/krea2.py) against diffusers 0.42.1's Krea2Transformer2DModel modules run as ComfyUI's Krea 2 runs
FluxKontextMultiReferenceLatentMethod("index_timestep_zero"), and the prompt + picture rows
(dit_core/text/qwen3_vl.py Krea2TextEncoder.encode_reference) against transformers' Qwen3-VL as ComfyUI's
TextEncodeQwenImageEditPlus feeds a krea2 CLIP.

diffusers 0.42.1 has no Krea 2 reference path (pipelines/krea2 and modular_pipelines/krea2 are text to image only;
reference/families/krea2.md section 9, item 5), so the oracles are its (and transformers') modules from the same
weights, put together by the rules of ComfyUI's newest Krea 2 (comfy/ldm/krea2/model.py: references after the
image, positions (k, i, j), modulated at timestep 0, padded circularly to the patch grid; comfy_extras/nodes_qwen.py,
comfy/text_encoders/krea2.py and llama.py: the edit template, "Picture i: " blocks, the rows after
"<|im_start|>user\\n", taps after DeepStack)."""
import pytest
import torch
import torch.nn.functional as F
from conftest import COMFYUI_TREE, rel_err
from PIL import Image
from safetensors.torch import save_file
from tiny_models import (KREA2_TINY, QWEN3_VL_TEXT_TINY, QWEN3_VL_VISION_DEEPSTACK3_TINY, krea2_original_layout,
                         qwen3_vl_layout, random_krea2, random_krea2_qwen3_vl)

from dit_core.families.krea2 import Krea2
from dit_core.text.qwen3_vl import KREA2_LAYERS, Krea2TextEncoder
from dit_core.text.qwen3_vl_vision import IMAGE_PAD_ID, VISION_MAX_PIXELS, VISION_MIN_PIXELS
from dit_core.weights import WeightsError

pytest.importorskip("diffusers")

C = KREA2_TINY["in_channels"] // 4
TAPS, TEXT = KREA2_TINY["num_text_layers"], KREA2_TINY["text_hidden_dim"]


# --- the transformer step with reference rows ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return random_krea2(seed=21)


@pytest.fixture(scope="module")
def ours(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("krea2_reference") / "krea2.safetensors"
    save_file(krea2_original_layout(model.state_dict()), path)
    return Krea2.load(path)


def packed(z: torch.Tensor) -> torch.Tensor:
    """[C, H, W] -> [1, H/2 W/2, 4C] as diffusers' Krea 2 pipeline packs latents."""
    c, h, w = z.shape
    return z.reshape(1, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, -1, c * 4)


def grid_ids(index: int, hp: int, wp: int) -> torch.Tensor:
    ids = torch.full((hp * wp, 3), float(index))
    ids[:, 1:] = torch.cartesian_prod(torch.arange(hp), torch.arange(wp)).float()
    return ids


def diffusers_out(model, latent, sigma, text, refs=(), ref_sigma=0.0):
    """The velocity [C, H, W] from diffusers' modules: [text | image | references] rows, the text at the origin, the
    image at (0, h, w), reference k's tokens at (k, h, w) after ComfyUI's circular pad to even sides; each block given
    per-row modulation (its temb broadcasts over rows): the image's and text's at sigma, the references' at
    ref_sigma (0: index_timestep_zero); the final layer over the image rows at sigma."""
    refs = [F.pad(z[None], (0, z.shape[2] % 2, 0, z.shape[1] % 2), mode="circular")[0] for z in refs]
    c, h, w = latent.shape
    ids = torch.cat([torch.zeros(text.shape[0], 3), grid_ids(0, h // 2, w // 2)]
                    + [grid_ids(k, z.shape[1] // 2, z.shape[2] // 2) for k, z in enumerate(refs, 1)])
    n_image = text.shape[0] + (h // 2) * (w // 2)
    with torch.no_grad():
        temb = model.time_embed(torch.tensor([sigma]), dtype=torch.float32)
        mod, ref_mod = (model.time_mod_proj(F.gelu(t, approximate="tanh")) for t in
                        (temb, model.time_embed(torch.tensor([ref_sigma]), dtype=torch.float32)))
        rows_mod = torch.cat([mod.expand(1, n_image, -1), ref_mod.expand(1, ids.shape[0] - n_image, -1)], dim=1)
        x = torch.cat([model.txt_in(model.text_fusion(text[None])),
                       model.img_in(torch.cat([packed(latent)] + [packed(z) for z in refs], dim=1))], dim=1)
        rotary = model.rotary_emb(ids)
        for block in model.transformer_blocks:
            x = block(x, rows_mod, rotary, None)
        out = model.final_layer(x[:, text.shape[0]:n_image], temb)
    return out[0].reshape(h // 2, w // 2, c, 2, 2).permute(2, 0, 3, 1, 4).reshape(c, h, w)


def test_oracle_without_references_is_diffusers_forward(model):
    """The oracle's assembly is the model's own forward when there are no references."""
    g = torch.Generator().manual_seed(1)
    latent, text = torch.randn(C, 4, 6, generator=g), torch.randn(5, TAPS, TEXT, generator=g)
    ids = torch.cat([torch.zeros(5, 3), grid_ids(0, 2, 3)])
    with torch.no_grad():
        want = model(hidden_states=packed(latent), encoder_hidden_states=text[None], timestep=torch.tensor([0.6]),
                     position_ids=ids, return_dict=False)[0]
    assert rel_err(packed(diffusers_out(model, latent, 0.6, text)), want) <= 1e-6


@pytest.mark.parametrize("sigma", [1.0, 0.6546, 0.3109])
def test_reference_rows_match_diffusers(model, ours, sigma):
    """One reference of the latent's size and one with odd sides (a 1024^2-area canvas on multiples of 8 pixels):
    the velocity within 1e-4 of the oracle (3e-7 measured)."""
    g = torch.Generator().manual_seed(2)
    latent, text = torch.randn(C, 6, 8, generator=g), torch.randn(5, TAPS, TEXT, generator=g)
    refs = (torch.randn(C, 6, 8, generator=g), torch.randn(C, 5, 7, generator=g))
    got = ours.output(latent, sigma, text, refs=refs)
    assert got.shape == latent.shape
    assert rel_err(got, diffusers_out(model, latent, sigma, text, refs)) <= 1e-4
    assert rel_err(ours.output(latent, sigma, text, refs=refs[:1]), diffusers_out(model, latent, sigma, text,
                                                                                  refs[:1])) <= 1e-4


def test_reference_rule_matters(model, ours):
    """The references change the velocity, and so does their timestep: modulated at sigma they would not match."""
    g = torch.Generator().manual_seed(3)
    latent, text, ref = torch.randn(C, 4, 4, generator=g), torch.randn(5, TAPS, TEXT, generator=g), \
        torch.randn(C, 4, 6, generator=g)
    got = ours.output(latent, 0.75, text, refs=(ref,))
    assert rel_err(got, ours.output(latent, 0.75, text)) > 1e-3
    assert rel_err(got, diffusers_out(model, latent, 0.75, text, (ref,), ref_sigma=0.75)) > 1e-3


def test_denoised_takes_references(ours):
    g = torch.Generator().manual_seed(4)
    x, text, ref = torch.randn(2, C, 4, 4, generator=g), torch.randn(5, TAPS, TEXT, generator=g), \
        torch.randn(C, 4, 4, generator=g)
    txt = ours.text_rows(text)[None]
    got = ours.denoised(x, 0.5, txt, refs=(ref,))
    for i in range(2):
        assert torch.equal(got[i], x[i] - 0.5 * ours.velocity(x[i], 0.5, txt[0], refs=(ref,)))


def test_gpu_blocks_on_the_cpu_take_reference_rows(tmp_path):
    """The GPU block's plain path (the kernels' plain-torch references on the CPU) with the references' second
    modulation row, BF16 linears, against the host in f64: within test_krea2's BF16 bound (3e-3 measured)."""
    from dataclasses import replace
    from test_krea2 import GPU_SIZES

    from dit_core.gpu.block import GpuBlock
    save_file(krea2_original_layout(random_krea2(seed=7, **GPU_SIZES).state_dict()), tmp_path / "k.safetensors")
    host = Krea2.load(tmp_path / "k.safetensors", linears="bf16")
    on_cpu = lambda blocks: tuple(GpuBlock.of(b, torch.device("cpu")) for b in blocks)  # noqa: E731
    blocks = replace(host, layerwise=on_cpu(host.layerwise), refiners=on_cpu(host.refiners),
                     blocks=on_cpu(host.blocks))
    g = torch.Generator().manual_seed(8)
    latent, text = torch.randn(C, 16, 12, generator=g), torch.randn(9, TAPS, GPU_SIZES["text_hidden_dim"], generator=g)
    ref = torch.randn(C, 15, 12, generator=g)
    want = host.output(latent.double(), 0.6546, text.double(), refs=(ref.double(),)).float()
    assert rel_err(blocks.output(latent, 0.6546, text, refs=(ref,)), want) <= 1e-2


def test_reference_of_another_width_is_refused(ours):
    with pytest.raises(ValueError, match=r"is not \[4, H, W\]"):
        ours.output(torch.randn(C, 4, 4), 0.5, torch.randn(3, TAPS, TEXT), refs=(torch.randn(C + 1, 4, 4),))


# --- the prompt and its picture through Qwen3-VL --------------------------------------------------------------------

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
VISION = QWEN3_VL_VISION_DEEPSTACK3_TINY
# ComfyUI's TextEncodeQwenImageEditPlus (comfy_extras/nodes_qwen.py), written out here for the oracle.
EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the "
                 "image. Generate a new image that meets the user's requirements while maintaining consistency with "
                 "the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                 "<|im_start|>assistant\n")
PROMPT = "in the style of the picture: a lighthouse on a cliff at dusk"
# 8-bit pixels on the tiny tower's grid (patch 4 x merge 2) and over the 3136-pixel floor: neither ComfyUI's resize
# (bilinear, float) nor transformers' (bicubic, 8-bit) changes them, so both read the same pixels.
PICTURE_SIZES = ((56, 64), (64, 56))


@pytest.fixture(scope="module")
def reference():
    return random_krea2_qwen3_vl(seed=9)


@pytest.fixture(scope="module")
def text_file(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("krea2_reference_text") / "qwen3vl_4b_tiny.safetensors"
    save_file(qwen3_vl_layout(reference, "comfy"), str(path))
    return path


@pytest.fixture(scope="module")
def encoder(text_file):
    return Krea2TextEncoder.load(text_file, TOKENIZER_DIR, vision=True, vision_heads=VISION["num_heads"],
                                 deepstack_layers=tuple(VISION["deepstack_visual_indexes"]))


@pytest.fixture(scope="module")
def pictures():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8) for h, w in PICTURE_SIZES]


def comfy_rows(reference, prompt, pixels, after_deepstack=True):
    """The rows [L, 12, hidden] ComfyUI's TextEncodeQwenImageEditPlus gives on a krea2 CLIP, from transformers'
    Qwen3VLModel on the same weights: pictures through Qwen3-VL's image processor (PIL backend, ComfyUI's pixel
    bounds, mean and std 0.5), the template with "Picture i: " blocks whose pad the processor's rule repeats per
    merged row, the model's own mRoPE positions and DeepStack; hidden_states[k] for k in KREA2_LAYERS, plus
    DeepStack's features on the picture rows of taps 1..3 (ComfyUI taps a layer's input, after DeepStack), from
    the row after the second "<|im_start|>user\\n" on."""
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    tokenizer = Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))
    processor = Qwen2VLImageProcessorPil(
        patch_size=VISION["patch_size"], merge_size=VISION["spatial_merge_size"],
        temporal_patch_size=VISION["temporal_patch_size"], image_mean=[0.5] * 3, image_std=[0.5] * 3,
        min_pixels=VISION_MIN_PIXELS, max_pixels=VISION_MAX_PIXELS)
    merge = VISION["spatial_merge_size"] ** 2
    text = EDIT_TEMPLATE.format("".join(f"Picture {i}: <|vision_start|><|image_pad|><|vision_end|>"
                                        for i in range(1, len(pixels) + 1)) + prompt)
    inputs = {}
    if pixels:
        inputs = dict(processor(images=[Image.fromarray(p.numpy()) for p in pixels], return_tensors="pt"))
        for n in (inputs["image_grid_thw"].prod(-1) // merge).tolist():
            text = text.replace("<|image_pad|>", "<|placeholder|>" * n, 1)
        text = text.replace("<|placeholder|>", "<|image_pad|>")
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    image_rows = ids[0] == IMAGE_PAD_ID
    with torch.no_grad():
        out = reference.model(input_ids=ids, mm_token_type_ids=image_rows[None].int(), output_hidden_states=True,
                              **inputs)
        taps = [out.hidden_states[k].clone() for k in KREA2_LAYERS]
        if pixels and after_deepstack:
            deepstack = reference.model.get_image_features(inputs["pixel_values"],
                                                           inputs["image_grid_thw"]).deepstack_features
            for tap, k in zip(taps, KREA2_LAYERS):
                if 1 <= k <= len(deepstack):
                    tap[0, image_rows] += torch.cat(deepstack[k - 1])
    second_user = [i for i, t in enumerate(ids[0].tolist()) if t == 151644][1] + 3
    return torch.stack(taps, dim=2)[0, second_user:]


def as_image(pixels: torch.Tensor) -> torch.Tensor:
    """A ComfyUI IMAGE [1, H, W, 3] in [0, 1]."""
    return (pixels.float() / 255)[None]


@pytest.mark.parametrize("count,prompt", [(1, PROMPT), (2, PROMPT), (1, ""), (0, PROMPT)],
                         ids=["one", "two", "no_prompt", "no_picture"])
def test_prompt_and_pictures_match_transformers(encoder, reference, pictures, count, prompt):
    """The rows within 1e-4 of the oracle (0 measured: the same transformers modules on the same pixels)."""
    got = encoder.encode_reference(prompt, [as_image(p) for p in pictures[:count]])
    want = comfy_rows(reference, prompt, pictures[:count])
    assert got.shape == want.shape == (want.shape[0], len(KREA2_LAYERS), QWEN3_VL_TEXT_TINY["hidden_size"])
    assert got.dtype == torch.float32
    assert rel_err(got, want) <= 1e-4


def test_deepstack_reaches_the_first_tap(encoder, reference, pictures):
    """Tap 2 holds DeepStack's second features on the picture rows (ComfyUI's taps), which transformers'
    hidden_states[2] has not: the rule is exercised, not a no-op; the deeper taps agree either way."""
    got = encoder.encode_reference(PROMPT, [as_image(pictures[0])])
    plain = comfy_rows(reference, PROMPT, pictures[:1], after_deepstack=False)
    assert rel_err(got[:, 0], plain[:, 0]) > 1e-3
    assert rel_err(got[:, 1:], plain[:, 1:]) <= 1e-4


def test_pictures_need_the_vision_tower(text_file, pictures, tmp_path, reference):
    """Loaded without vision, prompts encode and pictures are refused saying how; a file without visual.* is
    refused when vision is asked for."""
    plain = Krea2TextEncoder.load(text_file, TOKENIZER_DIR)
    assert plain.vision is None and plain.encode_reference(PROMPT).shape[1] == len(KREA2_LAYERS)
    with pytest.raises(WeightsError, match=r"without its vision tower \(load\(vision=True\)\)"):
        plain.encode_reference(PROMPT, [as_image(pictures[0])])
    path = tmp_path / "qwen3vl_text_only.safetensors"
    save_file({k: v for k, v in qwen3_vl_layout(reference, "comfy").items() if not k.startswith("visual.")},
              str(path))
    with pytest.raises(WeightsError, match="qwen3vl_text_only.safetensors: has no vision tower"):
        Krea2TextEncoder.load(path, TOKENIZER_DIR, vision=True, vision_heads=VISION["num_heads"],
                              deepstack_layers=tuple(VISION["deepstack_visual_indexes"]))


def test_cancel_before_pictures_and_layers(encoder, pictures):
    calls = []
    encoder.encode_reference("x", [as_image(p) for p in pictures], lambda: calls.append(1))
    assert len(calls) == len(pictures) + max(KREA2_LAYERS)
