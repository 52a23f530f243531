"""What every transformers-architecture text encoder shares: the tokenizer folder, the model's root and sizes
from the file's tensors, its state dict in transformers' names from any stored linear format, the prompt-length
error, a cancel between layers, and TextEncoder: the one loading path (meta build, stored tensors assigned in
their precision, on the card) and what every encoder answers. A file per encoder (qwen3.py, qwen3_vl.py)
subclasses it with only what differs: its transformers config and class, which hidden states it reads, padding
and positions, chat template."""
from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Collection
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import Qwen2Tokenizer

from ..weights import Checkpoint, Linear, WeightsError, moved_to, read_linear, read_tensor
from ..weights.convrot import dequantize_convrot

log = logging.getLogger("SwiftDiT")

# The Qwen chat template (ComfyUI v0.3.75 comfy/text_encoders/z_image.py ZImageTokenizer.llama_template; diffusers'
# apply_chat_template with enable_thinking=True gives the same text: reference/families/z_image.md section 9, the text
# encoder).
CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
DETECT_KEY = "layers.0.self_attn.q_norm.weight"  # Qwen3's per-head q norm (comfy/sd.py detect_te_model)
RMS_EPS = 1e-6  # Qwen3's and Qwen3-VL's config.json (not in the tensors)
ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
STAND_IN_VOCAB = 16  # the rows of a kernel-building stand-in's embedding (FusedDecoder.dry_encode's ids are 0)


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


def converted_on(device: str | torch.device) -> torch.device | None:
    """Where read_linear converts a linear (scaled FP8 and NVFP4 to INT8 ConvRot) for a load to device: on that
    CUDA device (seconds for an encoder there, minutes of rotations on the host), else None (the host)."""
    device = torch.device(device)
    return device if device.type == "cuda" else None


def weight_on(lin: Linear, dtype: torch.dtype, device: str | torch.device,
              source: tuple[Checkpoint, str] | None = None) -> torch.Tensor:
    """lin's weight in the native basis as dtype on device, moved as stored (INT8 codes, BF16; source: the weight's
    (checkpoint, key), moved_to's) and converted there: a BF16 or INT8 weight bound for a card never exists in f32
    on the host (on the CPU in f32 it equals lin.dequantized(), bit for bit)."""
    weight = moved_to(lin.weight, device, source)
    if lin.quantized:
        return dequantize_convrot(weight, lin.scale.to(device), lin.group).to(dtype)
    return weight.to(dtype)


def linear_state(lin: Linear, name: str, dtype: torch.dtype, device: str | torch.device,
                 int8: dict[str, int] | None, source: tuple[Checkpoint, str] | None = None) -> dict[str, torch.Tensor]:
    """The state-dict entries of linear `name` (a module path, no bias): `<name>.weight` of dtype on device
    (weight_on), or, on the INT8 path (int8 a dict, filled here) for an INT8 ConvRot linear the kernels take,
    `<name>.weight` int8 codes and `<name>.scale` f32 row scales as stored, int8[name] its ConvRot group.
    source: the weight's (checkpoint, key) (moved_to's)."""
    if int8 is not None:
        from ..gpu import text_linear  # lazily: the host path never loads dit_core/gpu
        if text_linear.takes(lin):
            int8[name] = lin.group
            return {f"{name}.{k}": t for k, t in text_linear.stored(lin, device, source).items()}
    return {f"{name}.weight": weight_on(lin, dtype, device, source)}


def read_state_dict(ckpt: Checkpoint, root: str, n_layers: int, hidden: int, head_dim: int,
                    dtype: torch.dtype, device: str | torch.device = "cpu",
                    int8: dict[str, int] | None = None,
                    convert_on: torch.device | None = None,
                    vocab_rows: int | None = None) -> dict[str, torch.Tensor]:
    """The text model's state dict in transformers' names (embed_tokens, layers.N.*; no prefix, no final norm)
    for its first n_layers layers, each tensor of dtype on device: any linear format weights.read_linear reads,
    moved as stored (INT8 codes, BF16) and converted there, one tensor at a time, so the host never holds the model
    in f32 (an FP8 or NVFP4 linear passes through the host once as INT8 ConvRot, converted on convert_on, by
    default on device where it is a GPU: converted_on).
    int8 (a dict, filled here): the INT8 path (dit_core/gpu/text_linear.py); each INT8 ConvRot linear the INT8
    kernels take (FP8 ones too, after that conversion) stays as stored, `<name>.weight` int8 codes and
    `<name>.scale` f32 row scales, and int8[<name>] is its ConvRot group; the others are dtype as above.
    vocab_rows: an embedding of that many rows, not read (a stand-in's: its values are never looked at)."""
    markers = ckpt.quantization_markers()
    sd = {"embed_tokens.weight": read_tensor(ckpt, f"{root}embed_tokens.weight", dtype=dtype, device=device)
          if vocab_rows is None else torch.empty(vocab_rows, hidden, dtype=dtype, device=device)}
    for i in range(n_layers):
        src, dst = f"{root}layers.{i}.", f"layers.{i}."
        for group, names in (("self_attn", ATTN_LINEARS), ("mlp", MLP_LINEARS)):
            for n in names:
                lin = read_linear(ckpt, f"{src}{group}.{n}", markers, convert_on or converted_on(device), device,
                                  fp8_as=dtype if int8 is None else None)
                if lin.bias is not None:
                    raise WeightsError(f"{ckpt.path.name}: '{src}{group}.{n}' has a bias; Qwen3 has none, so "
                                       f"this is another model family")
                sd.update(linear_state(lin, f"{dst}{group}.{n}", dtype, device, int8,
                                       (ckpt, f"{src}{group}.{n}.weight")))
        for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            size = head_dim if n.startswith("self_attn") else hidden
            sd[f"{dst}{n}.weight"] = read_tensor(ckpt, f"{src}{n}.weight", (size,), dtype, device)
    return sd


def transformers_class(name: str) -> type:
    """transformers' class `name`, its modeling module imported on first use (at a load, not at ComfyUI's start: the
    text models' modules took about 0.6 s of it); a transformers without it is named in a ValueError."""
    import transformers
    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError) as e:
        raise ValueError(f"the installed transformers {transformers.__version__} has no {name} ({e}); SwiftDiT's "
                         f"text encoders are tested with transformers 5.17 to 5.25: pip install -U transformers") from e


def meta_model(model_class: type[torch.nn.Module], config: Any, int8: dict[str, int] | None) -> torch.nn.Module:
    """model_class(config) built on meta (gpt-fast habit: no random init of billions of weights; the caller
    assigns the loaded tensors), the linears named in int8 swapped for Int8Linear (the INT8 path)."""
    with torch.device("meta"):
        model = model_class(config)
        if int8:
            from ..gpu import text_linear  # lazily, as in linear_state
            text_linear.swap_in(model, int8)
    return model


# SDPA's back ends for a prompt on the GPU: not cuDNN, which builds a plan for every new sequence length (54-59 ms
# each on an H100, so at nearly every new prompt), where flash attention's first call at a new length takes ~1 ms.
PROMPT_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextmanager
def encoding(model: torch.nn.Module, check: Callable[[], None] | None):
    """Within, the transformers text model encodes a prompt: check() before each of its layers runs (a cancel
    inside an encode), and on a GPU its attention by PROMPT_ATTENTION's back ends."""
    handles = [] if check is None else [layer.register_forward_pre_hook(lambda *_: check()) for layer in model.layers]
    cuda = model.embed_tokens.weight.device.type == "cuda"
    try:
        with sdpa_kernel(PROMPT_ATTENTION) if cuda else nullcontext():
            yield
    finally:
        for handle in handles:
            handle.remove()


class TextEncoder:
    """A transformers text model rebuilt from a checkpoint, and its prompt tokenizer. A subclass names its model
    (the class attributes), makes its config from the file's sizes (config), keeps its own load() (arguments,
    tokenizer, then load_model) and encode_ids (which hidden states, padding, positions). The readers load_model
    calls are Qwen3-style (q_norm, no biases): another Qwen3-VL size (MiniMax H3's 32B) is a subclass of
    Qwen3VLTextEncoder, while Gemma-4 (LTX-2.5) needs its own readers beside these, chosen by its class."""

    ARCH: str  # the model's name in errors, e.g. "Qwen3"
    MODEL: str  # the transformers text model class's name (transformers_class), built on meta
    ROOTS: tuple[str, ...]  # key prefixes the text model may sit under, tried in order
    WANTED: str  # what a wrong file is told was expected (which file, which CLIPLoader type)
    NEEDS: str  # which model expected_hidden stands for, in its error

    def __init__(self, model: torch.nn.Module, tokenizer: Callable[[str], list[int]]):
        self.model = model
        self.tokenizer = tokenizer
        self.fused_layers = True  # encode through fused() where it has a form
        # and replayed from their CUDA graphs on a GPU (FusedDecoder.replayed): a prompt's ~11 launches a layer set
        # an eager encode's pace (22 ms for 4 ms of kernels, Qwen3-VL-4B, H100)
        self.replayed_encodes = True

    @classmethod
    def config(cls, ckpt: Checkpoint, sizes: dict[str, int], **options: Any) -> Any:
        """The transformers config of the layers to build, from read_shapes' sizes (n_layers: layers in the
        file); options are what the subclass's load() passes to load_model."""
        raise NotImplementedError

    @classmethod
    def model_root(cls, ckpt: Checkpoint) -> str:
        return find_root(ckpt, cls.ROOTS, cls.WANTED)

    @classmethod
    def load_model(cls, path: str | os.PathLike | Checkpoint, dtype: torch.dtype, device: str | torch.device,
                   expected_hidden: int | None = None, int8_linears: bool | None = None,
                   convert_on: torch.device | None = None, stand_in: bool = False,
                   **options: Any) -> torch.nn.Module:
        """The text model of a file (a path or an open Checkpoint), in eval mode on device; expected_hidden
        rejects other model sizes; options go to config(). int8_linears: the INT8 path, each INT8 ConvRot
        linear (FP8 ones are INT8 ConvRot after read_linear) kept as stored and run on the INT8 kernels
        (dit_core/gpu/text_linear.py Int8Linear); BF16 linears and groups the kernels do not take stay dtype.
        None: on for a CUDA device (half the card memory of BF16 weights, the DiT's own linear path), off
        elsewhere (the f32 host reference stays exact); True on the CPU runs the kernels' references (tests).
        convert_on: where FP8 and NVFP4 linears convert (read_state_dict's; a GPU for a host load that will
        stream its layers there).
        On a CUDA device the fused layers' Triton kernels build meanwhile, on a thread of their own from a stand-in
        of one layer (the model's `building`, which fused() joins); stand_in: load that stand-in."""
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        root = cls.model_root(ckpt)
        config = cls.config(ckpt, read_shapes(ckpt, root, expected_hidden, cls.NEEDS), **options)
        if int8_linears is None:
            int8_linears = torch.device(device).type == "cuda"
        building = None
        if stand_in:
            config.num_hidden_layers, config.vocab_size = 1, STAND_IN_VOCAB
            if getattr(config, "layer_types", None):  # (per layer, where the config lists them)
                config.layer_types = config.layer_types[:1]
        elif torch.device(device).type == "cuda":
            building = cls.kernels_built_beside(ckpt.path, dtype, device, int8_linears, convert_on, options)
        int8 = {} if int8_linears else None
        sd = read_state_dict(ckpt, root, config.num_hidden_layers, config.hidden_size, config.head_dim, dtype,
                             device, int8, convert_on, STAND_IN_VOCAB if stand_in else None)
        model = meta_model(transformers_class(cls.MODEL), config, int8)
        # The final norm is never read (the features are raw residual streams): Identity, and nothing to load.
        model.norm = torch.nn.Identity()
        try:
            model.load_state_dict(sd, strict=True, assign=True)
        except RuntimeError as e:
            raise WeightsError(f"{ckpt.path.name}: tensors do not fit the {cls.ARCH} that its embedding and "
                               f"layer 0 describe ({e})") from e
        # inv_freq is a non-persistent buffer, so it is still on meta: computed for real, in f32. The
        # parameters already have dtype; a module-wide cast would also round inv_freq (the RoPE angles) to it.
        model.rotary_emb = type(model.rotary_emb)(config=config)
        model = model.to(device).eval()
        model.building = building
        return model

    @classmethod
    def stand_in(cls, path: Path, dtype: torch.dtype, device: str | torch.device, int8_linears: bool = False,
                 convert_on: torch.device | None = None, options: dict | None = None):
        """The fused layers (FusedDecoder) of a stand-in of the model: its first layer read from the file, an
        embedding of a few rows (every layer launches the same kernels, so its dry_encode builds the whole model's
        encode's); None where the layers do not fuse."""
        from ..gpu.text_decoder import FusedDecoder  # lazily, as fused()
        return FusedDecoder.of(cls.load_model(Checkpoint(path), dtype, device, int8_linears=int8_linears,
                                              convert_on=convert_on, stand_in=True, **(options or {})))

    @classmethod
    def kernels_built_beside(cls, path: Path, dtype: torch.dtype, device: str | torch.device, int8_linears: bool,
                             convert_on: torch.device | None, options: dict) -> threading.Thread:
        """builds.built_beside of the fused layers' Triton kernels on the stand-in."""
        from ..gpu.builds import built_beside
        return built_beside(lambda: cls.stand_in(path, dtype, device, int8_linears, convert_on, options),
                            lambda fused: None if fused is None else fused.dry_encode(), torch.device(device))

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def fused(self):
        """The model's decoder layers on the engine's kernels (dit_core/gpu/text_decoder.py FusedDecoder), made at
        the first encode where the model is on a CUDA GPU in BF16 or INT8; None elsewhere (the transformers model
        runs: the f32 host reference, streamed layers, Gemma-4) or where fused_layers is off (benchmarks)."""
        if not self.fused_layers:
            return None
        if getattr(self, "_fused_on", None) != self.device:
            from ..gpu.text_decoder import FusedDecoder  # lazily, as text_linear
            building = getattr(self.model, "building", None)
            if building is not None:  # the kernels a stand-in builds beside the load: not built twice
                building.join()
                self.model.building = None
            self._fused, self._fused_on = FusedDecoder.of(self.model), self.device
            if self._fused is not None:
                built = self._fused.build_ahead()
                log.info("SwiftDiT: %s's %d layers run fused on %s%s", self.ARCH, len(self._fused.layers), self.device,
                         f"; {built.kernels} Triton kernels built ahead in {built.seconds:.2f} s" if built.kernels
                         else "")
        return self._fused

    def clear(self) -> None:
        """Its replayed encodes' CUDA graphs dropped and their memory given back (before the weights they read move
        or go: the nodes keep the encoder as its own LOADED companion)."""
        fused = getattr(self, "_fused", None)
        if fused is not None and fused.graphed is not None:
            fused.graphed.clear()

    def fused_states(self, ids: torch.Tensor, taps: Collection[int], positions: torch.Tensor | None = None,
                     mask: torch.Tensor | None = None,
                     check: Callable[[], None] | None = None) -> dict[int, torch.Tensor] | None:
        """FusedDecoder.states of fused() where there is one (replayed from CUDA graphs where replayed_encodes, check()
        asked before), else None: the caller runs the transformers model. A
        failure of the fused layers (a kernel this GPU cannot build) turns them off for this encoder, logged, and
        gives None (so does a failure to make them); a cancel (check() raising) and running out of memory pass
        through."""
        cancelled = []

        def asked():
            try:
                check()
            except BaseException:
                cancelled.append(True)
                raise

        with encoding(self.model, None):
            try:
                fused = self.fused()
                if fused is None:
                    return None
                if self.replayed_encodes and ids.is_cuda:
                    if check is not None:
                        asked()
                    return fused.replayed(ids, taps, positions, mask)
                return fused.states(ids, taps, positions, mask, None if check is None else asked)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:
                if cancelled:
                    raise
                log.warning("SwiftDiT: %s's fused layers failed (%s: %s); its encodes run transformers' layers",
                            self.ARCH, type(e).__name__, e)
                self.fused_layers = False
                return None

    @property
    def text_model(self) -> torch.nn.Module:
        """The transformers text model (its `layers` what streams: dit_core/gpu/text_streaming.py)."""
        return self.model

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def tokenize(self, prompt: str) -> list[int]:
        """Ids of the prompt in the encoder's chat template, unpadded."""
        return self.tokenizer(prompt)

    def checked_ids(self, ids: list[int] | torch.Tensor) -> list[int]:
        """ids as a flat list; ValueError unless non-empty and all within the vocabulary."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).tolist()
        vocab = self.model.config.vocab_size
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"{type(self).__name__}: token ids must be a non-empty list in [0, {vocab}), "
                             f"got {len(ids)} ids {ids[:8]}...")
        return ids

    def encode_ids(self, ids: list[int] | torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, prompt: str, check: Callable[[], None] | None = None) -> torch.Tensor:
        """The features of a prompt (encode_ids of its tokens), f32; check() before each layer (it raises to
        cancel)."""
        return self.encode_ids(self.tokenize(prompt), check)
