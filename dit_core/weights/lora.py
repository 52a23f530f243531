"""LoRA adapters merged into linears at load: W + strength * (alpha / rank) * B A, in the checkpoint's names.

Key forms read (as ComfyUI's comfy/lora.py accepts them): `<layer>.lora_A.weight`/`.lora_B.weight` (PEFT),
`.lora_down.weight`/`.lora_up.weight` with an optional `.alpha` (kohya), under the prefixes `diffusion_model.`,
`model.diffusion_model.`, `transformer.`, `lora_unet_`/`lycoris_` (dots as underscores) or none. A family adds
aliases for its other naming (diffusers' to_q/to_k/to_v are row slices of Z-Image's fused qkv).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .checkpoint import Checkpoint, WeightsError
from .linear import Linear, computed_on

log = logging.getLogger(__name__)


class LoraMismatch(WeightsError):
    """A LoRA file that is not one of this model's (another model or size, no LoRA tensors, a kind not supported):
    the fix is another LoRA, which a node that names the family can say."""

PAIRS = ((".lora_A.weight", ".lora_B.weight"), (".lora_down.weight", ".lora_up.weight"))
PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.", "")
UNDERSCORE_PREFIXES = ("lora_unet_", "lycoris_")


@dataclass(frozen=True)
class Update:
    """One low-rank update of rows [first, first + B.shape[0]) of a linear: factor * B A."""
    down: torch.Tensor   # A [rank, in]
    up: torch.Tensor     # B [rows, rank]
    factor: float
    first: int = 0


@dataclass
class LoraSet:
    """LoRA updates by the model's linear names (no prefix), ready to merge as the linears load."""
    source: str
    updates: dict[str, list[Update]] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)

    def merged(self, name: str, lin: Linear, on: torch.device | None = None) -> Linear:
        """Linear `name` with its updates added (INT8 linears dequantized, merged, requantized with a new scale,
        as ComfyUI does with merged patches), computed on `on` (linear.computed_on); unchanged without updates."""
        ups = self.updates.get(name)
        if not ups:
            return lin
        self.used.add(name)
        for u in ups:
            rows = u.up.shape[0]
            if u.down.shape[1] != lin.in_features or u.first + rows > lin.out_features:
                raise LoraMismatch(f"{self.source}: LoRA layer '{name}' is [{rows} x {u.down.shape[1]}] at row "
                                   f"{u.first}, the model's is {(lin.out_features, lin.in_features)}: a LoRA for "
                                   f"another model size")

        def make(device: torch.device) -> Linear:
            w = lin.to(device).dequantized()
            if w.data_ptr() == lin.weight.data_ptr():  # an f32 weight is its own: never add into the file's map
                w = w.clone()
            for u in ups:
                w[u.first:u.first + u.up.shape[0]] += u.factor * (u.up.to(device).float() @ u.down.to(device).float())
            merged = Linear(w.to(lin.weight.dtype) if not lin.quantized else w, lin.bias)
            return merged.as_int8(lin.group) if lin.quantized and lin.group else merged
        return computed_on(on, make, lin.weight.device)


def _layer_names(keys, suffix_pairs=PAIRS) -> dict[str, tuple[str, str]]:
    """LoRA layer key stem -> (down key, up key)."""
    found = {}
    for key in keys:
        for down, up in suffix_pairs:
            if key.endswith(down):
                stem = key[: -len(down)]
                if stem + up in keys:
                    found[stem] = (key, stem + up)
    return found


def load_lora(path, strength: float, linears: set[str], aliases: dict[str, tuple[str, int]] | None = None) -> LoraSet:
    """The LoRA file at path for a model whose linears are named `linears`; aliases maps other names of the
    family to (linear name, first row). Raises WeightsError for a LoRA of another model; sizes are checked as
    the updates merge (LoraSet.merged)."""
    ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
    keys = set(ckpt.keys())
    stems = _layer_names(keys)
    if not stems:
        raise LoraMismatch(f"{ckpt.path.name}: no LoRA tensors (lora_A/lora_B or lora_down/lora_up) in this file")
    aliases = aliases or {}
    names = {n: (n, 0) for n in linears} | aliases
    underscored = {n.replace(".", "_"): target for n, target in names.items()}
    out = LoraSet(ckpt.path.name)
    unknown = []
    for stem, (down_key, up_key) in sorted(stems.items()):
        target = _resolve(stem, names, underscored)
        if target is None:
            unknown.append(stem)
            continue
        name, first = target
        down, up = ckpt.get(down_key), ckpt.get(up_key)
        if down.dim() != 2 or up.dim() != 2 or down.shape[0] != up.shape[1]:
            raise LoraMismatch(f"{ckpt.path.name}: LoRA layer '{stem}' has A {tuple(down.shape)} and B "
                               f"{tuple(up.shape)}, not a rank-r pair (only linear LoRAs are supported)")
        rank = down.shape[0]
        alpha = ckpt.get(stem + ".alpha").item() if stem + ".alpha" in keys else rank
        out.updates.setdefault(name, []).append(Update(down, up, strength * alpha / rank, first))
    if not out.updates:
        raise LoraMismatch(f"{ckpt.path.name}: a LoRA for another model: none of its {len(stems)} layers (e.g. "
                           f"'{unknown[0]}') is a layer of this model")
    if unknown:
        log.warning("%s: %d LoRA layers match no layer of this model and are skipped (e.g. %s)",
                    ckpt.path.name, len(unknown), unknown[0])
    return out


def _resolve(stem: str, names: dict, underscored: dict) -> tuple[str, int] | None:
    for p in UNDERSCORE_PREFIXES:
        if stem.startswith(p):
            return underscored.get(stem[len(p):])
    for p in PREFIXES:
        if stem.startswith(p) and stem[len(p):] in names:
            return names[stem[len(p):]]
    return None
