"""ComfyUI `nvfp4` weights decoded to f32 and requantized to INT8 ConvRot (as scaled FP8 is: the INT8 path, half
of BF16's memory). NVFP4-AWQ files (MiniMax H3's text encoder) add a per-input `pre_quant_scale`.

Layout and decode rule, from comfy-kitchen 0.2.40 (`tensor/nvfp4.py` TensorCoreNVFP4Layout, the eager
`dequantize_nvfp4`, `float_utils.from_blocked`) and ComfyUI's ops (`QUANT_ALGOS["nvfp4"]`, `Linear.forward`):
- `weight` uint8 [N, K/2] (N and K padded to 16): E2M1 codes, two a byte, the even column in the high nibble;
- `weight_scale` float8_e4m3fn (raw bytes allowed): one scale a 16-code block, [N, K/16] stored in cuBLAS's
  block-scaling layout (128 x 4 tiles, each as 32 rows of 16 bytes);
- `weight_scale_2` f32: the tensor's scale, W = e2m1 * weight_scale * weight_scale_2;
- `pre_quant_scale` [K], optional: the input is multiplied by it before the product, y = (x * s) W^T, so here it
  is folded into W's columns (W s). `input_scale` only quantizes activations on Blackwell's FP4 products.
"""
from __future__ import annotations

import torch

from .checkpoint import FLOAT_DTYPES, layer_reader
from .linear import Linear, computed_on

BLOCK = 16  # codes sharing a block scale (QUANT_ALGOS["nvfp4"]["group_size"])
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
DECODE_ELEMENTS = 1 << 22  # decoded per chunk: caps the f32 working set of large layers
TILE_ROWS, TILE_COLS = 128, 4


def unswizzle_block_scales(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] block scales from cuBLAS's layout (its padded 128 x 4 tiles, in tile order; tile element (r, c)
    at byte (r % 32, 4 * (r // 32) + c) of the tile's 32 x 16)."""
    row_tiles, col_tiles = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    tiles = scales.reshape(row_tiles, col_tiles, 32, 4, TILE_COLS)  # r % 32, r // 32, c
    return tiles.permute(0, 3, 2, 1, 4).reshape(row_tiles * TILE_ROWS, col_tiles * TILE_COLS)[:rows, :cols]


def decode_nvfp4(ckpt, layer: str, marker: dict, bias: torch.Tensor | None,
                 compute_on: torch.device | None = None, placed_on: torch.device | None = None) -> Linear:
    """Linear `layer` of an `nvfp4` layer (AWQ's pre_quant_scale folded in) as INT8 ConvRot, computed on
    compute_on (linear.computed_on, as placed_on asks)."""
    bad, need = layer_reader(ckpt, layer, "NVFP4", "nvfp4 stores weight, weight_scale and weight_scale_2")
    packed, block_scales, tensor_scale = need("weight"), need("weight_scale"), need("weight_scale_2")
    pre_key = f"{layer}.pre_quant_scale"
    pre = ckpt.get(pre_key) if pre_key in ckpt else None
    if packed.dtype not in (torch.uint8, torch.int8) or packed.dim() != 2:
        raise bad(f"weight is {packed.dtype} {tuple(packed.shape)}, expected uint8 [out, in/2]")
    n, k = packed.shape[0], packed.shape[1] * 2
    if block_scales.dtype in (torch.uint8, torch.int8):  # FP8 stored as raw bytes, as ComfyUI views them
        block_scales = block_scales.view(torch.float8_e4m3fn)
    tiled = -(-n // TILE_ROWS) * TILE_ROWS * -(-(k // BLOCK) // TILE_COLS) * TILE_COLS
    if block_scales.dtype != torch.float8_e4m3fn or block_scales.numel() != tiled or k % BLOCK:
        raise bad(f"weight_scale is {block_scales.dtype} {tuple(block_scales.shape)}, expected float8_e4m3fn "
                  f"with {tiled} values (the [{n}, {k // BLOCK}] block scales in cuBLAS's 128 x 4 tiles)")
    if tensor_scale.numel() != 1 or not tensor_scale.is_floating_point():
        raise bad(f"weight_scale_2 is {tensor_scale.dtype} {tuple(tensor_scale.shape)}, expected one f32 value")
    if pre is not None and (pre.numel() != k or pre.dtype not in FLOAT_DTYPES):
        raise bad(f"pre_quant_scale is {pre.dtype} {tuple(pre.shape)}, expected a float [{k}] (one an input)")

    def make(device: torch.device) -> Linear:
        return Linear(nvfp4_weight(packed.to(device), block_scales.to(device), tensor_scale.to(device),
                                   None if pre is None else pre.to(device)), bias).as_int8()
    return computed_on(compute_on, make, packed.device, placed_on)


def nvfp4_weight(packed: torch.Tensor, block_scales: torch.Tensor, tensor_scale: torch.Tensor,
                 pre_quant_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The f32 weight [N, K] of NVFP4 codes [N, K/2], their block scales (cuBLAS's layout) and tensor scale,
    times pre_quant_scale along K where given; in row chunks of DECODE_ELEMENTS. Each byte's high nibble is the
    even column, its low the odd (kitchen's hi_first)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    scales = unswizzle_block_scales(block_scales, n, k // BLOCK).float() * tensor_scale.float()
    levels, step = E2M1.to(packed.device), max(1, DECODE_ELEMENTS // k)
    rows = []
    for r in range(0, n, step):
        raw = packed[r:r + step].view(torch.uint8).to(torch.int32)
        codes = torch.stack([raw >> 4, raw & 0xF], dim=-1).reshape(raw.shape[0], -1)
        rows.append((levels[codes].reshape(raw.shape[0], -1, BLOCK) * scales[r:r + step].unsqueeze(-1))
                    .reshape(raw.shape[0], k))
    weight = torch.cat(rows) if rows else torch.empty(0, k)
    return weight * pre_quant_scale.float() if pre_quant_scale is not None else weight
