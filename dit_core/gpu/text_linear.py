"""A transformers text encoder's linear on the engine's INT8 path (issue 34): the INT8 ConvRot codes stay as stored
(int8 [N, K], f32 row scales, the ConvRot group) and each call runs as the DiT's GPU block runs a plain linear
(block.py: GpuLinear, product): rows -> quantize_rows -> int8_linear -> bf16. dit_core/text/loading.py
imports this lazily, only when a load asks for the INT8 path."""
from __future__ import annotations

import torch

from ..weights import Linear
from .block import GpuLinear, product
from .options import DEFAULT, Options

# The ConvRot groups quantize_rows takes (kernels/int8/quant.py checked: its tl.dot tiles); an INT8 linear of
# another group is dequantized to BF16 at load, as before.
KERNEL_GROUPS = (16, 64, 256)


def takes(lin: Linear) -> bool:
    """Whether lin can stay INT8 and run on the INT8 kernels: INT8 codes rotated by a group they take."""
    return lin.quantized and lin.group in KERNEL_GROUPS


def stored(lin: Linear, device: torch.device | str, source: tuple | None = None) -> dict[str, torch.Tensor]:
    """An Int8Linear's tensors of lin (takes(lin)) on device, as GpuLinear.of makes them (a tensorwise scale
    becomes one a row): the codes moved as stored (source: their (checkpoint, key)), no float copy."""
    g = GpuLinear.of(lin, torch.device(device), source)
    return {"weight": g.weight, "scale": g.scale}


class Int8Linear(torch.nn.Module):
    """nn.Linear's place (no bias: Qwen3's have none) for an INT8 ConvRot weight. The codes and scales are buffers,
    so model.to(device) moves them and state_dict/load_state_dict(assign=True) name them `weight` and `scale`;
    the GpuLinear is made from them at each call (a frozen value would not follow a move). Output: x's dtype."""

    def __init__(self, in_features: int, out_features: int, group: int, options: Options | None = None):
        super().__init__()
        if group not in KERNEL_GROUPS:
            raise ValueError(f"Int8Linear: ConvRot group must be one of {KERNEL_GROUPS}, got {group}")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.options = options or DEFAULT
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(out_features, dtype=torch.float32))

    @property
    def linear(self) -> GpuLinear:
        return GpuLinear(self.weight, self.scale, None, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = product(x.reshape(-1, self.in_features), self.linear, self.options)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}"


def swap_in(model: torch.nn.Module, groups: dict[str, int], options: Options | None = None) -> None:
    """Each nn.Linear of model named in groups (module path -> ConvRot group) replaced by an Int8Linear of its
    shape, built on the device the caller's context gives (meta, before load_state_dict(assign=True))."""
    for name, group in groups.items():
        old = model.get_submodule(name)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Int8Linear(old.in_features, old.out_features, group, options))
