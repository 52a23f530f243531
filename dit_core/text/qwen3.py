"""Z-Image's text encoder: ComfyUI-identical prompt tokens and Qwen3 `hidden_states[-2]` from a checkpoint."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..weights import Checkpoint
from .loading import (
    CHAT_TEMPLATE,
    DETECT_KEY,
    RMS_EPS,
    TextEncoder,
    encoding,
    load_tokenizer,
    prompt_too_long,
    transformers_class,
)

if TYPE_CHECKING:
    from transformers import Qwen3Config

PAD_ID = 151643  # <|endoftext|>: Qwen3Tokenizer's pad token, used only to fill ComfyUI's min_length of 1
# comfy/sd1_clip.py SDTokenizer.tokenize_with_weights splits on " embedding:" / "\nembedding:" and drops the
# separator's space or newline. Qwen3Tokenizer never passes its embedding directory on, so the pieces are
# never looked up as embeddings, only tokenized one by one (which changes the ids at the seams).
EMBEDDING_ID = "embedding:"
EMBEDDING_SPLIT = re.compile(f" {EMBEDDING_ID}|\n{EMBEDDING_ID}")
# Qwen3-4B's config.json: the RoPE base and positions (not in the tensors).
ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 40960


def _escape_important(text: str) -> str:
    # comfy/sd1_clip.py escape_important then unescape_important with weights disabled: `\(` and `\)` become
    # plain parentheses, and so do literal "\0\2" / "\0\1" pairs (the escape codes), exactly as ComfyUI does.
    text = text.replace("\\)", "\0\1").replace("\\(", "\0\2")
    return text.replace("\0\1", ")").replace("\0\2", "(")


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


class Qwen3TextEncoder(TextEncoder):
    """Prompt -> Qwen3 residual stream after layer N-1 (no final norm): ComfyUI's Z-Image CONDITIONING."""

    ARCH = "Qwen3"
    MODEL = "Qwen3Model"
    # Key roots (prefix + "model.") ComfyUI loads a Qwen3-4B from: none (CLIPLoader, comfy/sd.py
    # detect_te_model) and a full checkpoint's "text_encoders." + "qwen3_4b.transformer."
    # (comfy/supported_models.py ZImage.clip_target).
    ROOTS = ("model.", "text_encoders.qwen3_4b.transformer.model.")
    WANTED = (f"a Qwen3 text encoder (with 'model.{DETECT_KEY}'), e.g. qwen_3_4b.safetensors for Z-Image "
              "(ComfyUI CLIPLoader type lumina2)")
    NEEDS = "Z-Image needs Qwen3-4B, hidden 2560"

    @classmethod
    def config(cls, ckpt: Checkpoint, sizes: dict[str, int]) -> Qwen3Config:
        """All but the last layer: hidden_states[-2] never needs it."""
        n_layers = sizes.pop("n_layers")
        return transformers_class("Qwen3Config")(
            **sizes, num_hidden_layers=n_layers - 1,
            rms_norm_eps=RMS_EPS, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
            max_position_embeddings=MAX_POSITIONS, attention_bias=False, use_cache=False)

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
             dtype: torch.dtype = torch.float32, expected_hidden: int | None = None,
             device: str | torch.device = "cpu", int8_linears: bool | None = None,
             convert_on: torch.device | None = None) -> Qwen3TextEncoder:
        """A text encoder from a Qwen3 file (layout as ComfyUI's, any linear format weights.read_linear reads)
        and a Qwen2 tokenizer folder; expected_hidden (2560 for Z-Image) rejects other model sizes;
        int8_linears, convert_on: TextEncoder.load_model's (None: the INT8 path on a CUDA device)."""
        tokenizer = PromptTokenizer(tokenizer_dir)  # first: a bad folder fails before gigabytes are read
        return cls(cls.load_model(path, dtype, device, expected_hidden, int8_linears, convert_on), tokenizer)

    # no_grad rather than inference_mode: inference tensors refuse in-place updates later in a workflow.
    @torch.no_grad()
    def encode_ids(self, ids: list[int] | torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Features [1, L, hidden] f32 of token ids (one unpadded causal sequence, as ComfyUI runs it); check()
        before each layer (it raises to cancel)."""
        ids = self.checked_ids(ids)
        limit = self.model.config.max_position_embeddings
        if len(ids) > limit:  # past the positions it was trained on (the seeds' ZImagePipeline.condition)
            raise prompt_too_long(len(ids), limit)
        ids, last = torch.tensor([ids], device=self.device), len(self.model.layers)
        got = self.fused_states(ids, (last,), check=check)
        if got is not None:
            return got[last]
        with encoding(self.model, check):
            return self.model(input_ids=ids).last_hidden_state.float()
