"""One linear as stored: float weights, or INT8 codes with f32 row scales (rotated by ConvRot); stacked rows and
SwiGLU's interleaved [gate; up] rows."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .convrot import CONVROT_GROUP, convrot_group_for, dequantize_convrot, quantize_convrot


def computed_on(on: torch.device | str | None, make: Callable[[torch.device], Linear], here: torch.device,
                placed_on: torch.device | str | None = None) -> Linear:
    """make(device) -> a Linear computed there, run on `on` (a GPU: a load's quantizations and merges take seconds
    there where a CPU takes minutes) and brought back `here`, where the model is assembled (kept on `on` where that is
    placed_on: where the caller puts it, e.g. a text encoder loaded on the card); on `here` itself where on is None or
    is here, or where `on` runs out of memory for it."""
    if on is not None and torch.device(on) != here:
        try:
            made = make(torch.device(on))
            return made.to(on if placed_on is not None and torch.device(placed_on) == torch.device(on) else here)
        except torch.OutOfMemoryError:
            pass  # a full card: this linear is computed here, as without a GPU
    return make(here)


@dataclass(frozen=True)
class Linear:
    """A linear [out, in]: float weights, or INT8 codes with f32 row scales (rotated by ConvRot if group > 0)."""
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    group: int = 0

    @property
    def quantized(self) -> bool:
        return self.weight.dtype == torch.int8

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    def dequantized(self) -> torch.Tensor:
        """The weight in the native basis, f32."""
        if not self.quantized:
            return self.weight.float()
        return dequantize_convrot(self.weight, self.scale, self.group)

    def as_int8(self, group: int = CONVROT_GROUP, on: torch.device | str | None = None) -> Linear:
        """INT8 ConvRot of this linear (Block.quantized): float weights rotated and quantized, f32 master
        first; already-INT8 linears unchanged; a K that no power-of-4 group divides stays float. on: the device
        that computes it (computed_on); the result stays where the weight is."""
        if self.quantized:
            return self
        g = convrot_group_for(self.in_features, group)
        if not g:
            return self

        def make(device: torch.device) -> Linear:
            codes, scale = quantize_convrot(self.weight.to(device).float(), g)
            return replace(self, weight=codes, scale=scale, group=g)
        return computed_on(on, make, self.weight.device)

    def to(self, device: torch.device | str) -> Linear:
        """This linear with its tensors on device."""
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, weight=on(self.weight), bias=on(self.bias), scale=on(self.scale))

    def as_float(self, dtype: torch.dtype = torch.bfloat16) -> Linear:
        """This linear with float weights of dtype (Block.dequantized)."""
        return Linear(self.dequantized().to(dtype), self.bias, None, 0)

    def row_slice(self, start: int, stop: int) -> Linear:
        """Output rows start..stop-1 as views (no copy), with their scales and biases."""
        scale = self.scale
        if scale is not None and scale.numel() > 1:
            scale = scale.reshape(-1, 1)[start:stop]
        bias = None if self.bias is None else self.bias[start:stop]
        return replace(self, weight=self.weight[start:stop], bias=bias, scale=scale)

    def rows(self, index: torch.Tensor) -> Linear:
        """The linear with output rows reordered/selected by index (rows move with their scales and biases;
        ConvRot acts on inputs, so no requantization)."""
        take = lambda t: torch.index_select(t, 0, index.to(t.device))  # noqa: E731  (rows copied whole: 1.8x
        # advanced indexing's gather of an INT8 weight on the host)
        scale = self.scale
        if scale is not None and scale.numel() > 1:
            scale = take(scale.reshape(-1, 1))
        bias = None if self.bias is None else take(self.bias)
        return replace(self, weight=take(self.weight), bias=bias, scale=scale)


def _stackable(parts: list[Linear]) -> tuple[list[Linear], list | None, list | None]:
    """(parts in one format, else all f32; their row scales [n, 1] when INT8; their biases, zeros where one has none,
    or None where none has one): what a stack of their rows stacks."""
    first = parts[0]
    if any(p.quantized != first.quantized or p.group != first.group for p in parts):
        parts = [p.as_float(torch.float32) for p in parts]
    scales = [p.scale.reshape(-1, 1).expand(p.out_features, 1) for p in parts] if parts[0].quantized else None
    biases = None
    if any(p.bias is not None for p in parts):
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=torch.float32,
                                                                  device=p.weight.device) for p in parts]
    return parts, _alike(scales), _alike(biases)


def _alike(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """tensors all meta where one is (a read of a file's header, HeaderOnly, with one part's values computed)."""
    if tensors is None or not any(t.is_meta for t in tensors):
        return tensors
    return [t.to("meta") for t in tensors]


def stack_rows(parts: list[Linear], order: torch.Tensor | None = None) -> Linear:
    """Linears of one input stacked by output rows (QKV fusion, [gate; up]; _stackable). order: the stacked rows
    then taken in this order (as .rows(order) takes them), each run of rows from one part gathered straight into
    its place: one pass, not a stack and a gather."""
    parts, scales, biases = _stackable(parts)
    stacked = lambda ts: None if ts is None else _stacked(ts, order)  # noqa: E731
    return Linear(stacked([p.weight for p in parts]), stacked(biases), stacked(scales), parts[0].group)


def _stacked(tensors: list[torch.Tensor], order: torch.Tensor | None) -> torch.Tensor:
    """torch.cat(tensors)[order], each run of order within one tensor's rows taken from it by index_select."""
    if order is None:
        return torch.cat(tensors)
    ends = torch.tensor([t.shape[0] for t in tensors]).cumsum(0)
    order = order.cpu()
    source = torch.bucketize(order, ends, right=True)  # the tensor each row comes from
    if int(order.min()) < 0 or int(order.max()) >= int(ends[-1]):
        raise IndexError(f"stack_rows: an order of rows 0..{int(ends[-1]) - 1} holds {int(order.min())}.."
                         f"{int(order.max())}")
    out = torch.empty(len(order), *tensors[0].shape[1:], dtype=tensors[0].dtype, device=tensors[0].device)
    cuts = [0, *(torch.nonzero(source[1:] != source[:-1]).flatten() + 1).tolist(), len(order)]
    for lo, hi in zip(cuts, cuts[1:]):
        i = int(source[lo])
        start = int(ends[i]) - tensors[i].shape[0]
        torch.index_select(tensors[i], 0, (order[lo:hi] - start).to(tensors[i].device), out=out[lo:hi])
    return out


def glu_rows(gate: torch.Tensor | Linear, up: torch.Tensor | Linear):
    """[gate; up] interleaved as UP holds them: gate j at row 2j, up j at 2j + 1 (seed 000 gluRows); linears' rows
    as stack_rows stacks them, in one pass (a stack then a gather took 3.3 times as long on the host)."""
    if isinstance(gate, Linear):
        (gate, up), scales, biases = _stackable([gate, up])
        interleaved = lambda ts: None if ts is None else glu_rows(*ts)  # noqa: E731
        return Linear(glu_rows(gate.weight, up.weight), interleaved(biases), interleaved(scales), gate.group)
    return torch.stack([gate, up], dim=1).reshape(-1, *gate.shape[1:])
