"""MiniMax H3's text rows (dit_core/text/qwen3_vl.py MiniMaxH3TextEncoder) vs transformers' hidden_states[k] and
diffusers' get_qwen3vl_prompt_embeds on a tiny random Qwen3-VL, its verbatim tokenization vs the Qwen2 tokenizer,
and its refusals (wrong width, the NVFP4-AWQ file)."""
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import COMFYUI_TREE, rel_err
from safetensors.torch import save_file
from tiny_models import QWEN3_VL_TEXT_TINY, int8_convrot_state, qwen3_vl_layout, random_qwen3_vl
from transformers import Qwen2Tokenizer

from dit_core.text.qwen3_vl import H3_INT8_FILE, MiniMaxH3TextEncoder
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


def nvfp4_state(state: dict, fmt: str) -> tuple[dict, dict]:
    """The tiny model's linears shaped as ComfyUI's NVFP4 stores them (U8 [N, K/2] two codes a byte, FP8 block
    scales of 16, an f32 global scale); the marker's format is `fmt` (the real file's marker is not documented)."""
    out = dict(state)
    layers = []
    for key in [k for k in state if k.startswith("model.layers.") and k.endswith("_proj.weight")]:
        layer = key.removesuffix(".weight")
        n, k = state[key].shape
        out[key] = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        out[f"{layer}.weight_scale"] = torch.ones(n, k // 16).to(torch.float8_e4m3fn)
        out[f"{layer}.weight_scale_2"] = torch.ones(())
        layers.append(layer)
    return out, {layer: {"format": fmt} for layer in layers}


@pytest.mark.parametrize("fmt", ["nvfp4", "awq_w4a16"])
@pytest.mark.parametrize("where", ["comfy_quant", "header"])
def test_nvfp4_file_is_refused_naming_the_int8_file(tmp_path, reference, fmt, where):
    """Markers as a `.comfy_quant` tensor a layer or in the header's _quantization_metadata: refused before any
    weight is read, naming the drop-in INT8 file."""
    state, markers = nvfp4_state(qwen3_vl_layout(reference, "comfy"), fmt)
    metadata = None
    if where == "comfy_quant":
        for layer, marker in markers.items():
            state[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    else:
        metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": markers})}
    path = tmp_path / "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"
    save_file(state, str(path), metadata=metadata)
    with pytest.raises(WeightsError, match=rf"qwen3vl_32b_minimax_h3_nvfp4_awq\.safetensors: .*{fmt}.*"
                                           rf"use the drop-in {H3_INT8_FILE}"):
        load(path)
