"""Z-Image's text encoder: ComfyUI-identical prompt tokens and Qwen3 `hidden_states[-2]` from a checkpoint."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3Model
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from .weights import Checkpoint, WeightsError, read_linear, read_tensor

# ComfyUI v0.3.75 comfy/text_encoders/z_image.py (ZImageTokenizer.llama_template); diffusers'
# apply_chat_template with enable_thinking=True gives the same text (reference/families/z_image.md section 9).
CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PAD_ID = 151643  # <|endoftext|>: Qwen3Tokenizer's pad token, used only to fill ComfyUI's min_length of 1
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
# comfy/sd1_clip.py SDTokenizer.tokenize_with_weights splits on " embedding:" / "\nembedding:" and drops the
# separator's space or newline. Qwen3Tokenizer never passes its embedding directory on, so the pieces are
# never looked up as embeddings, only tokenized one by one (which changes the ids at the seams).
EMBEDDING_ID = "embedding:"
EMBEDDING_SPLIT = re.compile(f" {EMBEDDING_ID}|\n{EMBEDDING_ID}")
# Key roots (prefix + "model.") ComfyUI loads a Qwen3-4B from: none (CLIPLoader, comfy/sd.py detect_te_model)
# and a full checkpoint's "text_encoders." + "qwen3_4b.transformer." (comfy/supported_models.py ZImage.clip_target).
ROOTS = ("model.", "text_encoders.qwen3_4b.transformer.model.")
DETECT_KEY = "layers.0.self_attn.q_norm.weight"  # Qwen3's per-head q norm (comfy/sd.py detect_te_model)
# Qwen3-4B's config.json: RMSNorm eps and RoPE base; neither can be read from the tensors.
RMS_EPS = 1e-6
ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 40960
ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _escape_important(text: str) -> str:
    # comfy/sd1_clip.py escape_important then unescape_important with weights disabled: `\(` and `\)` become
    # plain parentheses, and so do literal "\0\2" / "\0\1" pairs (the escape codes), exactly as ComfyUI does.
    text = text.replace("\\)", "\0\1").replace("\\(", "\0\2")
    return text.replace("\0\1", ")").replace("\0\2", "(")


def load_tokenizer(tokenizer_dir: str | os.PathLike) -> Qwen2Tokenizer:
    """The Qwen2 BPE of a tokenizer folder (ComfyUI's qwen25_tokenizer); WeightsError naming what is missing."""
    folder = Path(tokenizer_dir)
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise WeightsError(f"tokenizer folder {folder}: missing {', '.join(missing)}; expected ComfyUI's "
                           f"comfy/text_encoders/qwen25_tokenizer ({', '.join(TOKENIZER_FILES)})")
    # The class ComfyUI's Qwen3Tokenizer uses, so special tokens and pre-tokenization are the same.
    return Qwen2Tokenizer.from_pretrained(str(folder))


class PromptTokenizer:
    """Qwen2 BPE over the Z-Image chat template, giving the ids of ComfyUI's ZImageTokenizer."""

    def __init__(self, tokenizer_dir: str | os.PathLike):
        self.tokenizer = load_tokenizer(tokenizer_dir)

    def __call__(self, prompt: str) -> list[int]:
        # ZImageTokenizer passes disable_weights=True: "(word:1.2)" stays plain text.
        text = _escape_important(CHAT_TEMPLATE.format(prompt))
        head, *rest = EMBEDDING_SPLIT.split(text)
        pieces = [p for p in (head, *(EMBEDDING_ID + r for r in rest)) if p]
        # No BOS/EOS (has_start_token/has_end_token False); max_length 99999999, so no batching or padding.
        ids = [i for piece in pieces for i in self.tokenizer(piece)["input_ids"]]
        return ids or [PAD_ID]


def prompt_too_long(tokens: int, limit: int) -> ValueError:
    """The error of a prompt longer than a text encoder takes (the node names itself and the input)."""
    return ValueError(f"the prompt is {tokens} tokens with its chat template, more than the text encoder's "
                      f"{limit}; shorten it")


def find_root(ckpt: Checkpoint, roots: tuple[str, ...], wanted: str) -> str:
    """The first of roots under which ckpt holds a Qwen3-style text model (`<root>layers.0.self_attn.q_norm`);
    WeightsError naming what the file is otherwise, and `wanted` (what was expected, e.g. which file)."""
    keys = ckpt.keys()
    # Order as comfy/sd.py detect_te_model: Gemma 3 also has q_norm (and Gemma 3 4B is 2560 wide too), so
    # its post_feedforward_layernorm has to rule it out first.
    if any(k.endswith("post_feedforward_layernorm.weight") for k in keys):
        kind = "a Gemma text encoder"
    else:
        for root in roots:
            if root + DETECT_KEY in ckpt:
                return root
        if any(k.endswith("self_attn.k_proj.bias") for k in keys):
            kind = "a Qwen2.5 text encoder"
        elif any(k.endswith(DETECT_KEY) for k in keys):
            kind = "a Qwen3-style text encoder under an unknown key prefix"
        elif any(".self_attn.q_proj." in k for k in keys):
            kind = "a Llama/Mistral-style text encoder without Qwen3's q_norm"
        else:
            kind = "not a text encoder (a diffusion model or a VAE?)"
    raise WeightsError(f"{ckpt.path.name}: is {kind}; expected {wanted}")


def read_shapes(ckpt: Checkpoint, root: str, expected_hidden: int | None, needs: str) -> dict[str, int]:
    """Sizes of the Qwen3-style text model under root, from its tensors' shapes (n_layers: layers in the file);
    expected_hidden rejects other model sizes, with `needs` saying which model was expected."""
    name = ckpt.path.name
    vocab, hidden = ckpt.shape(f"{root}embed_tokens.weight")
    if expected_hidden is not None and hidden != expected_hidden:
        raise WeightsError(f"{name}: text encoder of hidden size {hidden}, expected {expected_hidden} "
                           f"({needs}); is it the text encoder of another model?")
    layer_key = re.compile(re.escape(root) + r"layers\.(\d+)\.")
    layer_ids = {int(m.group(1)) for k in ckpt.keys() if (m := layer_key.match(k))}
    n_layers = max(layer_ids) + 1
    if layer_ids != set(range(n_layers)):
        missing = sorted(set(range(n_layers)) - layer_ids)
        raise WeightsError(f"{name}: layers {missing} are missing; truncated or partial file?")
    head_dim = ckpt.shape(f"{root}{DETECT_KEY}")[0]
    q_out, k_out = (ckpt.shape(f"{root}layers.0.self_attn.{n}_proj.weight")[0] for n in "qk")
    if q_out % head_dim or k_out % head_dim or (q_out // head_dim) % (k_out // head_dim):
        raise WeightsError(f"{name}: q_proj ({q_out} rows) and k_proj ({k_out}) do not split into heads of "
                           f"{head_dim} (from q_norm) with a whole number of query heads per kv head")
    return {"vocab_size": vocab, "hidden_size": hidden, "n_layers": n_layers,
            "intermediate_size": ckpt.shape(f"{root}layers.0.mlp.gate_proj.weight")[0],
            "num_attention_heads": q_out // head_dim, "num_key_value_heads": k_out // head_dim, "head_dim": head_dim}


def _config(ckpt: Checkpoint, root: str, expected_hidden: int | None) -> Qwen3Config:
    """A Qwen3Config from the checkpoint's own shapes, with all but the last layer (hidden_states[-2])."""
    sizes = read_shapes(ckpt, root, expected_hidden, "Z-Image needs Qwen3-4B, hidden 2560")
    n_layers = sizes.pop("n_layers")
    return Qwen3Config(
        **sizes, num_hidden_layers=n_layers - 1,
        rms_norm_eps=RMS_EPS, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        max_position_embeddings=MAX_POSITIONS, attention_bias=False, use_cache=False)


def read_state_dict(ckpt: Checkpoint, root: str, n_layers: int, hidden: int, head_dim: int,
                    dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The text model's state dict in transformers' names (embed_tokens, layers.N.*; no prefix, no final norm)
    for its first n_layers layers; any linear format weights.read_linear reads, dequantized to dtype."""
    markers = ckpt.quantization_markers()

    def floats(t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == dtype else t.to(dtype)

    sd = {"embed_tokens.weight": floats(read_tensor(ckpt, f"{root}embed_tokens.weight"))}
    for i in range(n_layers):
        src, dst = f"{root}layers.{i}.", f"layers.{i}."
        for group, names in (("self_attn", ATTN_LINEARS), ("mlp", MLP_LINEARS)):
            for n in names:
                lin = read_linear(ckpt, f"{src}{group}.{n}", markers)
                if lin.bias is not None:
                    raise WeightsError(f"{ckpt.path.name}: '{src}{group}.{n}' has a bias; Qwen3 has none, so "
                                       f"this is another model family")
                # INT8 ConvRot / FP8 are dequantized into the float host model here (f32, native basis);
                # an INT8 GPU path that keeps the codes comes later.
                weight = lin.weight if not lin.quantized and lin.weight.dtype == dtype else lin.dequantized()
                sd[f"{dst}{group}.{n}.weight"] = floats(weight)
        for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            size = head_dim if n.startswith("self_attn") else hidden
            sd[f"{dst}{n}.weight"] = floats(read_tensor(ckpt, f"{src}{n}.weight", (size,)))
    return sd


class Qwen3TextEncoder:
    """Prompt -> Qwen3 residual stream after layer N-1 (no final norm): ComfyUI's Z-Image CONDITIONING."""

    def __init__(self, model: Qwen3Model, tokenizer: PromptTokenizer):
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
             dtype: torch.dtype = torch.float32, expected_hidden: int | None = None,
             device: str | torch.device = "cpu") -> Qwen3TextEncoder:
        """A text encoder from a Qwen3 file (layout as ComfyUI's, any linear format weights.read_linear reads)
        and a Qwen2 tokenizer folder; expected_hidden (2560 for Z-Image) rejects other model sizes."""
        tokenizer = PromptTokenizer(tokenizer_dir)  # first: a bad folder fails before gigabytes are read
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        root = find_root(ckpt, ROOTS, f"a Qwen3 text encoder (with 'model.{DETECT_KEY}'), e.g. "
                                      f"qwen_3_4b.safetensors for Z-Image (ComfyUI CLIPLoader type lumina2)")
        config = _config(ckpt, root, expected_hidden)
        sd = read_state_dict(ckpt, root, config.num_hidden_layers, config.hidden_size, config.head_dim, dtype)
        # Build on meta and assign the loaded tensors (gpt-fast habit): no random init of billions of weights.
        with torch.device("meta"):
            model = Qwen3Model(config)
        # The last layer is not built (hidden_states[-2] never needs it) and neither is the final norm:
        # Identity keeps last_hidden_state the raw residual stream.
        model.norm = torch.nn.Identity()
        try:
            model.load_state_dict(sd, strict=True, assign=True)
        except RuntimeError as e:
            raise WeightsError(f"{ckpt.path.name}: tensors do not fit the Qwen3 that its embedding and "
                               f"layer 0 describe ({e})") from e
        # inv_freq is a non-persistent buffer, so it is still on meta: compute it for real.
        model.rotary_emb = Qwen3RotaryEmbedding(config=config)
        # Parameters already have `dtype`; a module-wide cast would also round inv_freq (RoPE angles) to it.
        model.to(device).eval()
        return cls(model, tokenizer)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def tokenize(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)

    # no_grad rather than inference_mode: inference tensors refuse in-place updates later in a workflow.
    @torch.no_grad()
    def encode_ids(self, ids: list[int] | torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Features [1, L, hidden] f32 of token ids (one unpadded causal sequence, as ComfyUI runs it); check()
        before each layer (it raises to cancel)."""
        device = self.model.embed_tokens.weight.device
        ids = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(1, -1)
        vocab = self.model.config.vocab_size
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"Qwen3TextEncoder: token ids must be a non-empty list in [0, {vocab}), "
                             f"got {ids.numel()} ids {ids.tolist()[0][:8]}...")
        limit = self.model.config.max_position_embeddings
        if ids.numel() > limit:  # past the positions it was trained on (the seeds' ZImagePipeline.condition)
            raise prompt_too_long(ids.numel(), limit)
        with checked_layers(self.model.layers, check):
            return self.model(input_ids=ids).last_hidden_state.float()

    def encode(self, prompt: str, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Features [1, L, hidden] f32 of a prompt in the Z-Image chat template; check() before each layer."""
        return self.encode_ids(self.tokenize(prompt), check)


@contextmanager
def checked_layers(layers, check: Callable[[], None] | None):
    """check() before each of the transformers layers runs, within the block (a cancel inside an encode)."""
    handles = [] if check is None else [layer.register_forward_pre_hook(lambda *_: check()) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
