"""FLUX.3 Klein's text rows vs diffusers' Flux3TextEncoderStep, Krea 2's vs Krea2Pipeline.get_text_hidden_states, over
transformers' Qwen3VLForConditionalGeneration."""
from types import SimpleNamespace

import pytest
import torch
from conftest import COMFYUI_TREE, rel_err
from safetensors.torch import save_file
from tiny_models import (
    QWEN3_VL_TEXT_TINY,
    int8_convrot_state,
    qwen3_comfy_layout,
    qwen3_vl_layout,
    random_qwen3,
    random_qwen3_vl,
)

from dit_core.text.qwen3_vl import (
    KREA2_LAYERS,
    LAYERS,
    PAD_ID,
    KleinPromptTokenizer,
    Krea2TextEncoder,
    Qwen3VLTextEncoder,
)
from dit_core.weights import WeightsError

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
HIDDEN = QWEN3_VL_TEXT_TINY["hidden_size"]
# The user-string branch of Qwen3-VL-Instruct's chat template (no default system prompt, unlike Qwen2-VL's);
# only what apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True) reaches.
QWEN3_VL_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
                     "{{- message.content }}{{- '<|im_end|>\\n' }}{%- endfor %}"
                     "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
PROMPTS = {
    "english": "A photo of a cat sitting on a windowsill at golden hour, 35mm, shallow depth of field.",
    "unicode": "东京的夜景，霓虹灯闪烁 🌃🐱✨ — café naïve Zürich Ångström Привет 𝔘𝔫𝔦",
    "empty": "",
    "long": " ".join(f"a red fox number {i} jumps over the lazy dog;" for i in range(12)),  # > 80 tokens
    "special_tokens": "say <|im_end|> then (weighted:1.2) \\(escaped\\) embedding:foo",
}


@pytest.fixture(scope="module")
def reference():
    return random_qwen3_vl()


@pytest.fixture(scope="module")
def processor():
    """What diffusers' text step reads from its AutoProcessor: apply_chat_template and .tokenizer."""
    from transformers import Qwen2Tokenizer
    tok = Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))
    tok.chat_template = QWEN3_VL_TEMPLATE
    return SimpleNamespace(apply_chat_template=tok.apply_chat_template, tokenizer=tok)


def diffusers_rows(reference, processor, prompt, max_sequence_length=8192):
    from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep
    with torch.no_grad():
        return Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
            reference, processor, prompt, device=torch.device("cpu"), max_sequence_length=max_sequence_length)


@pytest.fixture(scope="module")
def files(reference, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_vl")
    hf, comfy = qwen3_vl_layout(reference, "hf"), qwen3_vl_layout(reference, "comfy")
    paths = {"hf": root / "qwen3vl_tiny_hf.safetensors", "comfy": root / "qwen3vl_tiny.safetensors",
             "int8": root / "qwen3vl_tiny_int8_convrot.safetensors"}
    save_file(hf, str(paths["hf"]))
    save_file(comfy, str(paths["comfy"]))
    # ConvRot group 64: the tiny in-features are 64 and 128
    save_file(int8_convrot_state(comfy, lambda k: k.startswith("model.layers.") and "_proj" in k), str(paths["int8"]))
    return paths


@pytest.fixture(scope="module")
def encoder(files):
    return Qwen3VLTextEncoder.load(files["hf"], TOKENIZER_DIR, expected_hidden=HIDDEN)


# --- rows ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PROMPTS))
def test_rows_match_diffusers(name, encoder, reference, processor):
    got = encoder.encode(PROMPTS[name])
    want = diffusers_rows(reference, processor, PROMPTS[name])
    assert got.shape == want.shape and got.shape[1] % 80 == 0 and got.shape[2] == 8 * HIDDEN
    assert got.dtype == torch.float32
    assert rel_err(got, want) <= 1e-5
    if name == "long":
        assert got.shape[1] == 160


def test_rows_are_hidden_states_4_to_32(encoder, reference):
    """Layer-major concat of hidden_states[4], ..., [32] (hidden_states[0] is the embeddings), pads at position
    id 1 and masked as keys: checked against the reference model run directly, not through diffusers."""
    ids = encoder.tokenize(PROMPTS["english"])
    n = len(ids)
    padded = torch.tensor([ids + [PAD_ID] * (80 - n)])
    mask = (torch.arange(80) < n).long()[None]
    positions = torch.arange(80)[None].masked_fill(mask == 0, 1)
    with torch.no_grad():
        hs = reference(input_ids=padded, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                       use_cache=False).hidden_states
    got = encoder.encode_ids(ids)
    for j, k in enumerate(LAYERS):
        assert rel_err(got[..., j * HIDDEN:(j + 1) * HIDDEN], hs[k]) <= 1e-5, k
    # only the 32 layers the taps need are built (the tiny reference has 34), and no final norm
    assert len(encoder.model.layers) == 32 and isinstance(encoder.model.norm, torch.nn.Identity)


def test_comfy_layout(files, encoder):
    comfy = Qwen3VLTextEncoder.load(files["comfy"], TOKENIZER_DIR)
    assert torch.equal(comfy.encode(PROMPTS["english"]), encoder.encode(PROMPTS["english"]))


def test_int8_convrot_close_to_float(files, encoder):
    quant = Qwen3VLTextEncoder.load(files["int8"], TOKENIZER_DIR, expected_hidden=HIDDEN)
    prompt = PROMPTS["unicode"]
    got, want = quant.encode(prompt), encoder.encode(prompt)
    first = rel_err(got[..., :HIDDEN], want[..., :HIDDEN])  # hidden_states[4]
    # the quantized weights were really used, and are close; the error grows with depth through 32 random layers
    assert 1e-4 < first <= 3e-2 and rel_err(got, want) <= 5e-2


# --- tokens and padding -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    return KleinPromptTokenizer(TOKENIZER_DIR)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_tokens_match_diffusers(name, tokenizer, processor):
    text = processor.apply_chat_template([{"role": "user", "content": PROMPTS[name]}], tokenize=False,
                                         add_generation_prompt=True)
    want = processor.tokenizer(text)["input_ids"]
    assert tokenizer(PROMPTS[name]) == want


def test_template_and_padding(tokenizer):
    ids = tokenizer("")
    assert tokenizer.tokenizer.decode(ids) == "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == 151644 and PAD_ID not in ids
    padded, mask = tokenizer.pad(ids)
    assert len(padded) == 80 and padded[len(ids):] == [PAD_ID] * (80 - len(ids))
    assert mask == [1] * len(ids) + [0] * (80 - len(ids))
    assert tokenizer.pad([5] * 80) == ([5] * 80, [1] * 80)  # an exact multiple gets no pad row
    assert len(tokenizer.pad([5] * 81)[0]) == 160


def test_a_prompt_over_max_length_is_refused(files):
    """diffusers truncates silently; we refuse, naming the length and the limit (the node adds its name)."""
    enc = Qwen3VLTextEncoder.load(files["hf"], TOKENIZER_DIR)
    enc.tokenizer.max_length = 100
    with pytest.raises(ValueError, match=r"prompt is \d+ tokens .* more than the text encoder's 100; shorten it"):
        enc.encode(PROMPTS["long"])
    enc.tokenizer.max_length = 8192
    enc.tokenizer.max_length = len(enc.tokenize(PROMPTS["long"]))  # exactly at the limit: accepted
    assert enc.encode(PROMPTS["long"]).shape[1] == enc.tokenizer.max_length


# --- errors -------------------------------------------------------------------------------------------------

def test_not_a_text_encoder(tmp_path):
    path = tmp_path / "flux3-image-klein-int8-convrot.safetensors"
    save_file({"txt_in.weight": torch.zeros(32, 64), "single_blocks.0.q_proj.weight": torch.zeros(32, 32)},
              str(path))
    with pytest.raises(WeightsError, match=r"flux3-image-klein-int8-convrot\.safetensors.*not a text encoder"
                                           r".*Qwen3-VL"):
        Qwen3VLTextEncoder.load(path, TOKENIZER_DIR)


def test_too_few_layers(tmp_path):
    path = tmp_path / "qwen_3_4b_cut.safetensors"
    save_file(qwen3_comfy_layout(random_qwen3()), str(path))  # 4 layers
    with pytest.raises(WeightsError, match=r"qwen_3_4b_cut\.safetensors.*4 layers.*need 32"):
        Qwen3VLTextEncoder.load(path, TOKENIZER_DIR)


# --- Krea 2: hidden states 2, 5, ..., 35 stacked per token, the system prefix's rows dropped ---------------------

@pytest.fixture(scope="module")
def krea2_reference():
    return random_qwen3_vl(seed=5, num_hidden_layers=36)  # Qwen3-VL-4B's depth: tap 35 is not the last layer


@pytest.fixture(scope="module")
def krea2_encoder(krea2_reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("krea2_text") / "qwen3vl_4b.safetensors"
    save_file(qwen3_vl_layout(krea2_reference, "comfy"), path)
    return Krea2TextEncoder.load(path, TOKENIZER_DIR)


def krea2_diffusers_rows(reference, prompt):
    """diffusers' rows [512, 12, hidden] and mask [512] (prompt padded to 541 tokens before the 5 suffix ones)."""
    from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline
    from transformers import Qwen2Tokenizer
    pipe = Krea2Pipeline(scheduler=None, vae=None, text_encoder=reference.model,
                         tokenizer=Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR)), transformer=None)
    with torch.no_grad():
        rows, mask = pipe.get_text_hidden_states(prompt, device=torch.device("cpu"))
    return rows[0], mask[0]


@pytest.mark.parametrize("name", ["english", "unicode", "empty", "special_tokens"])
def test_krea2_rows_match_diffusers_valid_rows(name, krea2_encoder, krea2_reference):
    """Our rows are diffusers' valid ones (the prompt's and the suffix's; its pads are masked keys at no position,
    and Krea 2's transformer drops them): encoded without pads, the same states."""
    rows, mask = krea2_diffusers_rows(krea2_reference, PROMPTS[name])
    got = krea2_encoder.encode(PROMPTS[name])
    assert rows.shape == (512, len(KREA2_LAYERS), HIDDEN) and not mask.all()
    assert got.shape == (int(mask.sum()), len(KREA2_LAYERS), HIDDEN)
    assert rel_err(got, rows[mask]) <= 1e-5


def test_krea2_prompt_over_max_length_is_refused(krea2_encoder):
    with pytest.raises(ValueError, match="more than the text encoder's 541; shorten it"):
        krea2_encoder.encode(PROMPTS["long"] * 6)


def test_krea2_needs_its_taps(krea2_encoder):
    with pytest.raises(ValueError, match="Krea 2 reads"):
        Krea2TextEncoder(Qwen3VLTextEncoder(krea2_encoder.encoder.model, krea2_encoder.encoder.tokenizer, LAYERS))


def test_krea2_layers_stream(krea2_reference, tmp_path):
    """Krea 2's encoder wraps a Qwen3-VL one: its text_model is the one whose layers stream
    (dit_core/gpu/text_streaming.py; the slot here on the host), giving the resident rows bit for bit."""
    from dit_core.gpu.text_streaming import stream_layers
    path = tmp_path / "qwen3vl_4b.safetensors"
    save_file(qwen3_vl_layout(krea2_reference, "comfy"), path)
    encoder = Krea2TextEncoder.load(path, TOKENIZER_DIR)
    assert encoder.text_model is encoder.encoder.model
    want = encoder.encode(PROMPTS["english"])
    stream_layers(encoder.text_model, torch.device("cpu"))
    assert torch.equal(encoder.encode(PROMPTS["english"]), want)
