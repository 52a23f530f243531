"""Qwen3-VL's pictures inside a prompt: the vision tower read from a file, a picture's size and patches as ComfyUI
prepares them, where its rows go in the prompt (mRoPE positions on the t, h, w axes) and the rows it gives (merged
rows and DeepStack features). Krea 2's style reference and MiniMax H3's keyframe and reference pictures read them
(qwen3_vl.py's encoders)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_linear, read_tensor
from .loading import converted_on, transformers_class

if TYPE_CHECKING:
    from transformers import Qwen3VLVisionModel

# Qwen3-VL's vision tokens (transformers' Qwen3VLConfig; the same ids in ComfyUI's qwen25_tokenizer).
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = 151652, 151653, 151655, 151656
# Picture preprocessing as ComfyUI's Qwen3VL.preprocess_embed calls comfy/text_encoders/qwen_vl.py
# process_qwen2vl_images: resized (bilinear) so each side is a multiple of patch x merge, with at least MIN and at
# most MAX pixels, then mapped from [0, 1] to [-1, 1]. diffusers' Qwen3-VL processor keeps the same grid rule with
# other bounds (65536, 16777216 pixels) and resizes bicubic from 8-bit pixels; on H3's canvases (sides multiples of
# 32, under 1 MP) neither resizes, and both agree.
VISION_MIN_PIXELS, VISION_MAX_PIXELS = 3136, 12845056
VISION_MEAN, VISION_STD = 0.5, 0.5
VISION_ROOTS = ("visual.", "model.visual.")  # ComfyUI's layout; transformers' Qwen3VLForConditionalGeneration


class VisionRows(NamedTuple):
    """Pictures inside a prompt: rows [L] bool (the rows they take), embeds [n, hidden] (the vision tower's merged
    rows, in row order) and deepstack (one [n, hidden] a DeepStack merger, added after decoder layers 0, 1, ...)."""
    rows: torch.Tensor
    embeds: torch.Tensor
    deepstack: list[torch.Tensor]


def picture_size(height: int, width: int, factor: int, min_pixels: int = VISION_MIN_PIXELS,
                 max_pixels: int = VISION_MAX_PIXELS) -> tuple[int, int]:
    """(height, width) a picture is resized to before patching: each side rounded to a multiple of factor, then,
    if outside [min_pixels, max_pixels], both sides scaled by one factor (down with floor, up with ceil) to fit
    (Qwen2-VL's smart_resize, as ComfyUI's process_qwen2vl_images applies it)."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def picture_patches(image: torch.Tensor, patch: int, temporal_patch: int, merge: int) -> tuple[torch.Tensor,
                                                                                               tuple[int, int]]:
    """A ComfyUI IMAGE [1, H, W, C] in [0, 1] -> (patches [gh * gw, 3 * temporal_patch * patch^2], (gh, gw)): the
    picture resized (picture_size), normalized, repeated over the temporal patch (a still picture) and cut into
    patches, those of each merge x merge block consecutive (the vision tower's merger reads them so). A video's
    group of temporal_patch frames [temporal_patch, H, W, C] fills the temporal patch instead (ComfyUI's
    process_video_block: the same resize and normalization)."""
    if image.dim() != 4 or image.shape[0] not in (1, temporal_patch) or image.shape[-1] < 3:
        raise ValueError(f"MiniMax H3 pictures are IMAGE tensors [1, H, W, 3], got {tuple(image.shape)}")
    height, width = image.shape[1:3]
    h, w = picture_size(height, width, patch * merge)
    pixels = image[..., :3].permute(0, 3, 1, 2).float()
    pixels = F.interpolate(pixels, size=(h, w), mode="bilinear", align_corners=False)
    pixels = ((pixels - VISION_MEAN) / VISION_STD).expand(temporal_patch, -1, -1, -1)  # [T, C, h, w]
    gh, gw = h // patch, w // patch
    blocks = pixels.reshape(temporal_patch, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    blocks = blocks.permute(2, 5, 3, 6, 1, 0, 4, 7)  # (block row, block col, row in block, col in block, C, T, p, p)
    return blocks.reshape(gh * gw, 3 * temporal_patch * patch * patch), (gh, gw)


def load_vision_tower(ckpt: Checkpoint, dtype: torch.dtype, device: str | torch.device, heads: int,
                      deepstack_layers: tuple[int, ...], out_hidden: int,
                      convert_on: torch.device | None = None) -> Qwen3VLVisionModel | None:
    """transformers' Qwen3-VL vision tower of a file (under one of VISION_ROOTS), sizes from its tensors, built on
    meta and given the stored tensors as dtype on device; None when the file has none; WeightsError unless its rows
    are out_hidden wide (the text model's). heads and deepstack_layers are not in the tensors: the caller's
    (Qwen3-VL-32B's: H3_VISION_HEADS, H3_DEEPSTACK_LAYERS). convert_on: where FP8 and NVFP4 linears convert (by
    default on device where it is a GPU: loading.converted_on)."""
    root = next((r for r in VISION_ROOTS if f"{r}patch_embed.proj.weight" in ckpt), None)
    if root is None:
        return None
    name = ckpt.path.name
    hidden, channels, temporal_patch, patch, _ = ckpt.shape(f"{root}patch_embed.proj.weight")
    numbered = re.compile(re.escape(root) + r"(blocks|deepstack_merger_list)\.(\d+)\.")
    counts = {"blocks": 0, "deepstack_merger_list": 0}
    for key in ckpt.keys():
        if m := numbered.match(key):
            counts[m.group(1)] = max(counts[m.group(1)], int(m.group(2)) + 1)
    rows_width, merge_dim = ckpt.shape(f"{root}merger.linear_fc2.weight")
    if rows_width != out_hidden:
        raise WeightsError(f"{name}: the vision tower gives rows {rows_width} wide, the text model is {out_hidden} "
                           f"wide")
    merge = math.isqrt(merge_dim // hidden)
    depth = counts["blocks"]
    if (len(deepstack_layers) != counts["deepstack_merger_list"] or max(deepstack_layers, default=0) >= depth
            or hidden % heads or merge * merge * hidden != merge_dim):
        raise WeightsError(f"{name}: vision tower of {depth} blocks {hidden} wide, {counts['deepstack_merger_list']} "
                           f"DeepStack mergers, merger input {merge_dim}: does not fit {heads} heads and DeepStack "
                           f"layers {list(deepstack_layers)} (Qwen3-VL-32B's); another model's vision tower?")
    config = transformers_class("Qwen3VLVisionConfig")(
        depth=depth, hidden_size=hidden, intermediate_size=ckpt.shape(f"{root}blocks.0.mlp.linear_fc1.weight")[0],
        num_heads=heads, in_channels=channels, patch_size=patch, temporal_patch_size=temporal_patch,
        spatial_merge_size=merge, out_hidden_size=out_hidden,
        num_position_embeddings=ckpt.shape(f"{root}pos_embed.weight")[0],
        deepstack_visual_indexes=list(deepstack_layers))
    with torch.device("meta"):
        model = transformers_class("Qwen3VLVisionModel")(config)
    markers = ckpt.quantization_markers()
    state = {}
    for key, meta in model.state_dict().items():
        if isinstance(model.get_submodule(key.rsplit(".", 1)[0]), torch.nn.Linear):
            if key.endswith(".weight"):  # its bias is read with it
                lin = read_linear(ckpt, root + key.removesuffix(".weight"), markers, convert_on or converted_on(device),
                                  device, fp8_as=dtype)
                state[key] = (lin.dequantized() if lin.quantized else lin.weight).to(device, dtype)
                state[key.removesuffix("weight") + "bias"] = lin.bias.to(device, dtype)
        else:
            state[key] = read_tensor(ckpt, root + key, tuple(meta.shape), dtype, device)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise WeightsError(f"{name}: vision tower tensors do not fit a Qwen3-VL vision tower ({e})") from e
    # inv_freq is a non-persistent buffer, still on meta: computed for real, in f32 (as the text model's).
    model.rotary_pos_emb = type(model.rotary_pos_emb)(config)
    return model.to(device).eval()


class PictureLayout(NamedTuple):
    """Token ids with pictures laid out: ids (each picture's one pad made gh * gw pads), positions [3, L] (the mRoPE
    position of each row on the t, h, w axes), vision [L] bool (the pictures' rows) and source [L] (each row's index
    in the ids given)."""
    ids: list[int]
    positions: torch.Tensor
    vision: torch.Tensor
    source: list[int]


def lay_out_pictures(ids: list[int], grids: Sequence[tuple[int, int]],
                     pads: tuple[int, ...] = (IMAGE_PAD_ID,)) -> PictureLayout:
    """The first len(grids) pads of ids (IMAGE_PAD_ID; with VIDEO_PAD_ID in pads, a video's blocks too), in order, each
    made its block's gh * gw pads of its kind (merged grid gh x gw; later pads stay text rows). Positions as transformers' Qwen3VLModel.get_rope_index and ComfyUI's
    qwen2vl_mrope_position_ids give them: a text row at cursor c is (c, c, c) and moves it by 1; a picture's rows
    are (c, c + row, c + column) and move it by max(gh, gw); a video's blocks each so (transformers splits a video's
    grid into blocks of one temporal step each, as its timestamps separate them)."""
    out, positions, vision, source = [], [], [], []
    cursor, pictures = 0, iter(grids)
    text_from = 0  # the first id of the text run not yet laid out

    def text_until(end: int):
        nonlocal cursor
        n = end - text_from
        out.extend(ids[text_from:end])
        positions.append(cursor + torch.arange(n).expand(3, -1))
        vision.extend([False] * n)
        source.extend(range(text_from, end))
        cursor += n

    for i, token in enumerate(ids):
        grid = next(pictures, None) if token in pads else None
        if grid is None:
            continue
        text_until(i)
        rows, cols = (a.reshape(-1) for a in torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]),
                                                            indexing="ij"))
        out.extend([token] * rows.numel())
        positions.append(cursor + torch.stack([torch.zeros_like(rows), rows, cols]))
        vision.extend([True] * rows.numel())
        source.extend([i] * rows.numel())
        cursor += max(grid)
        text_from = i + 1
    text_until(len(ids))
    return PictureLayout(out, torch.cat(positions, dim=1), torch.tensor(vision), source)


def read_pictures(vision: Qwen3VLVisionModel | None, images: Sequence[torch.Tensor], missing: str,
                  check: Callable[[], None] | None = None) -> tuple[list[tuple[int, int]], torch.Tensor | None,
                                                                    list[torch.Tensor] | None]:
    """Pictures (ComfyUI IMAGE tensors [1, H, W, 3] in [0, 1]) through the vision tower, check() before each: their
    merged grids (gh, gw), merged rows [n, hidden] of all in order and DeepStack features (one [n, hidden] a
    DeepStack layer); no pictures: ([], None, None). WeightsError (missing: why there is no tower, naming the file)
    when pictures come without one."""
    if not images:
        return [], None, None
    if vision is None:
        raise WeightsError(f"{missing}; cannot read the {len(images)} picture(s) given")
    embeds, deepstack, grids = [], [], []
    for image in images:
        if check is not None:
            check()
        merged, deep, grid = picture_rows(vision, image)
        embeds.append(merged)
        deepstack.append(deep)
        grids.append(grid)
    return grids, torch.cat(embeds), [torch.cat(d) for d in zip(*deepstack)]


def picture_rows(vision: Qwen3VLVisionModel, image: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                            tuple[int, int]]:
    """One picture through the vision tower: its merged rows [n, hidden], its DeepStack features (one [n, hidden] a
    DeepStack layer) and its merged grid (gh, gw), n = gh * gw."""
    config = vision.config
    merge = config.spatial_merge_size
    patches, (gh, gw) = picture_patches(image, config.patch_size, config.temporal_patch_size, merge)
    weight = vision.patch_embed.proj.weight
    out = vision(patches.to(weight.device, weight.dtype), torch.tensor([[1, gh, gw]], device=weight.device))
    return out.pooler_output, out.deepstack_features, (gh // merge, gw // merge)
