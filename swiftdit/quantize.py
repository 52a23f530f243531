"""Offline tool: a BF16/F16/F32 safetensors checkpoint -> INT8 ConvRot in ComfyUI's own layout.

    swiftdit quantize IN.safetensors OUT.safetensors [--group 256] [--skip PATTERN ...] [--overwrite]

Which tensors are quantized: every 2-D float `<L>.weight` whose in-features K the ConvRot group divides,
except names containing a skip pattern (plain substrings; default: 'embed', 'pad_token', 'norm', which
keeps embedders, pad tokens and norm/adaLN-norm weights in full precision). `--skip` replaces the default
list; `--skip` with no pattern quantizes them all. Each quantized layer is written exactly as ComfyUI
`ops._quantized_weight_state_dict` writes it (reference/int8_convrot_format.md sections 1-2):
`<L>.weight` int8 [N, K], `<L>.weight_scale` f32 [N, 1], `<L>.comfy_quant` uint8 JSON
`{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": g}`. Every other tensor is copied
byte for byte with its dtype, and the header's `__metadata__` is kept. Weights are rotated and quantized
from an f32 master (section 5). The output is streamed to a temporary file beside OUT and renamed at the end,
so memory stays at one layer and an interrupted run never leaves a half-written OUT.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

import torch

from dit_core.weights import SAFETENSORS_DTYPES, Checkpoint, WeightsError, hadamard, quantize_convrot

DEFAULT_SKIP = ("embed", "pad_token", "norm")
QUANTIZABLE = (torch.bfloat16, torch.float16, torch.float32)


def marker_bytes(group: int) -> torch.Tensor:
    """ComfyUI's `.comfy_quant` tensor: json.dumps with default separators, stored as uint8 bytes."""
    conf = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def linear_layers(ckpt: Checkpoint, group: int, skip=DEFAULT_SKIP) -> list[str]:
    """Layer prefixes to quantize: 2-D float `.weight`s with K % group == 0 and no skip pattern in the name."""
    layers = []
    for key in ckpt.header:
        shape = ckpt.shape(key)
        if (key.endswith(".weight") and len(shape) == 2 and shape[0] > 0 and shape[1] % group == 0
                and ckpt.dtype(key) in QUANTIZABLE and not any(p in key for p in skip)):
            layers.append(key[: -len(".weight")])
    return layers


def quantize_file(src, dst, group: int = 256, skip=DEFAULT_SKIP, overwrite: bool = False,
                  device: str | torch.device = "cpu") -> list[str]:
    """Write dst, the INT8 ConvRot version of src; returns the quantized layer prefixes. device: where each weight
    is rotated and quantized (a GPU takes a 6 B model in seconds)."""
    src, dst = Path(src), Path(dst)
    hadamard(group)  # ValueError unless a power of 4
    if dst.suffix.lower() not in (".safetensors", ".sft"):
        raise WeightsError(f"{dst.name}: the output must be a .safetensors file")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{dst}: already exists; pass --overwrite (overwrite=True) to replace it")
    ckpt = Checkpoint(src)
    layers = linear_layers(ckpt, group, tuple(skip))
    marker = marker_bytes(group)
    # The header lists every output tensor up front: name -> (safetensors dtype, shape).
    entries = {key: (ckpt.header[key]["dtype"], ckpt.shape(key)) for key in ckpt.header}
    for layer in layers:
        n, k = ckpt.shape(f"{layer}.weight")
        for extra in (f"{layer}.weight_scale", f"{layer}.comfy_quant"):
            if extra in entries:
                raise WeightsError(f"{src.name}: '{extra}' already exists beside the float weight of '{layer}'")
        entries[f"{layer}.weight"] = ("I8", (n, k))
        entries[f"{layer}.weight_scale"] = ("F32", (n, 1))
        entries[f"{layer}.comfy_quant"] = ("U8", (marker.numel(),))
    quantized = set(layers)
    with streamed_safetensors(dst, entries, ckpt.metadata) as put:
        for key in ckpt.header:
            layer = key[: -len(".weight")]
            if key.endswith(".weight") and layer in quantized:
                # f32 master (doc section 5)
                codes, scale = quantize_convrot(ckpt.get(key).to(device, torch.float32), group)
                put(key, codes.cpu())
                put(f"{layer}.weight_scale", scale.cpu())
                put(f"{layer}.comfy_quant", marker)
            else:
                put(key, ckpt.get(key))
    return layers


@contextlib.contextmanager
def streamed_safetensors(dst: Path, entries: dict, metadata: dict):
    """Yield put(name, tensor), which writes each tensor at its planned offset of a safetensors file: 8-byte
    little-endian header size, JSON header padded with spaces to 8 bytes, then the data without holes.
    Larger elements come first so that every tensor is aligned to its element size (the safetensors
    library's order); writing by offset lets a layer's scales and codes be produced together.
    The file is a temporary beside dst until every tensor is in, then renamed over dst."""
    order = sorted(entries, key=lambda key: (-_itemsize(entries[key][0]), key))
    header, offset = {}, 0
    for key in order:
        dtype, shape = entries[key]
        nbytes = _itemsize(dtype) * torch.Size(shape).numel()
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    base = 8 + len(text)
    written = set()
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(base + offset)

            def put(key: str, t: torch.Tensor) -> None:
                dtype, shape = entries[key]
                if t.dtype != SAFETENSORS_DTYPES[dtype] or tuple(t.shape) != tuple(shape):
                    raise WeightsError(f"'{key}' came out {t.dtype} {tuple(t.shape)}, planned {dtype} {shape}")
                f.seek(base + header[key]["data_offsets"][0])
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
                written.add(key)

            yield put
            if len(written) != len(entries):
                raise WeightsError(f"{dst.name}: {len(entries) - len(written)} tensors were never written")
        mask = os.umask(0)  # mkstemp's 0600 -> what a file the user saves gets (reading the umask sets it)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise


def _itemsize(st_dtype: str) -> int:
    return torch.empty((), dtype=SAFETENSORS_DTYPES[st_dtype]).element_size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swiftdit quantize", description=__doc__.split("\n")[0])
    parser.add_argument("src", help="BF16/F16/F32 .safetensors checkpoint")
    parser.add_argument("dst", help="output .safetensors (INT8 ConvRot, ComfyUI layout)")
    parser.add_argument("--group", type=int, default=256, help="ConvRot group size, a power of 4 (default 256)")
    parser.add_argument("--skip", nargs="*", default=None, metavar="PATTERN",
                        help=f"name substrings kept in full precision (default: {' '.join(DEFAULT_SKIP)})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    args = parser.parse_args(argv)
    skip = DEFAULT_SKIP if args.skip is None else tuple(args.skip)
    try:
        layers = quantize_file(args.src, args.dst, args.group, skip, args.overwrite)
    except (WeightsError, FileExistsError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.dst}: {len(layers)} linears quantized to INT8 ConvRot (group {args.group})")
    return 0

