"""Qwen3-VL's language model (text path only) as FLUX.3 Klein's and Krea 2's text encoder.

Klein: hidden states of layers 4, 8, ..., 32 side by side per token, over the chat template right-padded to a
multiple of 80 (reference/families/flux3_klein.md section 9, the text encoder; diffusers'
Flux3TextEncoderStep). Krea 2: hidden states 2, 5, ..., 35 stacked per token, over [system prefix | prompt |
assistant suffix] less the prefix's 34 rows (reference/families/krea2.md section 6, the text encoder;
diffusers' Krea2Pipeline.get_text_hidden_states). MiniMax H3: hidden_states[50] of Qwen3-VL-32B over the prompt
tokenized verbatim (reference/families/minimax_h3.md section 8; diffusers' MiniMaxH3TextEncoderStep): the same model
class at another size, so a subclass here rather than a file of its own; with keyframe or reference pictures, each
prepended as a "<Picture i>: " label and a block of Qwen3-VL vision rows (the file's vision tower, read by
qwen3_vl_vision.py; ComfyUI's comfy/text_encoders/minimax.py MiniMaxH3Tokenizer; diffusers'
MiniMaxH3FL2VATextEncoderStep); a ref2va request's references in packed order with "<Audio j>: " labels and
"<Video k>: " timestamped video blocks (qwen3_vl_video.py; ComfyUI's MiniMaxH3Tokenizer minimax_ref_items)."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..families.flux3_klein import TEXT_PAD_MULTIPLE as PAD_MULTIPLE
from ..families.minimax_h3 import TEXT as H3_TEXT_TAG
from ..families.minimax_h3 import VIDEO as H3_VISION_TAG
from ..weights import Checkpoint, WeightsError
from ..weights.stored import STORED_FORMATS
from .loading import (
    CHAT_TEMPLATE,
    RMS_EPS,
    TextEncoder,
    encoding,
    load_tokenizer,
    prompt_too_long,
    transformers_class,
)
from .qwen3_vl_video import PromptReference, read_references
from .qwen3_vl_vision import (
    IMAGE_PAD_ID,
    VIDEO_PAD_ID,
    VISION_END_ID,
    VISION_START_ID,
    VisionRows,
    lay_out_pictures,
    load_vision_tower,
    read_pictures,
)

if TYPE_CHECKING:
    from transformers import Qwen3VLTextConfig, Qwen3VLTextModel, Qwen3VLVisionModel

log = logging.getLogger(__name__)

# transformers' hidden_states[k]: k = 0 is the embeddings, k >= 1 the output of decoder layer k - 1.
LAYERS = (4, 8, 12, 16, 20, 24, 28, 32)
MAX_LENGTH = 8192  # diffusers' max_sequence_length (it truncates longer prompts; we refuse them)
PAD_ID = 151643  # <|endoftext|>, Qwen3-VL's pad token
PAD_POSITION = 1  # transformers 4.57 (BFL's training environment) gave pad tokens position id 1
KREA2_LAYERS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
KREA2_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
KREA2_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
KREA2_PREFIX_ROWS = 34  # the system prefix's tokens, dropped (diffusers' prompt_template_encode_start_idx)
KREA2_MAX_LENGTH = 512 + KREA2_PREFIX_ROWS - 5  # prefix and prompt tokens diffusers keeps before the 5 suffix ones
# Krea 2's style reference: ComfyUI's TextEncodeQwenImageEditPlus (comfy_extras/nodes_qwen.py) on a krea2 CLIP
# (comfy/text_encoders/krea2.py) gives its own template and a "Picture i: " vision block per picture before the
# prompt; Krea2TEModel keeps the rows after the user turn's opening "<|im_start|>user\n".
KREA2_EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                       "objects, background), then explain how the user's text instruction should alter or modify the "
                       "image. Generate a new image that meets the user's requirements while maintaining consistency "
                       "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                       "<|im_start|>assistant\n")
KREA2_PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
IM_START_ID, USER_ID, NEWLINE_ID = 151644, 872, 198  # "<|im_start|>", "user", "\n"
# Qwen3-VL-4B's vision tower: facts its tensors do not carry (ComfyUI's QWEN3VL_VISION["qwen3vl_4b"] and
# QWEN3VL_VISION_COMMON).
KREA2_VISION_HEADS = 16
KREA2_DEEPSTACK_LAYERS = (5, 11, 17)  # vision blocks whose outputs DeepStack feeds to decoder layers 0, 1, 2
# Qwen3-VL-4B's text_config: RoPE base and mRoPE sections; neither can be read from the tensors. Text tokens have
# the same position on all three mRoPE axes, so the sections do not change text rows (kept for the model's config).
ROPE_THETA = 5_000_000.0
MAX_POSITIONS = 262_144
VISION_MARKERS = ("visual.", "vision_tower.")


class KleinPromptTokenizer:
    """Qwen2 BPE over Qwen3-VL's chat template for one user message with the generation prompt."""

    def __init__(self, tokenizer_dir: str | os.PathLike, max_length: int = MAX_LENGTH,
                 pad_multiple: int = PAD_MULTIPLE):
        if max_length < 1 or pad_multiple < 1:
            raise ValueError(f"KleinPromptTokenizer: max_length ({max_length}) and pad_multiple ({pad_multiple}) "
                             f"must be positive")
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.max_length = max_length
        self.pad_multiple = pad_multiple

    def __call__(self, prompt: str) -> list[int]:
        """Ids of the templated prompt, unpadded; special tokens typed in the prompt count as such (as the HF
        tokenizer diffusers calls parses them)."""
        ids = self.tokenizer(CHAT_TEMPLATE.format(prompt))["input_ids"]
        if len(ids) > self.max_length:
            # diffusers cuts such a prompt at max_sequence_length without a word; the user would never learn
            # that the end of the prompt was dropped, so it fails instead (the seeds' Klein.condition).
            raise prompt_too_long(len(ids), self.max_length)
        return ids

    def pad(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """(ids, mask) right-padded with PAD_ID to a multiple of pad_multiple, at most max_length tokens."""
        n = len(ids)
        if n > self.max_length:
            raise ValueError(f"KleinPromptTokenizer: {n} ids, more than max_length {self.max_length}")
        length = min(-(-n // self.pad_multiple) * self.pad_multiple, self.max_length)
        return ids + [PAD_ID] * (length - n), [1] * n + [0] * (length - n)


class Qwen3VLTextEncoder(TextEncoder):
    """Prompt -> FLUX.3 text rows [1, L, len(layers) * hidden]: hidden_states[k] for k in layers, layer-major."""

    ARCH = "Qwen3-VL text model"
    MODEL = "Qwen3VLTextModel"
    # Where the text model sits: transformers' Qwen3VLForConditionalGeneration files (BFL / Hugging Face), a bare
    # Qwen3VLModel, and ComfyUI's text_encoders layout (HF names under "model.", as its Qwen2.5-VL and Qwen3 files).
    # ComfyUI's own FLUX.3 code was not available: its key names are unverified
    # (reference/families/flux3_klein.md section 12, disagreements between sources, item 6).
    ROOTS = ("model.language_model.", "language_model.", "model.")
    WANTED = ("a Qwen3-VL text encoder (with 'model.language_model.layers.0.self_attn.q_norm.weight' or "
              "'model.layers...'), e.g. qwen3vl_4b_int8_convrot.safetensors for FLUX.3 Klein (CLIPLoader type flux3) "
              "or qwen3vl_4b_fp8_scaled.safetensors for Krea 2 (type krea2)")
    NEEDS = "FLUX.3 Klein needs Qwen3-VL-4B, hidden 2560"
    NEEDS_VL = "FLUX.3 Klein and Krea 2 need Qwen3-VL-4B's"  # the end of the no-vision-tower warning

    def __init__(self, model: Qwen3VLTextModel, tokenizer: KleinPromptTokenizer, layers: tuple[int, ...] = LAYERS):
        super().__init__(model, tokenizer)
        self.layers = tuple(layers)

    @classmethod
    def model_root(cls, ckpt: Checkpoint) -> str:
        root = super().model_root(ckpt)
        if root == "model." and not any(k.startswith(VISION_MARKERS) for k in ckpt.keys()):
            # Qwen3-4B and Qwen3-VL-4B's text model have the same shapes; only the rows tell them apart.
            log.warning("%s: no vision tower: cannot tell a Qwen3-VL text model from a plain Qwen3 of the same "
                        "size; %s", ckpt.path.name, cls.NEEDS_VL)
        return root

    @classmethod
    def config(cls, ckpt: Checkpoint, sizes: dict[str, int], n_layers: int | None = None) -> Qwen3VLTextConfig:
        """The first n_layers layers (the deepest tap's; None: all of the file's); the file must have them."""
        in_file = sizes.pop("n_layers")
        n_layers = in_file if n_layers is None else n_layers
        if in_file < n_layers:
            raise WeightsError(f"{ckpt.path.name}: text encoder has {in_file} layers, the text rows need "
                               f"{n_layers} (hidden_states up to {n_layers}); truncated, or another model?")
        section = sizes["head_dim"] * 20 // 128  # [24, 20, 20] at head_dim 128
        return transformers_class("Qwen3VLTextConfig")(
            **sizes, num_hidden_layers=n_layers, rms_norm_eps=RMS_EPS, max_position_embeddings=MAX_POSITIONS,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "mrope_interleaved": True,
                             "mrope_section": [sizes["head_dim"] // 2 - 2 * section, section, section]},
            attention_bias=False, use_cache=False)

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
             dtype: torch.dtype = torch.float32, layers: tuple[int, ...] = LAYERS,
             expected_hidden: int | None = None, device: str | torch.device = "cpu",
             int8_linears: bool | None = None, convert_on: torch.device | None = None) -> Qwen3VLTextEncoder:
        """A text encoder from a Qwen3-VL file (any layout of ROOTS, any linear format weights.read_linear
        reads; only the first max(layers) layers are read) and a Qwen2 tokenizer folder (ComfyUI's
        qwen25_tokenizer); expected_hidden (2560 for Klein) rejects other model sizes; int8_linears, convert_on:
        TextEncoder.load_model's (None: the INT8 path on a CUDA device)."""
        if not layers or min(layers) < 0:
            raise ValueError(f"Qwen3VLTextEncoder: layers must be hidden_states indices >= 0, got {layers}")
        tokenizer = KleinPromptTokenizer(tokenizer_dir)  # first: a bad folder fails before gigabytes are read
        model = cls.load_model(path, dtype, device, expected_hidden, int8_linears, convert_on,
                               n_layers=max(max(layers), 1))
        return cls(model, tokenizer, layers)

    # no_grad rather than inference_mode: inference tensors refuse in-place updates later in a workflow.
    @torch.no_grad()
    def encode_ids(self, ids: list[int] | torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Rows [1, L_padded, len(layers) * hidden] f32 of unpadded ids; pad rows included (the DiT attends
        them), pads masked as keys inside the encoder and at position id PAD_POSITION; check() before each layer."""
        padded, mask = self.tokenizer.pad(self.checked_ids(ids))
        mask = torch.tensor([mask], device=self.device)
        positions = torch.arange(len(padded), device=self.device)[None].masked_fill(mask == 0, PAD_POSITION)
        return torch.cat(self.hidden_states(padded, mask, positions, check), dim=-1).float()

    def hidden_states(self, ids: list[int], mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                      check: Callable[[], None] | None = None,
                      vision: VisionRows | None = None) -> list[torch.Tensor]:
        """hidden_states[k] [1, L, hidden] for k in layers, of ids (mask [1, L]: keys of 0 unseen; positions [1, L]:
        the same on every mRoPE axis, as text rows have them, or [3, 1, L] per axis; default 0..L-1); vision: rows
        that replace the embeddings of its rows; check() before each layer."""
        input_ids = torch.tensor([ids], device=self.device)
        if positions is None:
            positions = torch.arange(len(ids), device=self.device)[None]
        got = self.fused_states(input_ids, set(self.layers), positions, mask, check) if vision is None else None
        if got is not None:
            return [got[k] for k in self.layers]
        inputs = {"input_ids": input_ids}
        if vision is not None:
            # transformers' Qwen3VLModel.forward: the merged vision rows replace the pad embeddings, and DeepStack
            # adds the deeper vision features to the same rows after the first decoder layers.
            embeds = self.model.embed_tokens(input_ids)
            rows = vision.rows.to(self.device)[None]
            embeds[rows] = vision.embeds.to(embeds)
            inputs = {"inputs_embeds": embeds, "visual_pos_masks": rows,
                      "deepstack_visual_embeds": [d.to(embeds) for d in vision.deepstack]}
        # Keep only the tapped states (hooks) rather than all of output_hidden_states: 33 x [8192, 2560] is 2.7 GB.
        taps: dict[int, torch.Tensor] = {}

        def keep(k: int):
            def hook(_module, _args, out):
                taps[k] = out[0] if isinstance(out, tuple) else out
            return hook

        modules = {k: self.model.embed_tokens if k == 0 else self.model.layers[k - 1] for k in set(self.layers)}
        handles = [m.register_forward_hook(keep(k)) for k, m in modules.items()]
        try:
            with encoding(self.model, check):
                self.model(**inputs, attention_mask=mask, position_ids=positions, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return [taps[k] for k in self.layers]


class Krea2TextEncoder:
    """Prompt -> Krea 2's text rows [L, 12, hidden] f32: hidden_states[k], k in KREA2_LAYERS, stacked per token, of
    the prompt's and the suffix's tokens. diffusers pads the prompt to KREA2_MAX_LENGTH before the suffix, masks the
    pads as keys and gives them no position (positions count valid tokens); so the valid rows are those of the ids
    without pads, and the transformer drops pad rows anyway (exact): no pads are made here. With the file's vision
    tower (load(..., vision=True)), encode_reference reads the style reference's pictures into the rows."""

    def __init__(self, encoder: Qwen3VLTextEncoder, vision: Qwen3VLVisionModel | None = None,
                 no_vision: str = "the Krea 2 text encoder was loaded without its vision tower (load(vision=True))"):
        if encoder.layers != KREA2_LAYERS:
            raise ValueError(f"Krea2TextEncoder: the encoder taps {encoder.layers}, Krea 2 reads {KREA2_LAYERS}")
        self.encoder = encoder
        self.vision = vision
        self.no_vision = no_vision  # why there is none: the error of pictures given without one

    @property
    def text_model(self) -> torch.nn.Module:
        return self.encoder.model

    def clear(self) -> None:
        """TextEncoder.clear of its encoder."""
        self.encoder.clear()

    @classmethod
    def load(cls, path: str | os.PathLike | Checkpoint, tokenizer_dir: str | os.PathLike,
             dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", int8_linears: bool | None = None,
             convert_on: torch.device | None = None, *, vision: bool = False, vision_heads: int = KREA2_VISION_HEADS,
             deepstack_layers: tuple[int, ...] = KREA2_DEEPSTACK_LAYERS) -> Krea2TextEncoder:
        """From a Qwen3-VL-4B file (CLIPLoader type krea2: qwen3vl_4b_fp8_scaled.safetensors; a path or an open
        Checkpoint) and ComfyUI's qwen25_tokenizer folder; only the first 35 layers are read; int8_linears:
        Qwen3VLTextEncoder.load's. vision: also read the file's vision tower (dtype, on device), which the style
        reference's pictures need (WeightsError when the file has none or it does not fit); vision_heads and
        deepstack_layers are Qwen3-VL-4B's (16, (5, 11, 17)), tests on tiny models pass their own."""
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        encoder = Qwen3VLTextEncoder.load(ckpt, tokenizer_dir, dtype, KREA2_LAYERS, device=device,
                                          int8_linears=int8_linears, convert_on=convert_on)
        if not vision:
            return cls(encoder)
        tower = load_vision_tower(ckpt, dtype, device, vision_heads, deepstack_layers, encoder.model.config.hidden_size,
                                  convert_on)
        if tower is None:
            raise WeightsError(f"{ckpt.path.name}: has no vision tower (no 'visual.*' tensors); Krea 2's style "
                               f"reference reads its pictures with Qwen3-VL-4B's: use the text encoder file with it "
                               f"(qwen3vl_4b_fp8_scaled.safetensors)")
        return cls(encoder, tower)

    def tokenize(self, prompt: str) -> list[int]:
        """Ids of [prefix | prompt | suffix] (the prefix and prompt tokenized as one text, as diffusers does)."""
        tokenizer = self.encoder.tokenizer.tokenizer
        ids = tokenizer(KREA2_PREFIX + prompt)["input_ids"]
        if len(ids) > KREA2_MAX_LENGTH:
            raise prompt_too_long(len(ids), KREA2_MAX_LENGTH)  # diffusers would cut it without a word
        return ids + tokenizer(KREA2_SUFFIX)["input_ids"]

    @torch.no_grad()
    def encode(self, prompt: str, check: Callable[[], None] | None = None) -> torch.Tensor:
        states = self.encoder.hidden_states(self.tokenize(prompt), check=check)
        return torch.stack(states, dim=2)[0, KREA2_PREFIX_ROWS:].float()

    @torch.no_grad()
    def encode_reference(self, prompt: str, images: Sequence[torch.Tensor] = (),
                         check: Callable[[], None] | None = None) -> torch.Tensor:
        """The style reference's text rows [L, 12, hidden] f32, as ComfyUI's TextEncodeQwenImageEditPlus makes them
        on a krea2 CLIP: KREA2_EDIT_TEMPLATE around "Picture i: " and a vision block per picture (ComfyUI IMAGE
        tensors [1, H, W, 3] in [0, 1], as that node passes them to clip.tokenize: already resized to its ~384 x 384
        area) then the prompt, tokenized as one text; the pictures' rows from the vision tower, mRoPE positions as
        lay_out_pictures gives them, every key seen; the rows from the user turn's content on (Krea2TEModel's
        template_end: after the second "<|im_start|>" and its "user\n"). check() before each picture and each layer.
        """
        tokenizer = self.encoder.tokenizer.tokenizer
        pictures = "".join(KREA2_PICTURE.format(i) for i in range(1, len(images) + 1))
        ids = tokenizer(KREA2_EDIT_TEMPLATE.format(pictures + prompt))["input_ids"]
        grids, embeds, deepstack = read_pictures(self.vision, images, self.no_vision, check)
        laid = lay_out_pictures(ids, grids)
        device = self.encoder.device
        states = self.encoder.hidden_states(laid.ids, positions=laid.positions[:, None].to(device), check=check,
                                            vision=VisionRows(laid.vision, embeds, deepstack) if images else None)
        if images:
            # ComfyUI's Llama2_ takes hidden_states[k] as decoder layer k's input, after DeepStack added its
            # features to the picture rows of layer k - 1's output; transformers' hidden_states (and the hooks) take
            # the output before that. Krea 2's tap 2 is one of them.
            rows = laid.vision.to(device)
            states = list(states)
            for i, k in enumerate(self.encoder.layers):
                if 1 <= k <= len(deepstack):
                    states[i] = states[i].clone()
                    states[i][0, rows] += deepstack[k - 1].to(states[i])
        return torch.stack(states, dim=2)[0, template_end(ids):].float()


def template_end(ids: list[int]) -> int:
    """The first row of a chat's user content as ComfyUI's Krea2TEModel finds it: the second "<|im_start|>" (or the
    last of fewer), past its "user\n" when those follow."""
    starts = [i for i, t in enumerate(ids) if t == IM_START_ID][:2]
    if not starts:
        raise ValueError("Krea2TextEncoder: no <|im_start|> in the template's ids")
    end = starts[-1]
    return end + 3 if ids[end + 1:end + 3] == [USER_ID, NEWLINE_ID] else end


# --- MiniMax H3: hidden_states[50] of Qwen3-VL-32B over the prompt as typed --------------------------------------

H3_INT8_FILE = "qwen3vl_32b_minimax_h3_int8_convrot.safetensors"  # the template's drop-in alternative
H3_NVFP4_FILE = "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"  # the template's default (NVFP4-AWQ)


def _marker_format(ckpt: Checkpoint, key: str) -> str | None:
    """The "format" of a `<layer>.comfy_quant` marker tensor; None when it has none or is not JSON (read_linear
    reports a broken marker of a layer it reads)."""
    try:
        marker = json.loads(bytes(ckpt.get(key).to(torch.uint8).tolist()).rstrip(b"\x00").decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return marker.get("format") if isinstance(marker, dict) else None


# Tokens the release's tokenizer adds, ids 151669.. in this order (ComfyUI's minimax.py MINIMAX_EXTRA_TOKENS, added
# to the same qwen25_tokenizer): typed in a prompt, each is one token, not its characters.
H3_EXTRA_TOKENS = ("<d>", "</d>", "<|cutoff|>", "<|lyrics_start|>", "<|lyrics_end|>", "<|caption_start|>",
                   "<|caption_end|>")
# Qwen3-VL-32B's vision tower: facts its tensors do not carry (ComfyUI's QWEN3VL_VISION["qwen3vl_32b"] and
# QWEN3VL_VISION_COMMON; the model's config.json).
H3_VISION_HEADS = 16
H3_DEEPSTACK_LAYERS = (8, 16, 24)  # vision blocks whose outputs DeepStack feeds to decoder layers 0, 1, 2


class Presentation(NamedTuple):
    """H3's tokenized presentation: ids, tags (H3's modality tag of each row), positions [3, L] (the mRoPE
    position of each row on the t, h, w axes) and vision [L] bool (the rows the pictures' vision rows take)."""
    ids: list[int]
    tags: list[int]
    positions: torch.Tensor
    vision: torch.Tensor


class VerbatimTokenizer:
    """Qwen2 BPE of the prompt as typed: no template, no special tokens added (diffusers' MiniMaxH3TextEncoderStep:
    tokenizer(prompt, add_special_tokens=False)); special tokens typed in the prompt count as such, as there (the
    release's extra ones too, H3_EXTRA_TOKENS)."""

    def __init__(self, tokenizer_dir: str | os.PathLike):
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.tokenizer.add_special_tokens({"additional_special_tokens": list(H3_EXTRA_TOKENS)})

    def segment(self, text: str) -> list[int]:
        """The ids of a piece of the presentation (none for an empty one)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __call__(self, prompt: str) -> list[int]:
        ids = self.segment(prompt)
        if not ids:
            # No template around it: an empty prompt has no token, and H3's text rows would be none at all.
            raise ValueError("the prompt is empty; MiniMax H3 encodes the prompt alone, so it needs at least one "
                             "token")
        return ids

    def presentation(self, prompt: str, grids: Sequence[tuple[int, int]] = (), audios: int = 0) -> Presentation:
        """Per picture (its merged vision grid gh x gw, in order) "<Picture i>: " and an image block, then per
        reference audio "<Audio j>: " alone, then the prompt: shown()'s presentation of those pieces."""
        pieces = [(f"<Picture {i}>: ", IMAGE_PAD_ID) for i in range(1, len(grids) + 1)]
        return self.shown(prompt, pieces + [(f"<Audio {j}>: ", None) for j in range(1, audios + 1)], grids)

    def shown(self, prompt: str, pieces: Sequence[tuple[str, int | None]],
              grids: Sequence[tuple[int, int]]) -> Presentation:
        """The pieces (text, pad) in order, each text tokenized alone (as ComfyUI's MiniMaxH3Tokenizer and diffusers
        do) and followed, when pad is IMAGE_PAD_ID or VIDEO_PAD_ID, by a vision block (<|vision_start|>, gh * gw
        pads of the next grid, <|vision_end|>), then the prompt (read_references' pieces: diffusers'
        _build_presentation). Tags: text rows H3_TEXT_TAG, a vision block's rows, its start and end included,
        H3_VISION_TAG. Positions: lay_out_pictures'. A pad token typed in the prompt stays a text row."""
        ids, tags = [], []
        for text, pad in pieces:
            label = self.segment(text)
            ids += label
            tags += [H3_TEXT_TAG] * len(label)
            if pad is not None:
                ids += [VISION_START_ID, pad, VISION_END_ID]
                tags += [H3_VISION_TAG] * 3
        prompt_ids = self.segment(prompt) if pieces else self(prompt)
        ids += prompt_ids
        tags += [H3_TEXT_TAG] * len(prompt_ids)
        laid = lay_out_pictures(ids, grids, (IMAGE_PAD_ID, VIDEO_PAD_ID))
        return Presentation(laid.ids, [tags[i] for i in laid.source], laid.positions, laid.vision)


class MiniMaxH3TextEncoder(Qwen3VLTextEncoder):
    """Prompt -> MiniMax H3's text rows [1, Nt, 5120] f32: hidden_states[LAYER] (the output of decoder layer 50,
    before the final norm) of Qwen3-VL-32B's text model over the prompt tokenized verbatim, no padding, positions
    0..Nt-1 (text rows: the same on every mRoPE axis), every key seen. Only the first LAYER layers are built.
    With pictures (encode_tagged), the file's vision tower reads them into vision rows inside the prompt."""

    LAYER = 50  # diffusers' text_encoder_layer
    HIDDEN = 5120  # Qwen3-VL-32B's width, H3's text_dim
    WANTED = (f"a Qwen3-VL-32B text encoder ('model.layers.0.self_attn.q_norm.weight' or "
              f"'model.language_model.layers...'): {H3_INT8_FILE} for MiniMax H3 (CLIPLoader type minimax)")
    NEEDS = f"MiniMax H3 needs Qwen3-VL-32B, hidden 5120: {H3_INT8_FILE}"
    NEEDS_VL = f"MiniMax H3 needs Qwen3-VL-32B's ({H3_INT8_FILE})"

    def __init__(self, model: Qwen3VLTextModel, tokenizer: VerbatimTokenizer, layers: tuple[int, ...],
                 vision: Qwen3VLVisionModel | None = None,
                 no_vision: str = "the text encoder was loaded without a vision tower"):
        super().__init__(model, tokenizer, layers)
        self.vision = vision
        self.no_vision = no_vision  # why there is none (naming the file): the error of pictures given without one

    @classmethod
    def model_root(cls, ckpt: Checkpoint) -> str:
        root = super().model_root(ckpt)
        # Refused before any weight is read: the file is 15-33 GB and its linears would fail one by one.
        formats = {str(m.get("format")) for m in ckpt.quantization_markers().values() if isinstance(m, dict)}
        formats |= {_marker_format(ckpt, k) for k in ckpt.keys() if k.endswith(".comfy_quant")}
        refused = sorted(f for f in formats if f and f not in STORED_FORMATS and not f.startswith("float8"))
        if refused:
            raise WeightsError(f"{ckpt.path.name}: its linears are quantized as {', '.join(refused)}, which this "
                               f"loader does not read; use the template's {H3_NVFP4_FILE} or its drop-in "
                               f"{H3_INT8_FILE} (the same model, INT8 ConvRot) in the CLIPLoader instead")
        return root

    @classmethod
    def load(cls, path: str | os.PathLike | Checkpoint, tokenizer_dir: str | os.PathLike,
             dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
             int8_linears: bool | None = None, convert_on: torch.device | None = None, *, layer: int = LAYER,
             expected_hidden: int | None = HIDDEN, vision_heads: int = H3_VISION_HEADS,
             deepstack_layers: tuple[int, ...] = H3_DEEPSTACK_LAYERS) -> MiniMaxH3TextEncoder:
        """From a Qwen3-VL-32B file (CLIPLoader type minimax: the template's NVFP4-AWQ file or its INT8 ConvRot
        drop-in; any layout and linear format Qwen3VLTextEncoder.load reads, NVFP4 as INT8 ConvRot) and ComfyUI's
        qwen25_tokenizer folder (path: a file or an open Checkpoint); only the first `layer` layers are read, and the
        vision tower (dtype, on device) when the file has one that fits (if not, prompts still encode and pictures
        are refused, saying why). layer, expected_hidden, vision_heads and deepstack_layers are H3's (50, 5120, 16,
        (8, 16, 24)); tests on tiny models pass their own (a middle layer, their width, ...; None skips the width
        check)."""
        if layer < 1:
            raise ValueError(f"MiniMaxH3TextEncoder: layer must be a decoder layer's output (>= 1), got {layer}")
        tokenizer = VerbatimTokenizer(tokenizer_dir)  # first: a bad folder fails before gigabytes are read
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        model = cls.load_model(ckpt, dtype, device, expected_hidden, int8_linears, convert_on, n_layers=layer)
        no_vision = (f"{ckpt.path.name}: has no vision tower (no 'visual.*' tensors); MiniMax H3's keyframe and "
                     f"reference pictures need the Qwen3-VL-32B text encoder file with its vision tower")
        try:
            vision = load_vision_tower(ckpt, dtype, device, vision_heads, deepstack_layers, model.config.hidden_size,
                                       convert_on)
        except WeightsError as e:
            # Prompts alone do not need it: said now, refused when pictures come.
            log.warning("%s; pictures cannot be read", e)
            vision, no_vision = None, str(e)
        return cls(model, tokenizer, (layer,), vision, no_vision)

    @torch.no_grad()
    def encode_ids(self, ids: list[int] | torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Rows [1, len(ids), hidden] f32; no mask (diffusers passes all ones: every row valid); check() before
        each layer."""
        return self.hidden_states(self.checked_ids(ids), check=check)[0].float()

    @torch.no_grad()
    def encode_tagged(self, prompt: str, images: Sequence[torch.Tensor] = (),
                      check: Callable[[], None] | None = None, audios: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [1, Nt, hidden] f32, tags [Nt] int64) of the prompt after its pictures (ComfyUI IMAGE tensors
        [1, H, W, 3] in [0, 1], as MiniMaxH3ImageToVideo passes them to clip.tokenize: already on the canvas; in
        order, "<Picture 1>" first) and `audios` reference audio labels: encode_references' rows of those."""
        references = [PromptReference("image", image) for image in images] + [PromptReference("audio")] * audios
        return self.encode_references(prompt, references, check)

    @torch.no_grad()
    def encode_references(self, prompt: str, references: Sequence[PromptReference] = (),
                          check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [1, Nt, hidden] f32, tags [Nt] int64) of the prompt after a request's references in packed order
        (images, videos and audios as ComfyUI's MiniMaxH3Tokenizer presents them: read_references'
        labels, image blocks and timestamped video blocks from the vision tower); tags H3_TEXT_TAG for text and
        H3_VISION_TAG for a vision block's rows. Without references the rows are encode(prompt)'s. check() before
        each image, each video and each layer."""
        read = read_references(self.vision, references, self.no_vision, check)
        shown = self.tokenizer.shown(prompt, read.pieces, read.grids)
        vision = VisionRows(shown.vision, read.embeds, read.deepstack) if read.embeds is not None else None
        rows = self.hidden_states(shown.ids, positions=shown.positions[:, None].to(self.device), check=check,
                                  vision=vision)[0]
        return rows.float(), torch.tensor(shown.tags, dtype=torch.long)
