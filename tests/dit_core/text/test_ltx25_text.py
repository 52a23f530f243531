"""LTX-2.5's text path (dit_core/text/gemma4.py) vs diffusers 0.42.1 on a tiny random Gemma-4 (transformers'
Gemma4UnifiedForConditionalGeneration, text only) and tiny LTX2TextConnectors from the same weights: the text
encoder file in ComfyUI's flat layout with the feature projections and its tokenizer.json inside, the connectors in
a DiT file under model.diffusion_model.; and refusals of other text encoder files."""
from types import SimpleNamespace

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import int8_convrot_state, qwen3_comfy_layout, random_qwen3

from dit_core.text.gemma4 import (
    ENHANCER_FILE,
    MAX_LENGTH,
    TEMPLATE_FILE,
    Gemma4TextEncoder,
    LTX25TextConnectors,
    encode_prompt,
)
from dit_core.weights import WeightsError

# Gemma-4 12B in small: 6 layers (5 sliding, the 6th full with double-width heads, K = V, one KV head), as the
# release's 48 (3840 wide). The connectors: video 4 x 8, audio 2 x 8, 2 gated blocks each, 128 registers.
GEMMA4_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
               "attention_k_eq_v": True, "sliding_window": 1024, "max_position_embeddings": 262_144}
CONNECTORS_TINY = {"caption_channels": 64, "text_proj_in_factor": 7, "video_connector_num_attention_heads": 4,
                   "video_connector_attention_head_dim": 8, "video_connector_num_layers": 2,
                   "video_gated_attn": True, "audio_connector_num_attention_heads": 2,
                   "audio_connector_attention_head_dim": 8, "audio_connector_num_layers": 2,
                   "audio_gated_attn": True, "rope_type": "split", "per_modality_projections": True,
                   "video_hidden_dim": 32, "audio_hidden_dim": 16, "proj_bias": True}
PROMPTS = {
    "english": "  A fox runs through the snow at dusk, the camera tracking beside it; it barks twice.  ",
    "unicode": "东京的夜景 🌃 café naïve Zürich",
    "empty": "",
}
CORPUS = ["a fox runs through the snow at dusk", "the camera tracking beside it; it barks twice",
          "東京 café naïve Zürich night lights", "a woman in a red coat walks home"]


def tiny_tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json with Gemma's special ids (pad 0, eos 1, bos 2) and `<bos> $A` post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok.to_str()


def randomize(module, seed):
    """Every parameter random: norm gains around 1, matrices scaled by 1/sqrt(fan-in), the rest standard normal."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "norm_" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif p.dim() == 2 and "embed_tokens" not in name and "registers" not in name:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p))
        for name, b in module.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))  # not 1, so a misread scalar shows
    return module


@pytest.fixture(scope="module")
def oracle():
    """transformers' Gemma-4 (no vision or audio embedder), diffusers' connectors and the HF tokenizer."""
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from tokenizers import Tokenizer
    from transformers import (
        Gemma4UnifiedConfig,
        Gemma4UnifiedForConditionalGeneration,
        PreTrainedTokenizerFast,
    )
    tokenizer_json = tiny_tokenizer_json()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json), bos_token="<bos>",
                                        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    config = Gemma4UnifiedConfig(text_config={**GEMMA4_TINY, "vocab_size": tokenizer.vocab_size},
                                 vision_config=None, audio_config=None)
    gemma = randomize(Gemma4UnifiedForConditionalGeneration(config).eval(), 1)
    connectors = randomize(LTX2TextConnectors(**CONNECTORS_TINY).eval(), 2)
    return SimpleNamespace(gemma=gemma, connectors=connectors, tokenizer=tokenizer, tokenizer_json=tokenizer_json)


def text_encoder_layout(oracle) -> dict[str, torch.Tensor]:
    """The template's text encoder file: Gemma-4 flat under model., the projections, tokenizer.json as uint8."""
    out = {k.replace("model.language_model.", "model."): v.detach().clone().contiguous()
           for k, v in oracle.gemma.state_dict().items() if k.startswith("model.language_model.")}
    for m in ("video", "audio"):
        for p in ("weight", "bias"):
            out[f"text_embedding_projection.{m}_aggregate_embed.{p}"] = \
                getattr(oracle.connectors, f"{m}_text_proj_in").get_parameter(p).detach().clone()
    out["tokenizer_json"] = torch.tensor(list(oracle.tokenizer_json.encode()), dtype=torch.uint8)
    return out


def dit_layout(oracle) -> dict[str, torch.Tensor]:
    """The connectors as the LTX-2.5 DiT file holds them (original names under model.diffusion_model.)."""
    out = {}
    for k, v in oracle.connectors.state_dict().items():
        if k.startswith(("video_connector.", "audio_connector.")):
            k = (k.replace("_connector.", "_embeddings_connector.", 1)
                 .replace("transformer_blocks", "transformer_1d_blocks")
                 .replace("norm_q", "q_norm").replace("norm_k", "k_norm"))
            out[f"model.diffusion_model.{k}"] = v.detach().clone().contiguous()
    out["model.diffusion_model.proj_in.weight"] = torch.zeros(8, 8)  # some of the DiT itself
    return out


@pytest.fixture(scope="module")
def files(oracle, tmp_path_factory):
    root = tmp_path_factory.mktemp("ltx25_text")
    te = text_encoder_layout(oracle)
    paths = {"te": root / "gemma4-12b-with-proj-ltx-2.5-bf16.safetensors",
             "int8": root / "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
             "dit": root / "ltx-2.5-22b-distilled-transformer.safetensors"}
    save_file(te, str(paths["te"]))
    save_file(int8_convrot_state(te, lambda k: k.startswith(("model.layers.", "text_embedding_projection."))),
              str(paths["int8"]))
    save_file(dit_layout(oracle), str(paths["dit"]))
    return paths


@pytest.fixture(scope="module")
def encoder(files):
    return Gemma4TextEncoder.load(files["te"])


@pytest.fixture(scope="module")
def connectors(files):
    return LTX25TextConnectors.load(files["dit"], rope_f64=False)  # diffusers' RoPE angles (section 9, item 3)


def diffusers_path(oracle, prompt):
    """diffusers' _get_gemma_prompt_embeds (left-padded to 1024, all hidden states) then LTX2TextConnectors."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    pipe = SimpleNamespace(tokenizer=oracle.tokenizer, text_encoder=oracle.gemma, _execution_device="cpu")
    with torch.no_grad():
        embeds, mask = LTX2Pipeline._get_gemma_prompt_embeds(pipe, prompt, max_sequence_length=MAX_LENGTH,
                                                             device=torch.device("cpu"), dtype=torch.float32)
        video, audio, out_mask = oracle.connectors(embeds, mask, padding_side="left")
    return SimpleNamespace(embeds=embeds, mask=mask, video=video, audio=audio, out_mask=out_mask)


# --- features and rows ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PROMPTS))
def test_rows_match_diffusers(name, encoder, connectors, oracle):
    want = diffusers_path(oracle, PROMPTS[name])
    video, audio, mask = encode_prompt(encoder, connectors, PROMPTS[name])
    assert video.shape == (1, MAX_LENGTH, 32) and audio.shape == (1, MAX_LENGTH, 16)
    assert video.dtype == audio.dtype == torch.float32
    assert torch.equal(mask, want.out_mask) and bool((mask == 1).all())
    assert rel_err(video, want.video) <= 1e-4 and rel_err(audio, want.audio) <= 1e-4


def test_tokens_match_diffusers(encoder, oracle):
    """<bos> then the stripped prompt, as diffusers' left-padded ids with the pads taken off."""
    for prompt in PROMPTS.values():
        want = oracle.tokenizer([prompt.strip()], padding="max_length", max_length=MAX_LENGTH, truncation=True,
                                add_special_tokens=True)
        ids, mask = want["input_ids"][0], want["attention_mask"][0]
        assert encoder.tokenize(prompt) == [i for i, m in zip(ids, mask) if m]


def test_features_are_all_hidden_states_projected(encoder, oracle):
    """The per-modality features of the valid tokens: per-token RMS of each of the 7 hidden states (the last after
    the final norm), hidden-major, times sqrt(width / hidden), through each projection (diffusers' pieces)."""
    from diffusers.pipelines.ltx2.connectors import per_token_rms_norm
    want = diffusers_path(oracle, PROMPTS["english"])
    n = int(want.mask.sum())
    normed = per_token_rms_norm(want.embeds.unflatten(2, (64, -1)))[:, -n:].flatten(2, 3)
    video, audio = encoder.encode(PROMPTS["english"])
    with torch.no_grad():
        assert rel_err(video, oracle.connectors.video_text_proj_in(normed * (32 / 64) ** 0.5)) <= 1e-5
        assert rel_err(audio, oracle.connectors.audio_text_proj_in(normed * (16 / 64) ** 0.5)) <= 1e-5
    states = encoder.hidden_states(encoder.tokenize(PROMPTS["english"]))
    assert states.shape == (1, n, 64, 7)
    assert rel_err(states, want.embeds.unflatten(2, (64, -1))[:, -n:]) <= 1e-5


def test_model_is_read_whole(encoder):
    """Sizes from the tensors (6 layers, the last full: 32-wide heads, K = V, one KV head); no tensor left on meta."""
    config = encoder.model.config
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    sliding, full = config.per_layer_config[0], config.per_layer_config[5]
    assert (config.num_attention_heads, sliding.num_key_value_heads, sliding.head_dim) == (4, 2, 16)
    assert (full.num_key_value_heads, full.head_dim) == (1, 32)
    assert config.attention_k_eq_v and encoder.model.layers[5].self_attn.v_proj is None
    assert not any(t.is_meta for t in [*encoder.model.parameters(), *encoder.model.buffers()])


def test_production_rope_close_to_diffusers(files, encoder, connectors):
    """f64 angles (the default) against diffusers' f32 product: close, not equal (7.5e-7 measured at these tiny
    widths; the release's 4096-wide ladder reaches angles of 1.6e4 rad, where the f32 product is ~1e-3 off)."""
    features = encoder.encode(PROMPTS["english"])
    f64 = LTX25TextConnectors.load(files["dit"])(*features)[0]
    err = rel_err(f64, connectors(*features)[0])
    assert 0 < err <= 1e-2, err


def test_int8_convrot_file_is_read(files, encoder):
    """The template's INT8 ConvRot form (Gemma's linears and both projections): dequantized, its features close to
    the float file's (0.004-0.006 measured over the prompts, 2x headroom; a misread code, scale or rotation is
    near 1). The rows would hide it: most of them are registers."""
    quant = Gemma4TextEncoder.load(files["int8"])
    for got, want in zip(quant.encode(PROMPTS["unicode"]), encoder.encode(PROMPTS["unicode"])):
        assert 1e-4 < rel_err(got, want) <= 1.2e-2


def test_cancel_between_layers(encoder):
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        encoder.encode(PROMPTS["english"], check)
    assert len(calls) == 3


def test_prompt_over_max_length_is_refused(encoder):
    with pytest.raises(ValueError, match=rf"prompt is \d+ tokens .* more than the text encoder's {MAX_LENGTH}"):
        encoder.encode("fox " * 1100)


# --- errors -----------------------------------------------------------------------------------------------------

def refused(path, *patterns):
    with pytest.raises(WeightsError) as e:
        Gemma4TextEncoder.load(path)
    message = str(e.value)
    assert message.startswith(path.name + ":"), message
    for pattern in patterns:
        assert pattern in message, message


def test_qwen3_file_is_refused(tmp_path):
    path = tmp_path / "qwen_3_4b.safetensors"
    save_file(qwen3_comfy_layout(random_qwen3()), str(path))
    refused(path, "a Qwen3-style text encoder", TEMPLATE_FILE, "CLIPLoader (type ltxv)")


def test_dit_file_is_refused(files):
    refused(files["dit"], "not a text encoder", TEMPLATE_FILE)


def test_enhancer_file_is_refused(tmp_path, oracle):
    state = text_encoder_layout(oracle)
    state["model.embed_tokens_per_layer.weight"] = torch.zeros(8, 4)
    path = tmp_path / "gemma4_e2b_it_int8_convrot.safetensors"
    save_file(state, str(path))
    refused(path, "Gemma-4 E2B/E4B", ENHANCER_FILE, TEMPLATE_FILE)


def test_gemma3_file_is_refused(tmp_path, oracle):
    """LTX-2.0's Gemma 3: every layer's heads equally wide (the tiny model's full layer cut to the sliding width)."""
    state = text_encoder_layout(oracle)
    state = {k: v for k, v in state.items() if not k.startswith("model.layers.5.")}
    path = tmp_path / "gemma_3_12B_it.safetensors"
    save_file(state, str(path))
    refused(path, "a Gemma 3 text encoder", TEMPLATE_FILE)


def test_gemma4_without_projections_is_refused(tmp_path, oracle):
    state = {k: v for k, v in text_encoder_layout(oracle).items() if not k.startswith("text_embedding_projection.")}
    path = tmp_path / "gemma4_12b.safetensors"
    save_file(state, str(path))
    refused(path, "without LTX-2.5's feature projections", TEMPLATE_FILE)


def test_missing_tokenizer_names_the_fix(tmp_path, oracle):
    state = {k: v for k, v in text_encoder_layout(oracle).items() if k != "tokenizer_json"}
    path = tmp_path / "gemma4-12b-with-proj.safetensors"
    save_file(state, str(path))
    refused(path, "no 'tokenizer_json'", "tokenizer.json")
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(oracle.tokenizer_json)
    assert Gemma4TextEncoder.load(path, folder).tokenize("a fox")[0] == 2


def test_connectors_missing_in_file(files):
    with pytest.raises(WeightsError, match=r"gemma4-12b-with-proj-ltx-2\.5-bf16\.safetensors: no "
                                           r"'model\.diffusion_model\.video_embeddings_connector"):
        LTX25TextConnectors.load(files["te"])



def test_projection_width_must_fit_the_depth(tmp_path, oracle):
    """A file whose projections take another number of hidden states (here one layer short) is refused before its
    weights are read."""
    state = {k: v for k, v in text_encoder_layout(oracle).items() if not k.startswith("model.layers.4.")}
    state = {k.replace("model.layers.5.", "model.layers.4."): v for k, v in state.items()}
    path = tmp_path / "gemma4-12b-cut.safetensors"
    save_file(state, str(path))
    refused(path, "takes 448 features, not 384 (hidden 64 x 6 states)")
