"""The load preamble every family's recipe shares: the file opened and recognised (its key prefix, from the family's
own keys, never the file name), its quantization markers, the LoRAs merged into each linear as it is read, and the
conversion of the blocks' linears that the loader's `linears` asks for."""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path

import torch

from ..block import Block
from ..weights import BlocksOnUse, Checkpoint, FirstBlocks, HeaderOnly, Linear, WeightsError, read_linear
from ..weights.lora import load_lora

log = logging.getLogger("SwiftDiT")

# 'stored' keeps each block linear as stored, 'int8' quantizes float ones to INT8 ConvRot (on the device given),
# 'bf16' dequantizes INT8 ones.
LINEAR_MODES = ("stored", "int8", "bf16")
_CONVERT = {"stored": lambda block, on: block, "int8": lambda block, on: block.quantized(on),
            "bf16": lambda block, on: block.dequantized(torch.bfloat16)}


@dataclass(frozen=True)
class Detection:
    """How a family knows its file: every one of `keys` under one of `prefixes`; else the error says the file is not
    `model` and names an `example` file of the family to pick."""
    keys: tuple[str, ...]
    prefixes: tuple[str, ...]
    model: str    # "a Z-Image diffusion model"
    example: str  # "a Z-Image file such as z_image_turbo_bf16.safetensors"


@dataclass(frozen=True)
class OpenedFile:
    """A family's checkpoint, opened: `linear(name)` reads the linear `prefix + name` (in any stored format) with the
    LoRAs merged, and `convert(block)` turns a block's linears into the loader's `linears` mode. compute_on: the
    device that does the load's arithmetic (FP8 and float linears quantized, LoRAs merged: a GPU does in seconds what
    a CPU does in minutes); the linears stay where the file is read."""
    ckpt: Checkpoint
    prefix: str
    markers: dict
    linears: str = "stored"
    adapters: tuple = ()
    compute_on: torch.device | None = None

    @staticmethod
    def open(path: str | Path | Checkpoint, detection: Detection, linears: str = "stored",
             compute_on: torch.device | None = None) -> OpenedFile:
        if linears not in LINEAR_MODES:
            raise ValueError(f"linears must be one of {LINEAR_MODES}, got {linears!r}")
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        prefix = ckpt.prefix_of(detection.keys, detection.prefixes)
        if prefix is None:
            missing = " and ".join(f"'{k}'" for k in detection.keys)
            raise WeightsError(f"{ckpt.path.name}: not {detection.model} (no {missing}); pick {detection.example}")
        return OpenedFile(ckpt, prefix, ckpt.quantization_markers(), linears, compute_on=compute_on)

    def convert(self, block: Block) -> Block:
        return _CONVERT[self.linears](block, self.compute_on)

    def with_loras(self, loras: tuple[tuple[str | Path, float], ...],
                   aliases: Callable[[set[str]], dict]) -> OpenedFile:
        """This file with (file, strength) LoRAs merged as its linears are read; aliases(names of the file's
        matrices, less the prefix and .weight) maps other trainers' names to the file's (load_lora)."""
        if not loras:
            return self
        p = self.prefix
        names = {k[len(p):-len(".weight")] for k in self.ckpt.keys()  # noqa: SIM118 (a Checkpoint, not a dict)
                 if k.startswith(p) and k.endswith(".weight") and len(self.ckpt.shape(k)) == 2}
        found = aliases(names)
        return replace(self, adapters=tuple(load_lora(f, s, names, found) for f, s in loras))

    def blocks(self, read: Callable[[OpenedFile, int], Block], count: int, on_use: bool = False) -> Sequence[Block]:
        """Blocks read(this file, i) for i < count: read now (a tuple), or with on_use each when it is used
        (BlocksOnUse: a model placed on a card block by block never holds a host copy of itself), where the read
        runs on the file's header alone (its checks then run now); a read that needs the weights' values (a
        conversion meta tensors cannot make) reads now, and the log says so."""
        if on_use:
            header = replace(self, ckpt=HeaderOnly(self.ckpt), compute_on=torch.device("meta"))
            try:
                shapes = tuple(read(header, i) for i in range(count))
            except (RuntimeError, NotImplementedError) as e:
                log.info("%s: blocks read before they are placed (%s)", self.ckpt.path.name, e)
            else:
                # (a real tensor indexed by a meta one is real: such a read made the weights after all)
                made = next((w for w in _weights(shapes) if not w.is_meta and w.nbytes > HeaderOnly.SMALL), None)
                if made is None:
                    return BlocksOnUse(functools.partial(read, self), shapes)
                log.info("%s: blocks read before they are placed (a read of the header made a %s weight)",
                         self.ckpt.path.name, tuple(made.shape))
        return tuple(read(self, i) for i in range(count))

    def linear(self, name: str) -> Linear:
        merged = read_linear(self.ckpt, self.prefix + name, self.markers, self.compute_on)
        for adapter in self.adapters:
            merged = adapter.merged(name, merged, self.compute_on)
        return merged


def _weights(tree):
    """The linears' weights in a tree of dataclasses and tuples."""
    if isinstance(tree, Linear):
        yield tree.weight
    elif is_dataclass(tree) and not isinstance(tree, type):
        for f in fields(tree):
            yield from _weights(getattr(tree, f.name))
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from _weights(item)


def stand_in(recipe, path: str | Path, linears: str, device: torch.device):
    """A one-block stand-in of the file's model on device (FirstBlocks: each stack of blocks cut to its first, the
    rest not read): every block launches the same kernels, so its dry_pass() builds the whole model's first step's
    (the builds beside a load, `swiftdit prebuild`)."""
    return recipe.load(FirstBlocks(path), linears, compute_on=device).to(device)
