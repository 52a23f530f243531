"""Weights as stored: lazy safetensors files, and each linear as BF16/F16/F32, INT8 ConvRot, FP8 or W4A8.

Formats are detected from tensors, dtypes and markers only, never from file names
(reference/int8_convrot_format.md). Nothing here unpickles: safetensors only.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

# safetensors dtype names -> torch dtypes we can hold (the header check rejects any other).
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CONVROT_GROUP = 256
MAX_HEADER_BYTES = 100 * 1024 * 1024


class WeightsError(ValueError):
    """A model file that is not what the loader expects; the message names the file and the fix."""


class Checkpoint:
    """One safetensors file, read lazily (memory-mapped); its header is checked before any tensor is read. check(),
    when set, runs before each tensor is read (it raises to cancel a long load)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.check: Callable[[], None] | None = None
        if self.path.suffix.lower() not in (".safetensors", ".sft"):
            raise WeightsError(f"{self.path.name}: only .safetensors files are read (no pickle); convert it first")
        self.header, self.metadata = _read_header(self.path)
        try:
            self._file = safe_open(str(self.path), framework="pt", device="cpu")
        except Exception as e:  # safetensors' own checks (holes between tensors, ...) beyond ours
            raise WeightsError(f"{self.path.name}: safetensors cannot open it ({e})") from e

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def keys(self) -> list[str]:
        return list(self.header)

    def prefix_of(self, keys: tuple[str, ...], prefixes: tuple[str, ...]) -> str | None:
        """The first of prefixes under which the file holds every one of keys (a family's detection), or None."""
        return next((p for p in prefixes if all(p + k in self for k in keys)), None)

    def numbered(self, stem: str, suffix: str) -> int:
        """How many blocks stem0suffix, stem1suffix, ... the file holds in a row."""
        n = 0
        while f"{stem}{n}{suffix}" in self:
            n += 1
        return n

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return SAFETENSORS_DTYPES[self._entry(name)["dtype"]]

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        if self.check is not None:
            self.check()
        return self._file.get_tensor(name)

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Tensor name's stored bytes read from the file straight into out (uint8 host memory of exactly its
        size, e.g. a pinned staging buffer): no tensor and no second host copy is made."""
        begin, end = self._entry(name)["data_offsets"]
        if out.dtype != torch.uint8 or out.device.type != "cpu" or out.numel() != end - begin:
            raise ValueError(f"{self.path.name}: '{name}' holds {end - begin} bytes; read_into needs a host "
                             f"uint8 tensor of that size, got {out.dtype} [{out.numel()}] on {out.device}")
        if self.check is not None:
            self.check()
        view = memoryview(out.numpy()).cast("B")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            f.seek(8 + n + begin)  # the data section follows the 8-byte length and the JSON header
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise WeightsError(f"{self.path.name}: '{name}' ends past the end of the file (truncated?)")
                done += got

    def _entry(self, name: str) -> dict:
        if name not in self.header:
            raise WeightsError(f"{self.path.name}: tensor '{name}' is missing; is this the right model file?")
        return self.header[name]

    def quantization_markers(self) -> dict[str, dict]:
        """Per-layer quantization markers from the header's `_quantization_metadata` (ComfyUI's file form)."""
        raw = self.metadata.get("_quantization_metadata")
        if not raw:
            return {}
        try:
            return dict(json.loads(raw).get("layers", {}))
        except (ValueError, AttributeError) as e:
            raise WeightsError(f"{self.path.name}: unreadable _quantization_metadata in the header ({e})") from e


def _read_header(path: Path) -> tuple[dict, dict]:
    """The safetensors header, checked: JSON of known dtypes whose byte ranges lie inside the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path.name}: corrupt safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise WeightsError(f"{path.name}: corrupt safetensors header (declares {n} header bytes in a "
                               f"{size}-byte file); the download is probably truncated or not safetensors")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            raise WeightsError(f"{path.name}: corrupt safetensors header (not JSON: {e})") from e
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data = size - 8 - n
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            elements = math.prod(int(d) for d in shape)
        except (TypeError, KeyError, ValueError) as e:
            raise WeightsError(f"{path.name}: corrupt safetensors header entry for '{name}'") from e
        if dtype not in SAFETENSORS_DTYPES:
            raise WeightsError(f"{path.name}: tensor '{name}' has unsupported dtype {dtype}")
        nbytes = elements * torch.empty((), dtype=SAFETENSORS_DTYPES[dtype]).element_size()
        if not (0 <= begin <= end <= data) or end - begin != nbytes:
            raise WeightsError(f"{path.name}: corrupt safetensors header: '{name}' bytes [{begin}, {end}) do not "
                               f"fit its shape {shape} or the file's {data} data bytes (truncated download?)")
    return header, metadata


# --- the regular Hadamard rotation of ConvRot -------------------------------------------------------

def hadamard(group: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The normalized regular Hadamard H4^(x log4 g) / sqrt(g): symmetric, H H = I (not Sylvester/Walsh)."""
    if group < 4 or 4 ** round(math.log(group, 4)) != group:
        raise ValueError(f"ConvRot group size must be a power of 4 (>= 4), got {group}")
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h = h4
    while h.shape[0] < group:
        h = torch.kron(h, h4)
    return (h / math.sqrt(group)).to(dtype)


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x's last axis rotated by H in contiguous groups of `group` (in x's dtype; H is symmetric)."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"ConvRot group {group} does not divide {k} input features")
    h = hadamard(group, x.dtype).to(x.device)
    return torch.matmul(x.reshape(-1, k // group, group), h).reshape(x.shape)


def rotate_weight(w: torch.Tensor, group: int) -> torch.Tensor:
    """A weight [N, K] rotated offline, W.reshape(N, K/g, g) @ Hᵀ in w's dtype (doc section 4). Equal to
    rotate() in exact math; written with Hᵀ as kitchen's _rotate_weight is, because BLAS takes another
    path for a transposed operand and small-N f32 results then differ in the last bit."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"ConvRot group {group} does not divide {k} input features")
    return torch.matmul(w.reshape(n, k // group, group), hadamard(group, w.dtype).to(w.device).t()).reshape(n, k)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row INT8 as ComfyUI quantizes: s = max(absmax/127, 1e-30) in f32, q = clamp(round(x / s), -128, 127)
    with the division in x's dtype (so -128 can occur). Returns (int8 codes, f32 scales [..., 1])."""
    absmax = x.abs().amax(dim=-1, keepdim=True).float()
    # A tensor divisor: CUDA torch turns division by a Python scalar into a multiply by its reciprocal, which is
    # not correctly rounded and changes some rows' scales (seen on an H200); the CPU divides exactly either way.
    scale = (absmax / torch.full_like(absmax, 127.0)).clamp(min=1e-30)
    divisor = scale.to(x.dtype)
    divisor = torch.where(divisor == 0, torch.full_like(divisor, torch.finfo(x.dtype).tiny), divisor)
    return (x / divisor).round_().clamp_(-128, 127).to(torch.int8), scale


def quantize_convrot(weight: torch.Tensor, group: int = CONVROT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] as INT8 ConvRot codes and f32 row scales [N, 1], rotated in the weight's dtype."""
    return quantize_rows(rotate_weight(weight, group))


def dequantize_convrot(codes: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """INT8 codes times their row scales, rotated back to the native basis (f32); group 0: not rotated."""
    w = codes.float() * scale.float().reshape(-1, 1) if scale.numel() > 1 else codes.float() * scale.float()
    return rotate_weight(w, group) if group else w


def convrot_group_for(k: int, preferred: int = CONVROT_GROUP) -> int:
    """The largest power-of-4 group <= preferred that divides k (0 if none: the linear then stays float)."""
    g = preferred
    while g >= 4:
        if k % g == 0:
            return g
        g //= 4
    return 0


# --- one linear as stored -------------------------------------------------------------------------------

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

    def as_int8(self, group: int = CONVROT_GROUP) -> Linear:
        """INT8 ConvRot of this linear (Block.quantized): float weights rotated and quantized, f32 master
        first; already-INT8 linears unchanged; a K that no power-of-4 group divides stays float."""
        if self.quantized:
            return self
        g = convrot_group_for(self.in_features, group)
        if not g:
            return self
        codes, scale = quantize_convrot(self.weight.float(), g)
        return replace(self, weight=codes, scale=scale, group=g)

    def as_float(self, dtype: torch.dtype = torch.bfloat16) -> Linear:
        """This linear with float weights of dtype (Block.dequantized)."""
        return Linear(self.dequantized().to(dtype), self.bias, None, 0)

    def rows(self, index: torch.Tensor) -> Linear:
        """The linear with output rows reordered/selected by index (rows move with their scales and biases;
        ConvRot acts on inputs, so no requantization)."""
        scale = self.scale
        if scale is not None and scale.numel() > 1:
            scale = scale.reshape(-1, 1)[index]
        bias = None if self.bias is None else self.bias[index]
        return replace(self, weight=self.weight[index], bias=bias, scale=scale)


def stack_rows(parts: list[Linear]) -> Linear:
    """Linears of one input stacked by output rows (QKV fusion, [gate; up]); formats must agree."""
    first = parts[0]
    if any(p.quantized != first.quantized or p.group != first.group for p in parts):
        parts = [p.as_float(torch.float32) for p in parts]
        first = parts[0]
    weight = torch.cat([p.weight for p in parts])
    scale = None
    if first.quantized:
        scale = torch.cat([p.scale.reshape(-1, 1).expand(p.out_features, 1) for p in parts])
    biases = [p.bias for p in parts]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else torch.zeros(p.out_features, dtype=torch.float32)
                          for b, p in zip(biases, parts)])
    return Linear(weight, bias, scale, first.group)


def glu_rows(gate: torch.Tensor | Linear, up: torch.Tensor | Linear):
    """[gate; up] interleaved as UP holds them: gate j at row 2j, up j at 2j + 1 (seed 000 gluRows)."""
    if isinstance(gate, Linear):
        both = stack_rows([gate, up])
        n = gate.out_features
        order = torch.stack([torch.arange(n), torch.arange(n) + n], dim=1).reshape(-1)
        return both.rows(order)
    return torch.stack([gate, up], dim=1).reshape(-1, *gate.shape[1:])


def _marker(ckpt: Checkpoint, layer: str, file_markers: dict[str, dict]) -> dict | None:
    key = f"{layer}.comfy_quant"
    if key in ckpt:
        raw = bytes(ckpt.get(key).to(torch.uint8).tolist()).rstrip(b"\x00")
        try:
            marker = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise WeightsError(f"{ckpt.path.name}: '{key}' is not a JSON quantization marker ({e})") from e
    else:
        marker = file_markers.get(layer)
    if marker is None:
        return None
    if not isinstance(marker, dict) or "format" not in marker:
        raise WeightsError(f"{ckpt.path.name}: quantization marker of '{layer}' has no 'format'")
    params = marker.get("params")
    # ComfyUI ops._load_quantized_module reads each key at the top level first, then under "params".
    return {**params, **marker} if isinstance(params, dict) else marker


def _legacy_fp8_marker(ckpt: Checkpoint) -> bool:
    return any(k == "scaled_fp8" or k.endswith(".scaled_fp8") for k in ckpt.keys())


def read_linear(ckpt: Checkpoint, layer: str, file_markers: dict[str, dict] | None = None) -> Linear:
    """Linear `layer` (the full key prefix, without `.weight`) as stored, FP8 turned into INT8 ConvRot and
    W4A8 decoded to INT8 codes."""
    if file_markers is None:
        file_markers = ckpt.quantization_markers()
    name = ckpt.path.name
    w_key, b_key = f"{layer}.weight", f"{layer}.bias"
    weight = ckpt.get(w_key)
    bias = ckpt.get(b_key).float() if b_key in ckpt else None
    marker = _marker(ckpt, layer, file_markers)
    fmt = marker["format"] if marker else None
    if fmt == "int8_tensorwise":
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise WeightsError(f"{name}: '{w_key}' is marked int8_tensorwise but is {weight.dtype} "
                               f"{tuple(weight.shape)}, expected int8 [out, in]")
        scale_key = f"{layer}.weight_scale"
        if scale_key not in ckpt:
            raise WeightsError(f"{name}: INT8 layer '{layer}' has no '{scale_key}'")
        scale = ckpt.get(scale_key).float()
        if scale.numel() not in (1, weight.shape[0]):
            raise WeightsError(f"{name}: '{scale_key}' has {scale.numel()} values, expected 1 or "
                               f"{weight.shape[0]} (one per output row)")
        scale = scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
        try:
            group = int(marker.get("convrot_groupsize", CONVROT_GROUP)) if marker.get("convrot") else 0
            if group:
                hadamard(group)  # rejects sizes that are not powers of 4
        except (TypeError, ValueError) as e:
            raise WeightsError(f"{name}: INT8 layer '{layer}' has a bad convrot_groupsize ({e})") from e
        if group and weight.shape[1] % group:
            raise WeightsError(f"{name}: ConvRot group {group} does not divide the {weight.shape[1]} "
                               f"inputs of '{layer}'")
        return Linear(weight, bias, scale, group)
    if fmt == "asym_w4a8_int8":
        from .w4a8 import decode_w4a8
        return decode_w4a8(ckpt, layer, marker, bias)
    if weight.dtype in FP8_DTYPES:
        return _fp8_as_int8(ckpt, layer, weight, bias)
    if fmt is not None and not fmt.startswith("float8"):
        raise WeightsError(f"{name}: layer '{layer}' has quantization format '{fmt}', which this loader does "
                           f"not read (INT8 ConvRot, FP8 and asym_w4a8_int8 are supported)")
    if weight.dtype not in FLOAT_DTYPES or weight.dim() != 2:
        raise WeightsError(f"{name}: '{w_key}' is {weight.dtype} {tuple(weight.shape)} without a quantization "
                           f"marker; expected a float [out, in] weight")
    return Linear(weight, bias)


def _fp8_as_int8(ckpt: Checkpoint, layer: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    """Scaled FP8 (new `weight_scale` or legacy `scale_weight` with a `scaled_fp8` marker), dequantized in f32
    and requantized to INT8 ConvRot: as BF16 it would take twice the memory."""
    scale = torch.ones(())
    for key in (f"{layer}.weight_scale", f"{layer}.scale_weight"):
        if key in ckpt:
            scale = ckpt.get(key).float()
            break
    w = weight.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale)
    return Linear(w, bias).as_int8()


def read_tensor(ckpt: Checkpoint, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A plain (non-linear) tensor as f32, its shape checked when given."""
    t = ckpt.get(key)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise WeightsError(f"{ckpt.path.name}: '{key}' has shape {tuple(t.shape)}, expected {tuple(shape)}; "
                           f"the file is of another model size or family")
    if t.dtype in FP8_DTYPES:
        scale_key = key.rsplit(".", 1)[0] + ".weight_scale"
        return t.float() * (ckpt.get(scale_key).float() if scale_key in ckpt else 1.0)
    return t.float()


class TensorSource(Checkpoint):
    """Tensors already in memory behind Checkpoint's interface (benchmarks on random weights, converters)."""

    def __init__(self, tensors: dict[str, torch.Tensor], name: str = "in-memory"):
        self.path = Path(name)
        self.tensors = tensors
        self.header = {k: {"shape": list(v.shape)} for k, v in tensors.items()}
        self.metadata = {}

    def dtype(self, name: str) -> torch.dtype:
        return self.get(name).dtype

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        return self.tensors[name]

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Tensor name's bytes copied into out (uint8 of its size), as Checkpoint.read_into reads a file's."""
        t = self.get(name).contiguous().reshape(-1).view(torch.uint8)
        if out.dtype != torch.uint8 or out.numel() != t.numel():
            raise ValueError(f"{self.path.name}: '{name}' holds {t.numel()} bytes; read_into needs a uint8 "
                             f"tensor of that size, got {out.dtype} [{out.numel()}]")
        out.copy_(t)
