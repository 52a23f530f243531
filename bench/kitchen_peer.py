"""Stock ComfyUI's INT8 arithmetic as a peer for the step benchmarks: a copy of a diffusers transformer whose
blocks' attention and feed-forward linears (the ones our INT8 path quantizes) are ComfyUI's INT8 ConvRot linear.

The weights are quantized by comfy-kitchen 0.2.40 from the same BF16 values ours are quantized from. Each call is
comfy_kitchen.int8_linear in `backend` (cuda on the GPU, eager on the CPU), as ComfyUI's loaders run an INT8 ConvRot
file. So the model code is diffusers' and the INT8 arithmetic is ComfyUI's. The peer measures that arithmetic's speed
and its step error against BF16, which is the format's own error: our INT8 path matches it linear for linear
(docs/notes/runs.md).
"""
from __future__ import annotations

import copy
import importlib

import torch

KITCHEN = "diffusers + comfy-kitchen INT8 ConvRot"  # the peer's label in the benchmarks' tables
GROUP = 256  # the ConvRot group of ComfyUI's files
BLOCK_PARTS = (".attention", ".attn", ".feed_forward", ".ff")  # Z-Image's and FLUX.3's module names


class KitchenLinear(torch.nn.Module):
    """A BF16 nn.Linear as ComfyUI's INT8 ConvRot linear: kitchen's codes [N, K] and scales [N, 1] f32."""

    def __init__(self, linear: torch.nn.Linear, backend: str):
        super().__init__()
        if linear.in_features % GROUP:
            raise ValueError(f"kitchen_int8: ConvRot group {GROUP} does not divide in_features {linear.in_features}")
        q, s = torch.ops.comfy_kitchen.quantize_int8_convrot_weight(linear.weight.data.float(), GROUP)
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.bias, self.backend = linear.bias, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import comfy_kitchen
        with comfy_kitchen.use_backend(self.backend):
            out = comfy_kitchen.int8_linear(x.reshape(-1, x.shape[-1]), self.q, self.s, self.bias, x.dtype, True,
                                            GROUP)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def kitchen_int8(model: torch.nn.Module, backend: str = "cuda") -> torch.nn.Module:
    """A copy of model with every nn.Linear inside its blocks' attention and feed-forward modules a KitchenLinear."""
    importlib.import_module("comfy_kitchen")  # registers torch.ops.comfy_kitchen
    quantized = copy.deepcopy(model)
    for name, module in list(quantized.named_modules()):
        if any(part in name for part in BLOCK_PARTS):
            for child_name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(module, child_name, KitchenLinear(child, backend))
    return quantized
