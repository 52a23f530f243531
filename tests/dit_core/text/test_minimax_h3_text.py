"""MiniMax H3's text rows (dit_core/text/qwen3_vl.py MiniMaxH3TextEncoder) vs transformers' hidden_states[k] and
diffusers' get_qwen3vl_prompt_embeds on a tiny random Qwen3-VL, its verbatim tokenization vs the Qwen2 tokenizer,
its NVFP4-AWQ file (the template's) and its refusals (wrong width, a format it does not read); with pictures
(encode_tagged: "<Picture i>: " labels and vision blocks through the file's vision tower), rows and tags vs
diffusers' MiniMaxH3FL2VATextEncoderStep."""
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import COMFYUI_TREE, rel_err
from PIL import Image
from safetensors.torch import save_file
from tiny_models import (QWEN3_VL_TEXT_TINY, QWEN3_VL_VISION_TINY, int8_convrot_state, nvfp4_state,
                         qwen3_vl_layout, random_qwen3_vl)
from transformers import Qwen2Tokenizer

from dit_core.families.minimax_h3 import TEXT, VIDEO
from dit_core.text.qwen3_vl import H3_EXTRA_TOKENS, H3_INT8_FILE, MiniMaxH3TextEncoder
from dit_core.text.qwen3_vl_vision import IMAGE_PAD_ID, VISION_MAX_PIXELS, VISION_MIN_PIXELS, picture_size
from dit_core.weights import WeightsError

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
HIDDEN = QWEN3_VL_TEXT_TINY["hidden_size"]
TINY_LAYERS = 8  # H3 reads hidden_states[50] of 64 layers: the tiny model reads 6 of 8, a middle layer as there
TINY_LAYER = 6
PROMPTS = {
    "english": "A woman in a red coat walks through falling snow at dusk, the camera tracking beside her; "
               "she says: \"We're almost home.\"",
    "unicode": "东京的夜景，霓虹灯闪烁 🌃🐱✨ — café naïve Zürich Ångström Привет 𝔘𝔫𝔦",
    "leading_space": "  two spaces, a tab\tand a newline\nthen more",
    "special_tokens": "say <|im_end|> then <Picture 1>: (weighted:1.2)",
}


@pytest.fixture(scope="module")
def reference():
    return random_qwen3_vl(seed=7, num_hidden_layers=TINY_LAYERS)


@pytest.fixture(scope="module")
def files(reference, tmp_path_factory):
    root = tmp_path_factory.mktemp("minimax_h3_text")
    comfy = qwen3_vl_layout(reference, "comfy")
    paths = {"hf": root / "qwen3vl_tiny_hf.safetensors", "comfy": root / "qwen3vl_tiny.safetensors",
             "int8": root / "qwen3vl_tiny_int8_convrot.safetensors"}
    save_file(qwen3_vl_layout(reference, "hf"), str(paths["hf"]))
    save_file(comfy, str(paths["comfy"]))
    save_file(int8_convrot_state(comfy, lambda k: k.startswith("model.layers.") and "_proj" in k), str(paths["int8"]))
    return paths


def load(path, **kw):
    """The tiny model's encoder: its layer, width, and its vision tower's heads and DeepStack layer (H3's are not
    in the tensors either)."""
    kw = {"vision_heads": QWEN3_VL_VISION_TINY["num_heads"],
          "deepstack_layers": tuple(QWEN3_VL_VISION_TINY["deepstack_visual_indexes"]), **kw}
    return MiniMaxH3TextEncoder.load(path, TOKENIZER_DIR, layer=TINY_LAYER, expected_hidden=HIDDEN, **kw)


@pytest.fixture(scope="module")
def encoder(files):
    return load(files["comfy"])


@pytest.fixture(scope="module")
def tokenizer():
    return Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))


# --- rows -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PROMPTS))
def test_rows_are_hidden_states_k(name, encoder, reference, tokenizer):
    """hidden_states[TINY_LAYER] of the reference run on the same ids (all keys seen, positions 0..L-1 as
    transformers gives text rows), [1, L, hidden] f32."""
    ids = tokenizer(PROMPTS[name], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        hs = reference.model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)).long(),
                             output_hidden_states=True, use_cache=False).hidden_states
    got = encoder.encode(PROMPTS[name])
    assert got.shape == (1, len(ids), HIDDEN) and got.dtype == torch.float32
    assert rel_err(got, hs[TINY_LAYER]) <= 1e-5
    # the tap is the one asked for: its neighbours differ
    assert rel_err(got, hs[TINY_LAYER - 1]) > 1e-2 and rel_err(got, hs[TINY_LAYER + 1]) > 1e-2


@pytest.mark.parametrize("name", ["english", "special_tokens"])
def test_rows_match_diffusers(name, encoder, reference, tokenizer):
    """diffusers' MiniMaxH3TextEncoderStep path: tokenizer(prompt, add_special_tokens=False), then
    get_qwen3vl_prompt_embeds (its processor only gives the mm token types: 0 for every text token)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    processor = SimpleNamespace(create_mm_token_type_ids=lambda batch: [[0] * len(ids) for ids in batch])
    ids = tokenizer(PROMPTS[name], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        want = get_qwen3vl_prompt_embeds(reference, processor, ids, {}, text_encoder_layer=TINY_LAYER,
                                         device=torch.device("cpu"), dtype=torch.float32)
    assert rel_err(encoder.encode(PROMPTS[name]), want) <= 1e-5


def test_only_the_layers_needed(encoder):
    assert len(encoder.model.layers) == TINY_LAYER and isinstance(encoder.model.norm, torch.nn.Identity)
    assert MiniMaxH3TextEncoder.LAYER == 50 and MiniMaxH3TextEncoder.HIDDEN == 5120


def test_hf_layout_same_rows(files, encoder):
    assert torch.equal(load(files["hf"]).encode(PROMPTS["english"]), encoder.encode(PROMPTS["english"]))


def test_int8_convrot_file_is_read(files, encoder):
    """The drop-in INT8 ConvRot file is not refused; its rows are close to the float file's (6 random layers:
    0.017-0.021 measured over the four prompts, 1.5x headroom; a misread of codes, scales or rotation lands near 1)."""
    err = rel_err(load(files["int8"]).encode(PROMPTS["unicode"]), encoder.encode(PROMPTS["unicode"]))
    assert 1e-4 < err <= 3e-2, err


def test_cancel_between_layers(encoder):
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        encoder.encode(PROMPTS["english"], check)
    assert len(calls) == 3


# --- tokens -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PROMPTS))
def test_tokens_are_the_plain_encoding(name, encoder, tokenizer):
    """The Qwen2 tokenizer's plain encoding of the prompt: no template, nothing added around it."""
    ids = encoder.tokenize(PROMPTS[name])
    assert ids == tokenizer(PROMPTS[name], add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(PROMPTS[name])["input_ids"]  # Qwen2 adds no BOS/EOS either way
    assert tokenizer.decode(ids) == PROMPTS[name]
    assert 151644 not in ids  # <|im_start|>: no chat template


def test_empty_prompt_is_refused(encoder):
    with pytest.raises(ValueError, match="prompt is empty"):
        encoder.encode("")


# --- errors -----------------------------------------------------------------------------------------------------

def test_wrong_hidden_size_names_the_file_h3_needs(files):
    """H3's default width check (5120) on a 64-wide file: the file, its width and the file H3 needs."""
    with pytest.raises(WeightsError, match=rf"qwen3vl_tiny\.safetensors: .*hidden size 64, expected 5120 .*"
                                           rf"Qwen3-VL-32B.*{H3_INT8_FILE}"):
        MiniMaxH3TextEncoder.load(files["comfy"], TOKENIZER_DIR, layer=TINY_LAYER)


def test_too_few_layers(files):
    with pytest.raises(WeightsError, match=r"qwen3vl_tiny\.safetensors.*8 layers.*need 50"):
        MiniMaxH3TextEncoder.load(files["comfy"], TOKENIZER_DIR, expected_hidden=HIDDEN)


@pytest.mark.parametrize("awq", [True, False], ids=["nvfp4_awq", "nvfp4"])
def test_nvfp4_file_is_read(tmp_path, reference, encoder, awq):
    """The template's default text encoder, NVFP4-AWQ (qwen3vl_32b_minimax_h3_nvfp4_awq): its linears decoded as
    comfy-kitchen decodes them, AWQ's pre_quant_scale applied to their inputs as ComfyUI's forward applies it, and
    requantized to INT8 ConvRot: rows within the INT8 file's bound of the float model those layers compute."""
    stored, computed = nvfp4_state(qwen3_vl_layout(reference, "comfy"),
                                   lambda k: k.startswith("model.layers.") and "_proj" in k, awq)
    paths = tmp_path / "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors", tmp_path / "computed.safetensors"
    save_file(stored, str(paths[0]))
    save_file(computed, str(paths[1]))
    err = rel_err(load(paths[0]).encode(PROMPTS["unicode"]), load(paths[1]).encode(PROMPTS["unicode"]))
    assert 1e-4 < err <= 3e-2, err


@pytest.mark.parametrize("where", ["comfy_quant", "header"])
def test_an_unread_format_is_refused_naming_the_int8_file(tmp_path, reference, where):
    """awq_w4a16 (4-bit codes with zeros, group 64), as a `.comfy_quant` tensor a layer or in the header's
    _quantization_metadata: refused before any weight is read, naming the drop-in INT8 file."""
    state = qwen3_vl_layout(reference, "comfy")
    layers = [k.removesuffix(".weight") for k in state if k.startswith("model.layers.") and k.endswith("_proj.weight")]
    for layer in layers:
        n, k = state[f"{layer}.weight"].shape
        state[f"{layer}.weight"] = torch.zeros(n, k // 2, dtype=torch.int8)
    markers = {layer: {"format": "awq_w4a16"} for layer in layers}
    metadata = None
    if where == "comfy_quant":
        for layer, marker in markers.items():
            state[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    else:
        metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": markers})}
    path = tmp_path / "qwen3vl_32b_minimax_h3_awq.safetensors"
    save_file(state, str(path), metadata=metadata)
    with pytest.raises(WeightsError, match=rf"qwen3vl_32b_minimax_h3_awq\.safetensors: .*awq_w4a16.*"
                                           rf"or its drop-in {H3_INT8_FILE}"):
        load(path)


# --- pictures ---------------------------------------------------------------------------------------------------

PATCH, MERGE = QWEN3_VL_VISION_TINY["patch_size"], QWEN3_VL_VISION_TINY["spatial_merge_size"]
# 8-bit pixels (as a resized keyframe is), sides on the tiny tower's grid (patch 4 x merge 2): neither ComfyUI's
# resize nor diffusers' changes them, so both read the same pixels. A landscape and a portrait one: unequal grids.
PICTURE_SIZES = ((64, 96), (96, 64))


@pytest.fixture(scope="module")
def pictures():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8) for h, w in PICTURE_SIZES]


def as_image(pixels: torch.Tensor) -> torch.Tensor:
    """A ComfyUI IMAGE [1, H, W, 3] in [0, 1]."""
    return (pixels.float() / 255)[None]


def diffusers_fl2va(reference, prompt: str, pixels: list[torch.Tensor]):
    """diffusers' MiniMaxH3FL2VATextEncoderStep on the reference model: (prompt_embeds, text_token_tags). The
    processor's image part is Qwen3-VL's (patch and merge of the tiny tower, mean and std 0.5) with ComfyUI's pixel
    bounds, on its PIL backend (transformers' default one needs torchvision); its token types as Qwen3VLProcessor
    derives them (image pads 1, the rest 0)."""
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3FL2VATextEncoderStep
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=QWEN3_VL_VISION_TINY["temporal_patch_size"],
        image_mean=[0.5] * 3, image_std=[0.5] * 3, min_pixels=VISION_MIN_PIXELS, max_pixels=VISION_MAX_PIXELS)
    processor = SimpleNamespace(image_processor=image_processor, create_mm_token_type_ids=lambda batch: [
        [int(t == IMAGE_PAD_ID) for t in ids] for ids in batch])
    components = SimpleNamespace(tokenizer=Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR)), processor=processor,
                                 text_encoder=reference, text_encoder_layer=TINY_LAYER,
                                 _execution_device=torch.device("cpu"), text_tag=TEXT, video_tag=VIDEO)
    state = PipelineState()
    state.set("prompt", prompt)
    state.set("keyframes", [Image.fromarray(p.numpy()) for p in pixels])
    with torch.no_grad():
        _, state = MiniMaxH3FL2VATextEncoderStep()(components, state)
    return state.get("prompt_embeds"), state.get("text_token_tags")


@pytest.mark.parametrize("count,prompt", [(1, PROMPTS["english"]), (2, PROMPTS["unicode"]), (1, "")],
                         ids=["one", "two", "no_prompt"])
def test_pictures_match_diffusers(count, prompt, encoder, reference, pictures):
    """One picture (fl2va's first or last frame alone), two (both), and pictures without a prompt: rows within
    1e-4 (0 measured: the same transformers modules on the same pixels), tags equal."""
    rows, tags = encoder.encode_tagged(prompt, [as_image(p) for p in pictures[:count]])
    want_rows, want_tags = diffusers_fl2va(reference, prompt, pictures[:count])
    assert rows.shape == want_rows.shape and rows.dtype == torch.float32
    assert rel_err(rows, want_rows) <= 1e-4
    assert torch.equal(tags, want_tags)


def test_picture_rows_and_tags_layout(encoder, pictures, tokenizer):
    """Per picture "<Picture i>: " (text tags), then <|vision_start|>, (H/8)(W/8) image pads and <|vision_end|>
    tagged as video (tag 0, minimax_h3.md section 8: "those rows tag 0"), then the prompt (text tags)."""
    assert (VIDEO, TEXT) == (0, 1)
    rows, tags = encoder.encode_tagged("go", [as_image(p) for p in pictures])
    label = [len(tokenizer(f"<Picture {i}>: ", add_special_tokens=False)["input_ids"]) for i in (1, 2)]
    pads = [(h // (PATCH * MERGE)) * (w // (PATCH * MERGE)) for h, w in PICTURE_SIZES]
    want = []
    for n_label, n_pads in zip(label, pads):
        want += [TEXT] * n_label + [VIDEO] * (n_pads + 2)
    want += [TEXT] * len(tokenizer("go", add_special_tokens=False)["input_ids"])
    assert tags.tolist() == want and rows.shape == (1, len(want), HIDDEN)


def test_without_pictures_rows_are_encode(encoder):
    rows, tags = encoder.encode_tagged(PROMPTS["english"])
    assert torch.equal(rows, encoder.encode(PROMPTS["english"]))
    assert tags.dtype == torch.long and tags.tolist() == [TEXT] * rows.shape[1]


def test_cancel_before_pictures_and_layers(encoder, pictures):
    calls = []
    encoder.encode_tagged("x", [as_image(p) for p in pictures], lambda: calls.append(1))
    assert len(calls) == len(pictures) + TINY_LAYER


def test_pictures_change_the_prompt_rows(encoder, pictures):
    """The prompt's rows see the pictures (a vision tower that ran on nothing would leave them alone)."""
    a = encoder.encode_tagged("a cat", [as_image(pictures[0])])[0][:, -2:]
    b = encoder.encode_tagged("a cat", [as_image(pictures[0].flip(1))])[0][:, -2:]
    assert rel_err(a, b) > 1e-3


def test_hf_layout_reads_its_vision_tower(files, encoder, pictures):
    """transformers' layout (model.visual.*) gives the rows ComfyUI's (visual.*) does."""
    images = [as_image(p) for p in pictures]
    got, want = load(files["hf"]).encode_tagged("x", images), encoder.encode_tagged("x", images)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("size", [(64, 96), (50, 70), (20, 20), (1000, 30), (4000, 3000), (768, 1344), (7, 900)])
@pytest.mark.parametrize("factor", [PATCH * MERGE, 32])
def test_picture_size_is_smart_resize(size, factor):
    """ComfyUI's grid rule (process_qwen2vl_images: min 3136, max 12845056 pixels) is Qwen2-VL's smart_resize with
    those bounds: on the grid as is, off it rounded, too small scaled up, too large scaled down."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    assert picture_size(*size, factor) == smart_resize(*size, factor, VISION_MIN_PIXELS, VISION_MAX_PIXELS)


def test_picture_off_the_grid_is_resized(encoder):
    """A 50 x 70 picture is read at 48 x 72 (6 x 9 merged rows), a 20 x 20 one at 56 x 56 (7 x 7: at least 3136
    pixels)."""
    for (h, w), pads in (((50, 70), 6 * 9), ((20, 20), 7 * 7)):
        rows, tags = encoder.encode_tagged("x", [torch.rand(1, h, w, 3)])
        assert (tags == VIDEO).sum() == pads + 2 and torch.isfinite(rows).all()


def test_int8_convrot_vision_tower_is_read(tmp_path, reference, encoder, pictures):
    """Vision linears stored as INT8 ConvRot (groups of 16: the tiny tower's widths) are dequantized: rows with a
    picture within 2e-2 of the float file's (0.0066 measured; codes read as values land near 1)."""
    path = tmp_path / "qwen3vl_tiny_vision_int8.safetensors"
    state = qwen3_vl_layout(reference, "comfy")
    save_file(int8_convrot_state(state, lambda k: k.startswith("visual.") and k != "visual.pos_embed.weight", 16),
              str(path))
    images = [as_image(pictures[0])]
    err = rel_err(load(path).encode_tagged("a cat", images)[0], encoder.encode_tagged("a cat", images)[0])
    assert 1e-4 < err <= 2e-2, err


def test_pictures_need_the_vision_tower(tmp_path, reference, pictures):
    """A file without visual.* reads prompts, and refuses pictures naming itself."""
    path = tmp_path / "qwen3vl_text_only.safetensors"
    save_file({k: v for k, v in qwen3_vl_layout(reference, "comfy").items() if not k.startswith("visual.")},
              str(path))
    encoder = load(path)
    assert encoder.vision is None and encoder.encode_tagged("x")[0].shape == (1, 1, HIDDEN)
    with pytest.raises(WeightsError, match=r"qwen3vl_text_only\.safetensors: has no vision tower"):
        encoder.encode_tagged("x", [as_image(pictures[0])])


def test_vision_tower_of_another_shape_refuses_pictures(files, pictures):
    """A vision tower that does not fit H3's heads and DeepStack layers: prompts still encode, pictures are refused
    naming the file and the misfit."""
    encoder = load(files["comfy"], deepstack_layers=(8, 16, 24))
    assert encoder.vision is None and encoder.encode_tagged("x")[0].shape == (1, 1, HIDDEN)
    with pytest.raises(WeightsError, match=r"qwen3vl_tiny\.safetensors: vision tower of 1 blocks.*DeepStack.*"
                                           r"cannot read the 1 picture"):
        encoder.encode_tagged("x", [as_image(pictures[0])])


def test_extra_tokens_and_typed_pads(encoder, pictures):
    """The release's extra tokens typed in a prompt are single tokens (ids 151669.., as ComfyUI adds them); an
    <|image_pad|> typed in the prompt stays a text row."""
    assert encoder.tokenize("".join(H3_EXTRA_TOKENS)) == list(range(151669, 151669 + len(H3_EXTRA_TOKENS)))
    rows, tags = encoder.encode_tagged("a <|image_pad|> b", [as_image(pictures[0])])
    typed = encoder.tokenize("a <|image_pad|> b")
    assert IMAGE_PAD_ID in typed and tags[-len(typed):].tolist() == [TEXT] * len(typed)
    assert torch.isfinite(rows).all()


@pytest.mark.parametrize("pictures_given,audios,prompt", [(2, 1, "they sing <Audio 1>"), (0, 2, ""), (1, 0, "x")],
                         ids=["pictures_and_audio", "audio_alone", "picture"])
def test_reference_presentation_matches_diffusers(encoder, tokenizer, pictures_given, audios, prompt):
    """ref2va's text: "<Picture i>: " and a vision block per reference image, then "<Audio j>: " alone per
    standalone reference audio (ComfyUI's order for such a request), then the prompt: ids and tags as diffusers'
    MiniMaxH3Ref2VATextEncoderStep._build_presentation gives them (vision pads laid out to their grids)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference, MiniMaxH3ImageReference
    grids = [(h // (PATCH * MERGE), w // (PATCH * MERGE)) for h, w in PICTURE_SIZES][:pictures_given]
    refs = [MiniMaxH3ImageReference(image=None)] * pictures_given + [MiniMaxH3AudioReference(audio=None)] * audios
    want_ids, want_tags = MiniMaxH3Ref2VATextEncoderStep._build_presentation(
        tokenizer, prompt, refs, [gh * gw for gh, gw in grids], [], [], TEXT, VIDEO)
    shown = encoder.tokenizer.presentation(prompt, grids, audios)
    assert shown.ids == want_ids and shown.tags == want_tags
    if pictures_given == 0:  # labels alone: no tower read; rows are the labelled prompt's encoding
        rows, tags = encoder.encode_tagged(prompt, audios=audios)
        assert torch.equal(rows, encoder.encode_ids(want_ids)) and tags.tolist() == want_tags
