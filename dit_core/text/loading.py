"""What every transformers-architecture text encoder shares: the tokenizer folder, the model's root and sizes from
the file's tensors, its state dict in transformers' names from any stored linear format, the prompt-length error and
a cancel between layers. A file per encoder (qwen3.py, qwen3_vl.py) builds on these."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import Qwen2Tokenizer

from ..weights import Checkpoint, WeightsError, read_linear, read_tensor

# The Qwen chat template (ComfyUI v0.3.75 comfy/text_encoders/z_image.py ZImageTokenizer.llama_template; diffusers'
# apply_chat_template with enable_thinking=True gives the same text, reference/families/z_image.md section 9).
CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
DETECT_KEY = "layers.0.self_attn.q_norm.weight"  # Qwen3's per-head q norm (comfy/sd.py detect_te_model)
RMS_EPS = 1e-6  # Qwen3's and Qwen3-VL's config.json (not in the tensors)
ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def load_tokenizer(tokenizer_dir: str | os.PathLike) -> Qwen2Tokenizer:
    """The Qwen2 BPE of a tokenizer folder (ComfyUI's qwen25_tokenizer); WeightsError naming what is missing."""
    folder = Path(tokenizer_dir)
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise WeightsError(f"tokenizer folder {folder}: missing {', '.join(missing)}; expected ComfyUI's "
                           f"comfy/text_encoders/qwen25_tokenizer ({', '.join(TOKENIZER_FILES)})")
    # The class ComfyUI's Qwen3Tokenizer uses, so special tokens and pre-tokenization are the same.
    return Qwen2Tokenizer.from_pretrained(str(folder))


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


@contextmanager
def checked_layers(layers, check: Callable[[], None] | None):
    """check() before each of the transformers layers runs, within the block (a cancel inside an encode)."""
    handles = [] if check is None else [layer.register_forward_pre_hook(lambda *_: check()) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
