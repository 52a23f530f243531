"""Each linear read as stored, through one table of stored formats (detected from tensors, dtypes and markers, never
from file names: reference/int8_convrot_format.md, ComfyUI's quantized formats): BF16/F16/F32 as they are,
INT8 ConvRot codes with row scales, W4A8 decoded to INT8 codes, scaled FP8 and NVFP4 requantized to INT8 ConvRot."""
from __future__ import annotations

import json
from collections.abc import Callable

import torch

from .checkpoint import FLOAT_DTYPES, FP8_DTYPES, Checkpoint, WeightsError, moved_to
from .convrot import CONVROT_GROUP, hadamard
from .linear import Linear, computed_on
from .nvfp4 import decode_nvfp4
from .w4a8 import decode_w4a8


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


def read_linear(ckpt: Checkpoint, layer: str, file_markers: dict[str, dict] | None = None,
                compute_on: torch.device | None = None, placed_on: torch.device | None = None,
                fp8_as: torch.dtype | None = None) -> Linear:
    """Linear `layer` (the full key prefix, without `.weight`) as stored, FP8 and NVFP4 turned into INT8 ConvRot
    (computed on compute_on and brought back to the host, or kept there where that is placed_on, the device the
    caller puts the linear on: linear.computed_on) and W4A8 decoded to INT8 codes. fp8_as: a float dtype a caller
    that runs its linears as floats takes scaled FP8 ones in, dequantized once (no INT8 rounding in between)."""
    if file_markers is None:
        file_markers = ckpt.quantization_markers()
    name = ckpt.path.name
    w_key, b_key = f"{layer}.weight", f"{layer}.bias"
    weight = ckpt.get(w_key)
    bias = ckpt.get(b_key).float() if b_key in ckpt else None
    marker = _marker(ckpt, layer, file_markers)
    fmt = marker["format"] if marker else None
    if fmt in STORED_FORMATS:
        return STORED_FORMATS[fmt](ckpt, layer, weight, bias, marker, compute_on, placed_on)
    if weight.dtype in FP8_DTYPES:
        return _scaled_fp8(ckpt, layer, weight, bias, compute_on, placed_on, fp8_as)
    if fmt is not None and not fmt.startswith("float8"):
        raise WeightsError(f"{name}: layer '{layer}' has quantization format '{fmt}', which this loader does "
                           f"not read ({', '.join(STORED_FORMATS)} and scaled FP8 are supported)")
    if weight.dtype not in FLOAT_DTYPES or weight.dim() != 2:
        raise WeightsError(f"{name}: '{w_key}' is {weight.dtype} {tuple(weight.shape)} without a quantization "
                           f"marker; expected a float [out, in] weight")
    return Linear(weight, bias)


def _int8_convrot(ckpt: Checkpoint, layer: str, weight: torch.Tensor, bias: torch.Tensor | None, marker: dict,
                  compute_on: torch.device | None = None, placed_on: torch.device | None = None) -> Linear:
    """ComfyUI's INT8 ConvRot layer: int8 codes [out, in], f32 scales (one or one a row), the ConvRot group."""
    name, w_key = ckpt.path.name, f"{layer}.weight"
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


def _w4a8(ckpt: Checkpoint, layer: str, weight: torch.Tensor, bias: torch.Tensor | None, marker: dict,
          compute_on: torch.device | None = None, placed_on: torch.device | None = None) -> Linear:
    return decode_w4a8(ckpt, layer, marker, bias)


def _nvfp4(ckpt: Checkpoint, layer: str, weight: torch.Tensor, bias: torch.Tensor | None, marker: dict,
           compute_on: torch.device | None = None, placed_on: torch.device | None = None) -> Linear:
    return decode_nvfp4(ckpt, layer, marker, bias, compute_on, placed_on)


# The stored formats a quantization marker names -> the reader of such a layer (scaled FP8 is told by its dtype).
STORED_FORMATS: dict[str, Callable[..., Linear]] = {"int8_tensorwise": _int8_convrot, "asym_w4a8_int8": _w4a8,
                                                    "nvfp4": _nvfp4}


def _scaled_fp8(ckpt: Checkpoint, layer: str, weight: torch.Tensor, bias: torch.Tensor | None,
                 on: torch.device | None = None, placed_on: torch.device | None = None,
                 as_float: torch.dtype | None = None) -> Linear:
    """Scaled FP8 (new `weight_scale` or legacy `scale_weight` with a `scaled_fp8` marker), dequantized in f32
    and requantized to INT8 ConvRot (as BF16 it would take twice the memory), or taken as the float dtype as_float,
    computed on `on`."""
    scale = torch.ones(())
    for key in (f"{layer}.weight_scale", f"{layer}.scale_weight"):
        if key in ckpt:
            scale = ckpt.get(key).float()
            break

    def make(device: torch.device) -> Linear:
        s = scale.to(device)
        # To a card as the loads carry a file's tensors (read from the file, not through its map), converted there.
        w = moved_to(weight, device, (ckpt, f"{layer}.weight")).float() * (s.reshape(-1, 1) if s.numel() > 1 else s)
        return Linear(w.to(as_float), bias) if as_float is not None else Linear(w, bias).as_int8()
    return computed_on(on, make, weight.device, placed_on)


