"""LTX-2.5's text path: Gemma-4 12B (`gemma4_unified`) over the prompt, all its hidden states and the per-modality
feature projections (the text encoder file's `text_embedding_projection`), then the video and audio connectors
(ltx25_connectors.py: the DiT file's `*_embeddings_connector`), giving the LTX-2.5 transformer its text rows and mask.
f32 on the host (the reference), or on a GPU in the file's precision: BF16, INT8 ConvRot linears on the INT8 kernels
(loading.py's one loading path; issue 34).

reference/families/ltx25.md section 5 (text path); diffusers 0.42.1 `LTX2Pipeline._get_gemma_prompt_embeds` and
`pipelines/ltx2/connectors.py` (`LTX2TextConnectors` with per_modality_projections) are the oracle."""
from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, Linear, WeightsError, read_linear, read_tensor
from .loading import (
    TextEncoder,
    converted_on,
    encoding,
    linear_state,
    meta_model,
    prompt_too_long,
    transformers_class,
    weight_on,
)
from .ltx25_connectors import ROWS, LTX25TextConnectors

if TYPE_CHECKING:
    from transformers import Gemma4UnifiedTextConfig, Gemma4UnifiedTextModel

    from ..gpu.block import GpuLinear

log = logging.getLogger(__name__)

TEMPLATE_FILE = "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors"  # CLIPLoader type ltxv
ENHANCER_FILE = "gemma4_e2b_it_int8_convrot"  # the template's prompt enhancer: another Gemma-4, not this encoder
PROJECTIONS = "text_embedding_projection."  # + video_aggregate_embed / audio_aggregate_embed (LTX-2.3+ names)
TOKENIZER_TENSOR = "tokenizer_json"  # ComfyUI's Gemma-4 files carry their tokenizer.json as a uint8 tensor
MAX_LENGTH = ROWS  # diffusers' max_sequence_length: prompts are left-padded to it, the connectors give that many rows
RMS_EPS = 1e-6  # Gemma-4's rms_norm_eps and the feature RMS (not in the tensors)
# Gemma-4's config.json values that the tensors do not hold (transformers' Gemma4UnifiedTextConfig defaults, which
# the LTX-2.5 text encoder keeps: sliding 10k default RoPE; full layers 1M proportional RoPE on a quarter of the head).
SLIDING_WINDOW = 1024
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
MAX_POSITIONS = 262_144
ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm")


def wrong_file(ckpt: Checkpoint, kind: str) -> WeightsError:
    return WeightsError(f"{ckpt.path.name}: is {kind}; LTX-2.5 needs its Gemma-4 12B text encoder with the "
                        f"feature projections: put {TEMPLATE_FILE} (or its BF16 version) in the CLIPLoader "
                        f"(type ltxv)")


def find_gemma4_root(ckpt: Checkpoint) -> str:
    """The key prefix of the Gemma-4 12B text model: "model." (ComfyUI's flat layout) or "model.language_model."
    (transformers'); WeightsError naming what the file is otherwise and the file LTX-2.5 needs."""
    keys = ckpt.keys()
    for root in ("model.", "model.language_model."):
        if f"{root}layers.0.pre_feedforward_layernorm.weight" in ckpt and f"{root}embed_tokens.weight" in ckpt:
            if f"{root}embed_tokens_per_layer.weight" in ckpt:
                # E2B/E4B carry per-layer embeddings and share K/V across layers: the enhancer, not the encoder.
                raise wrong_file(ckpt, f"a Gemma-4 E2B/E4B (per-layer embeddings; e.g. the prompt enhancer "
                                       f"{ENHANCER_FILE})")
            if f"{root}layers.0.self_attn.q_norm.weight" not in ckpt:
                raise wrong_file(ckpt, "a Gemma 2 text encoder (no q_norm)")
            return root
    if any(k.endswith("self_attn.q_norm.weight") for k in keys):
        kind = "a Qwen3-style text encoder (another family's)"
    elif any(k.startswith(("model.diffusion_model.", "vae.", "decoder.", "encoder.")) for k in keys):
        kind = "not a text encoder (a diffusion model or a VAE?)"
    else:
        kind = "not a Gemma-4 text encoder"
    raise wrong_file(ckpt, kind)


@dataclass(frozen=True)
class Gemma4Sizes:
    """What Gemma-4's tensors say of the model: widths, heads and the kind of each layer (full or sliding)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    global_head_dim: int
    num_global_key_value_heads: int
    attention_k_eq_v: bool
    layer_types: tuple[str, ...]

    def config(self) -> Gemma4UnifiedTextConfig:
        return transformers_class("Gemma4UnifiedTextConfig")(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=len(self.layer_types), num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            global_head_dim=self.global_head_dim, num_global_key_value_heads=self.num_global_key_value_heads,
            attention_k_eq_v=self.attention_k_eq_v, layer_types=list(self.layer_types),
            sliding_window=SLIDING_WINDOW, rope_parameters=ROPE, rms_norm_eps=RMS_EPS,
            max_position_embeddings=MAX_POSITIONS, use_cache=False)


def read_gemma4_sizes(ckpt: Checkpoint, root: str) -> Gemma4Sizes:
    """Sizes from the tensors' shapes: a layer whose q_norm is wider than layer 0's is a full-attention layer."""
    name = ckpt.path.name
    vocab, hidden = ckpt.shape(f"{root}embed_tokens.weight")
    layer_key = re.compile(re.escape(root) + r"layers\.(\d+)\.")
    keys = ckpt.keys()
    layer_ids = {int(m.group(1)) for k in keys if (m := layer_key.match(k))}
    n_layers = max(layer_ids) + 1
    if layer_ids != set(range(n_layers)):
        raise WeightsError(f"{name}: layers {sorted(set(range(n_layers)) - layer_ids)} are missing; truncated or "
                           f"partial file?")
    attn = [f"{root}layers.{i}.self_attn." for i in range(n_layers)]
    shared = [i for i, a in enumerate(attn) if f"{a}k_proj.weight" not in ckpt]
    if shared:  # E2B-style K/V sharing: not the 12B encoder
        raise wrong_file(ckpt, f"a Gemma-4 whose layers {shared[:4]}... share K/V (E2B/E4B, e.g. {ENHANCER_FILE})")
    head_dims = [ckpt.shape(f"{a}q_norm.weight")[0] for a in attn]
    local, wide = min(head_dims), max(head_dims)
    if local == wide:  # Gemma 3's layers all have the same heads; Gemma-4's full layers have wider ones
        raise wrong_file(ckpt, "a Gemma 3 text encoder (every layer's heads equally wide; LTX-2.0's "
                               "gemma_3_12B_it)")
    types = tuple("full_attention" if d == wide else "sliding_attention" for d in head_dims)
    if types[-1] != "full_attention":
        raise WeightsError(f"{name}: the last layer's heads are {head_dims[-1]} wide, not a full-attention layer's; "
                           f"is it a Gemma-4 text encoder?")
    full = types.index("full_attention")
    q_rows, kv_rows = ckpt.shape(f"{attn[0]}q_proj.weight")[0], ckpt.shape(f"{attn[0]}k_proj.weight")[0]
    global_kv_rows = ckpt.shape(f"{attn[full]}k_proj.weight")[0]
    if q_rows % local or kv_rows % local or global_kv_rows % wide:
        raise WeightsError(f"{name}: q_proj/k_proj rows ({q_rows}, {kv_rows}, {global_kv_rows}) do not split into "
                           f"heads of {local} / {wide} (from q_norm)")
    return Gemma4Sizes(
        vocab_size=vocab, hidden_size=hidden,
        intermediate_size=ckpt.shape(f"{root}layers.0.mlp.gate_proj.weight")[0],
        num_attention_heads=q_rows // local, num_key_value_heads=kv_rows // local, head_dim=local,
        global_head_dim=wide, num_global_key_value_heads=global_kv_rows // wide,
        attention_k_eq_v=f"{attn[full]}v_proj.weight" not in ckpt, layer_types=types)


def read_gemma4_state(ckpt: Checkpoint, root: str, sizes: Gemma4Sizes, dtype: torch.dtype,
                      device: str | torch.device, int8: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Gemma4UnifiedTextModel's state dict (transformers' names, no prefix) of dtype on device, each tensor moved
    as stored and converted there, one at a time (no f32 copy on the host unless the host is where it goes);
    every linear through weights.read_linear and loading.linear_state: INT8 ConvRot dequantized there, or on the
    INT8 path (int8 a dict, filled here) kept as stored codes and scales for Int8Linear."""
    markers = ckpt.quantization_markers()
    sd = {"embed_tokens.weight": read_tensor(ckpt, f"{root}embed_tokens.weight", dtype=dtype, device=device),
          "norm.weight": read_tensor(ckpt, f"{root}norm.weight", (sizes.hidden_size,), dtype, device)}
    for i, kind in enumerate(sizes.layer_types):
        src, dst = f"{root}layers.{i}.", f"layers.{i}."
        head = sizes.global_head_dim if kind == "full_attention" else sizes.head_dim
        for group, names in (("self_attn", ATTN_LINEARS), ("mlp", MLP_LINEARS)):
            for n in names:
                if n == "v_proj" and kind == "full_attention" and sizes.attention_k_eq_v:
                    continue  # full layers take V from K's projection
                lin = read_linear(ckpt, f"{src}{group}.{n}", markers, converted_on(device), device,
                                  fp8_as=dtype if int8 is None else None)
                if lin.bias is not None:
                    raise WeightsError(f"{ckpt.path.name}: '{src}{group}.{n}' has a bias; Gemma-4 has none")
                sd.update(linear_state(lin, f"{dst}{group}.{n}", dtype, device, int8,
                                       (ckpt, f"{src}{group}.{n}.weight")))
        for n in LAYER_NORMS:
            sd[f"{dst}{n}.weight"] = read_tensor(ckpt, f"{src}{n}.weight", (sizes.hidden_size,), dtype, device)
        for n in ("q_norm", "k_norm"):
            sd[f"{dst}self_attn.{n}.weight"] = read_tensor(ckpt, f"{src}self_attn.{n}.weight", (head,), dtype, device)
        if f"{src}layer_scalar" in ckpt:
            sd[f"{dst}layer_scalar"] = read_tensor(ckpt, f"{src}layer_scalar", (1,), dtype, device)
        else:
            # transformers' own initial value; a file converted without the buffer loses nothing if it was 1.
            log.warning("%s: no '%slayer_scalar'; taken as 1", ckpt.path.name, src)
            sd[f"{dst}layer_scalar"] = torch.ones(1, dtype=dtype, device=device)
    return sd


class GemmaPromptTokenizer:
    """Gemma-4's tokenizer.json: `<bos>` then the stripped prompt (diffusers' _get_gemma_prompt_embeds: no chat
    template, add_special_tokens=True, which for Gemma adds the BOS only); prompts over max_length - 1 tokens are
    refused (diffusers would cut them without a word)."""

    def __init__(self, tokenizer_json: str, max_length: int = MAX_LENGTH):
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.bos = self.tokenizer.token_to_id("<bos>")
        if self.bos is None:
            raise WeightsError("the Gemma-4 tokenizer has no '<bos>' token; is it Gemma's tokenizer.json?")
        self.max_length = max_length

    @classmethod
    def find(cls, ckpt: Checkpoint, tokenizer: str | os.PathLike | None) -> GemmaPromptTokenizer:
        """From `tokenizer` (a tokenizer.json or a folder holding one) or, when None, the text encoder file's own
        `tokenizer_json` tensor (ComfyUI's Gemma-4 files)."""
        if tokenizer is not None:
            path = Path(tokenizer)
            path = path / "tokenizer.json" if path.is_dir() else path
            if not path.is_file():
                raise WeightsError(f"{path}: no Gemma-4 tokenizer.json there")
            return cls(path.read_text(encoding="utf-8"))
        if TOKENIZER_TENSOR not in ckpt:
            raise WeightsError(f"{ckpt.path.name}: holds no '{TOKENIZER_TENSOR}' tensor; pass Gemma-4's "
                               f"tokenizer.json (google/gemma-4-12B-it) as the tokenizer")
        return cls(bytes(ckpt.get(TOKENIZER_TENSOR).to(torch.uint8).tolist()).rstrip(b"\x00").decode("utf-8"))

    def __call__(self, prompt: str) -> list[int]:
        ids = [self.bos, *self.tokenizer.encode(prompt.strip(), add_special_tokens=False).ids]
        if len(ids) > self.max_length:
            raise prompt_too_long(len(ids), self.max_length)
        return ids


class Gemma4TextEncoder(TextEncoder):
    """Prompt -> LTX-2.5's text features: every hidden state of Gemma-4 12B (the embeddings, each layer's output,
    the last one after the final norm), RMS-normalized per token and layer, flattened hidden-major and projected
    per modality (video 4096, audio 2048 in the release). Run over the valid tokens alone at the positions they
    have left-padded to max_length (diffusers' pads only ever reach the connectors as rows they replace)."""

    ARCH = "Gemma-4 text model"
    MODEL = "Gemma4UnifiedTextModel"

    def __init__(self, model: Gemma4UnifiedTextModel, tokenizer: GemmaPromptTokenizer,
                 video_proj: Linear | GpuLinear, audio_proj: Linear | GpuLinear):
        super().__init__(model, tokenizer)
        self.video_proj = video_proj
        self.audio_proj = audio_proj

    @classmethod
    def load(cls, path: str | os.PathLike | Checkpoint, tokenizer: str | os.PathLike | None = None,
             dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
             int8_linears: bool | None = None) -> Gemma4TextEncoder:
        """From the template's Gemma-4 file (a path or an open Checkpoint; INT8 ConvRot, scaled FP8 or BF16;
        ComfyUI's flat `model.*` layout or transformers' `model.language_model.*`) with its
        `text_embedding_projection`; the tokenizer first (see GemmaPromptTokenizer.find), so a missing one fails
        before gigabytes are read. Each tensor goes to device as stored and becomes dtype there (f32 on the CPU:
        the reference; BF16 on a GPU). int8_linears, as TextEncoder.load_model's: each INT8 ConvRot linear the
        kernels take (the projections too) kept as stored and run on the INT8 kernels (Int8Linear; GpuLinear for
        the projections, whose bias it adds); None: on for a CUDA device, off elsewhere; True on the CPU runs the
        kernels' references (tests)."""
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        root = find_gemma4_root(ckpt)
        missing = [f"{PROJECTIONS}{m}_aggregate_embed.weight" for m in ("video", "audio")
                   if f"{PROJECTIONS}{m}_aggregate_embed.weight" not in ckpt]
        if missing:
            raise WeightsError(f"{ckpt.path.name}: a Gemma-4 text encoder without LTX-2.5's feature projections "
                               f"({', '.join(missing)} missing); use {TEMPLATE_FILE}, the one 'with-proj'")
        prompt_tokenizer = GemmaPromptTokenizer.find(ckpt, tokenizer)
        sizes = read_gemma4_sizes(ckpt, root)
        states = len(sizes.layer_types) + 1  # the embeddings and every layer's output
        for m in ("video", "audio"):  # checked before the weights are read: the projections fix the model's depth
            width = ckpt.shape(f"{PROJECTIONS}{m}_aggregate_embed.weight")[1]
            if width != sizes.hidden_size * states:
                raise WeightsError(f"{ckpt.path.name}: {m}_aggregate_embed takes {width} features, not "
                                   f"{sizes.hidden_size * states} (hidden {sizes.hidden_size} x {states} states); "
                                   f"the projections of another text encoder, or a truncated file?")
        if int8_linears is None:
            int8_linears = torch.device(device).type == "cuda"
        int8 = {} if int8_linears else None
        sd = read_gemma4_state(ckpt, root, sizes, dtype, device, int8)
        config = sizes.config()
        model = meta_model(transformers_class(cls.MODEL), config, int8)
        try:
            model.load_state_dict(sd, strict=True, assign=True)
        except RuntimeError as e:
            raise WeightsError(f"{ckpt.path.name}: tensors do not fit the {cls.ARCH} its shapes describe ({e})") from e
        # Non-persistent buffers are still on meta: the RoPE tables (f32, computed for real) and the embed scale.
        model.rotary_emb = type(model.rotary_emb)(config=config)
        model.embed_tokens.embed_scale = torch.tensor(model.embed_tokens.scalar_embed_scale)
        video, audio = (read_projection(ckpt, m, dtype, device, int8_linears) for m in ("video", "audio"))
        return cls(model.to(device).eval(), prompt_tokenizer, video, audio)

    @torch.no_grad()
    def hidden_states(self, ids: list[int], check: Callable[[], None] | None = None) -> torch.Tensor:
        """All hidden states [1, n, hidden, layers + 1] f32 of the valid ids, at positions max_length - n ..
        max_length - 1 (where diffusers' left padding puts them; RoPE sees the same angles)."""
        n = len(ids)
        if n > self.tokenizer.max_length:
            raise prompt_too_long(n, self.tokenizer.max_length)
        positions = torch.arange(self.tokenizer.max_length - n, self.tokenizer.max_length, device=self.device)
        with encoding(self.model, check):
            out = self.model(input_ids=torch.tensor([ids], device=self.device), position_ids=positions[None],
                             output_hidden_states=True, use_cache=False)
        return torch.stack(out.hidden_states, dim=-1).float()

    @torch.no_grad()
    def encode_ids(self, ids: list[int] | torch.Tensor,
                   check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(video [1, n, video width], audio [1, n, audio width]) f32 features of n unpadded ids."""
        states = self.hidden_states(self.checked_ids(ids), check)
        # normalized in place: at 1024 tokens of the release a copy of the states is 0.77 GB
        normed = states.mul_(torch.rsqrt(states.pow(2).mean(dim=2, keepdim=True) + RMS_EPS))
        flat = normed.flatten(2)  # hidden-major, layer-minor: feature d * (layers + 1) + l
        hidden = states.shape[2]
        return tuple(project(p, flat * math.sqrt(p.weight.shape[0] / hidden)) for p in (self.video_proj,
                                                                                          self.audio_proj))


def read_projection(ckpt: Checkpoint, modality: str, dtype: torch.dtype, device: str | torch.device,
                    int8_linears: bool) -> Linear | GpuLinear:
    """`text_embedding_projection.<modality>_aggregate_embed` on device: a Linear of dtype (its bias f32), or on
    the INT8 path an INT8 ConvRot one the kernels take as a GpuLinear of its stored codes (the release's are
    [4096 | 2048, 188160]: 0.77 | 0.39 GB as INT8, twice that in BF16)."""
    lin = read_linear(ckpt, f"{PROJECTIONS}{modality}_aggregate_embed", compute_on=converted_on(device))
    if int8_linears:
        from ..gpu import text_linear  # lazily: the host path never loads dit_core/gpu
        if text_linear.takes(lin):
            from ..gpu.block import GpuLinear
            return GpuLinear.of(lin, torch.device(device))
    return Linear(weight_on(lin, dtype, device), None if lin.bias is None else lin.bias.to(device, torch.float32))


def project(p: Linear | GpuLinear, x: torch.Tensor) -> torch.Tensor:
    """Features x [1, n, K] f32 through a projection (read_projection's), f32 out: an f32 Linear as the reference
    (one F.linear); a BF16 one on x rounded to BF16, its f32 bias added after; a GpuLinear (INT8) through the
    kernels' product (rows quantized a ConvRot group at a time, the bias in its epilogue)."""
    if isinstance(p, Linear):
        if p.weight.dtype == torch.float32:
            return F.linear(x, p.weight, p.bias)
        y = F.linear(x.to(p.weight.dtype), p.weight).float()
        return y if p.bias is None else y + p.bias
    from ..gpu.block import product  # lazily, as in read_projection
    return product(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), p).float().reshape(*x.shape[:-1], -1)


def encode_prompt(encoder: Gemma4TextEncoder, connectors: LTX25TextConnectors, prompt: str,
                  check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt -> the LTX-2.5 transformer's (video rows, audio rows, mask)."""
    return connectors(*encoder.encode(prompt, check))
