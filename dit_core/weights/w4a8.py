"""ComfyUI `asym_w4a8_int8` weights (4-bit codebook or 6-bit uniform codes) decoded to INT8 ConvRot linears.

Layout and decode rule: reference/int8_convrot_format.md section 9, checked against comfy-kitchen 0.2.40
(`tensor/w4a8_int8.py` AsymW4A8Int8Layout, `tensor/w4a8_packed.py` _unpack_codes,
`backends/eager/w4a8_int8.py` _dequant_int4_grouped_to_int8). Every kitchen backend decodes the packed codes
to this same INT8 grid and then runs the INT8 ConvRot linear with s_w = weight_s_channel, so the decoded
Linear is the layer itself, not an approximation of it.
"""
from __future__ import annotations

import torch

from .checkpoint import FLOAT_DTYPES, layer_reader
from .convrot import hadamard
from .linear import Linear

W4A8_GROUP = 16  # ComfyUI ops._load_quantized_module: group_size defaults to 16
CONVROT_GROUP = 256  # ... and convrot_groupsize to 256
DECODE_ELEMENTS = 1 << 22  # decoded per chunk: caps the f32 working set of large layers


def decode_w4a8(ckpt, layer: str, marker: dict, bias: torch.Tensor | None) -> Linear:
    """Linear `layer` of an `asym_w4a8_int8` file as INT8 ConvRot codes with its f32 row scales."""
    bad, need = layer_reader(ckpt, layer, "W4A8", "asym_w4a8_int8 stores weight, weight_s_rel and weight_s_channel")
    packed = need("weight")
    s_rel = need("weight_s_rel")
    s_channel = need("weight_s_channel")
    cb_key = f"{layer}.weight_codebook"
    codebook = ckpt.get(cb_key) if cb_key in ckpt else None
    try:
        group = int(marker.get("group_size", W4A8_GROUP))
        rot = int(marker.get("convrot_groupsize", CONVROT_GROUP))
    except (TypeError, ValueError) as e:
        raise bad(f"has a marker with a non-integer group size ({e})") from e

    if packed.dtype not in (torch.int8, torch.uint8) or packed.dim() != 2:
        raise bad(f"weight is {packed.dtype} {tuple(packed.shape)}, expected packed int8 [out, in*bits/8]")
    # ComfyUI views U8 scales as e4m3fn (fp8 stored as raw bytes); kitchen also accepts f32 scales.
    if s_rel.dtype == torch.uint8:
        s_rel = s_rel.view(torch.float8_e4m3fn)
    if s_rel.dtype not in (torch.float8_e4m3fn, *FLOAT_DTYPES) or s_rel.dim() != 2:
        raise bad(f"weight_s_rel is {s_rel.dtype} {tuple(s_rel.shape)}, expected float8_e4m3fn [out, in/group]")
    n, cols = packed.shape
    if group < 2 or group % 2:
        raise bad(f"has group_size {group}; it must be even (two codes share a byte's group)")
    k = s_rel.shape[1] * group  # kitchen _w4a8_geometry: K from the scale grid, bits from the row width
    bits = cols * 8 // k if k else 0
    if s_rel.shape[0] != n or bits not in (4, 6) or k * bits != cols * 8 or (bits == 6 and k % 4):
        raise bad(f"weight {tuple(packed.shape)} and weight_s_rel {tuple(s_rel.shape)} do not match "
                  f"4-bit [N, K/2] or 6-bit [N, 3K/4] codes with group_size {group}")
    if s_channel.numel() != n or not s_channel.is_floating_point():
        raise bad(f"weight_s_channel is {s_channel.dtype} {tuple(s_channel.shape)}, expected f32 [{n}]")
    if codebook is not None and (codebook.numel() != 16 or not codebook.is_floating_point() or bits == 6):
        raise bad(f"weight_codebook is {codebook.dtype} {tuple(codebook.shape)}, expected f32 [16] "
                  f"(and none at 6 bits)")
    try:
        hadamard(rot)
    except ValueError as e:
        raise bad(f"has convrot_groupsize {rot}: {e}") from e
    if k % rot:
        raise bad(f"has convrot_groupsize {rot}, which does not divide its {k} inputs")

    levels = None if codebook is None else codebook.float().reshape(16)
    scales = s_rel.float()
    step = max(1, DECODE_ELEMENTS // k)
    codes = torch.cat([_decode_rows(packed[r:r + step], scales[r:r + step], levels, k, bits, group)
                       for r in range(0, n, step)]) if n else torch.empty(0, k, dtype=torch.int8)
    return Linear(codes, bias, s_channel.float().reshape(n, 1), rot)


def unpack_codes(packed: torch.Tensor, k: int, bits: int) -> torch.Tensor:
    """Unsigned codes [N, K] (int32) from kitchen's packing: a K/2-byte nibble plane, even column = low
    nibble; at 6 bits then a K/4-byte plane of the top 2 bits (column c: byte c//4, bits 2*(c % 4))."""
    raw = packed.view(torch.uint8).to(torch.int32)  # bytes, not signed int8: no sign extension
    low = raw[:, : k // 2]
    codes = torch.stack([low & 0xF, low >> 4], dim=-1).reshape(-1, k)
    if bits == 6:
        high = raw[:, k // 2:].unsqueeze(-1) >> torch.tensor([0, 2, 4, 6], dtype=torch.int32)
        codes = codes | ((high & 0x3).reshape(-1, k) << 4)
    return codes


def _decode_rows(packed, scales, levels, k, bits, group) -> torch.Tensor:
    """w8 = clamp(round(level * s_rel[n, k // group]), -127, 127) in f32 with half-to-even rounding, as
    kitchen's _dequant_int4_grouped_to_int8 and its Triton twin (rint) compute it."""
    codes = unpack_codes(packed, k, bits)
    if levels is not None:
        values = levels[codes]
    else:
        # No codebook: uniform codes around mid-range, code - 8 (4-bit) or code - 32 (6-bit). ComfyUI passes
        # codebook=None when the file has no weight_codebook, and kitchen never substitutes its default LUT
        # (kitchen's quantizer stores the LUT whenever it used one).
        values = (codes - (1 << (bits - 1))).float()
    values = values.reshape(-1, k // group, group) * scales.unsqueeze(-1)
    return values.reshape(-1, k).round_().clamp_(-127, 127).to(torch.int8)
