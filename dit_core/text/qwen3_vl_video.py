"""Qwen3-VL's videos inside a prompt, as MiniMax H3 presents a ref2va request's references (diffusers 0.42.1
MiniMaxH3Ref2VATextEncoderStep: _sample_video_condition_frames, _gather_vision_features, _build_presentation): a
reference video read at 2 fps, its frames merged in pairs (the vision tower's temporal patch) into vision blocks,
each after a "<t seconds>" label; the labels of every reference in packed order, numbered per modality. The frames'
size and patches as transformers' Qwen3VLVideoProcessor makes them (H3's video_preprocessor_config.json bounds), on
the vision tower qwen3_vl_vision.py reads."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import Qwen3VLVisionModel

from ..weights import WeightsError
from .qwen3_vl_vision import IMAGE_PAD_ID, VIDEO_PAD_ID, picture_rows

H3_FPS = 24.0  # diffusers' components.fps: the rate a normalized reference video is at
VIDEO_SAMPLE_FPS = 2.0  # MiniMaxH3Ref2VATextEncoderStep(video_sample_fps=2.0)
# Qwen3-VL-32B's video_preprocessor_config.json: size {"shortest_edge": 4096, "longest_edge": 25165824}, bounds on
# all sampled frames' pixels together (t_bar * h * w); no per-frame cap (transformers 5.24's default).
VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS = 4096, 25165824
KINDS = ("image", "video", "audio")


class PromptReference(NamedTuple):
    """One ref2va reference as the prompt shows it. kind "image": pixels a ComfyUI IMAGE [1, H, W, 3]; "video":
    pixels its frames [F, H, W, 3] at fps, has_audio whether its soundtrack conditions too; "audio": a label only (a
    waveform never reaches the text encoder). Pixels in [0, 1]."""
    kind: str
    pixels: torch.Tensor | None = None
    has_audio: bool = False
    fps: float = H3_FPS


def sampled_frames(count: int, fps: float = H3_FPS, sample_fps: float = VIDEO_SAMPLE_FPS,
                   temporal_patch: int = 2) -> tuple[list[int], list[float]]:
    """(indices of the frames read, one timestamp per vision block) of a video of count frames at fps: every
    fps / sample_fps-th frame (Python's round, repeats dropped); the read frames merged in groups of temporal_patch
    (the last repeated to fill a group), a group labelled with the mean of its timestamps (index / sample_fps).
    ValueError when fewer than temporal_patch frames are read."""
    stride = fps / sample_fps
    indices, cursor = [], 0.0
    while round(cursor) < count:
        if not indices or round(cursor) > indices[-1]:
            indices.append(round(cursor))
        cursor += stride
    if len(indices) < temporal_patch:
        least = round((temporal_patch - 1) * stride) + 1
        raise ValueError(f"the text encoder reads a reference video at {sample_fps:g} fps in groups of "
                         f"{temporal_patch} frames, so it needs at least {least} frames at {fps:g} fps "
                         f"({least / fps:.2g} s), got {count}; use a longer video")
    stamps = [i / sample_fps for i in range(len(indices))]
    stamps += [stamps[-1]] * (-len(stamps) % temporal_patch)
    blocks = [(stamps[i] + stamps[i + temporal_patch - 1]) / 2 for i in range(0, len(stamps), temporal_patch)]
    return indices, blocks


def video_size(frames: int, height: int, width: int, factor: int, temporal_factor: int = 2,
               min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = VIDEO_MAX_PIXELS) -> tuple[int, int]:
    """(height, width) the read frames are resized to (transformers' Qwen3-VL video smart_resize): sides too small
    for factor scaled up, each side rounded to a multiple of factor, then if the frames' pixels together (frames
    rounded to temporal_factor) fall outside [min_pixels, max_pixels], both sides scaled by one factor to fit."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"a reference video's aspect ratio must be under 200, got {width} x {height}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal_factor) * temporal_factor
    if t * h * w > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def video_patches(frames: torch.Tensor, patch: int, temporal_patch: int, merge: int,
                  min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = VIDEO_MAX_PIXELS
                  ) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Read frames [T, H, W, 3] in [0, 1] -> (patches [gt * gh * gw, 3 * temporal_patch * patch^2], (gt, gh, gw)):
    as 8-bit pixels (diffusers normalizes a reference video to uint8), resized when video_size says so (bicubic,
    antialiased, on 8-bit pixels on the CPU: torchvision's resize there), mapped to [-1, 1], the last frame repeated
    to fill the temporal patch, cut into patches: temporal group, then the merge x merge blocks as for a picture."""
    if frames.dim() != 4 or frames.shape[-1] < 3 or frames.shape[0] < 1:
        raise ValueError(f"a reference video is IMAGE frames [F, H, W, 3], got {tuple(frames.shape)}")
    pixels = (frames[..., :3].float().cpu() * 255.0).round().clamp(0, 255).to(torch.uint8).permute(0, 3, 1, 2)
    h, w = video_size(pixels.shape[0], pixels.shape[2], pixels.shape[3], patch * merge, temporal_patch, min_pixels,
                      max_pixels)
    if (h, w) != tuple(pixels.shape[2:]):
        pixels = F.interpolate(pixels.contiguous(), size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    pixels = (pixels.float() - 127.5) / 127.5
    if pad := -pixels.shape[0] % temporal_patch:
        pixels = torch.cat([pixels, pixels[-1:].expand(pad, -1, -1, -1)])
    gt, gh, gw = pixels.shape[0] // temporal_patch, h // patch, w // patch
    blocks = pixels.reshape(gt, temporal_patch, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (group, block row, block col, row, col, C, T, p, p)
    return blocks.reshape(gt * gh * gw, 3 * temporal_patch * patch * patch), (gt, gh, gw)


def video_rows(vision: Qwen3VLVisionModel, frames: torch.Tensor, fps: float = H3_FPS
               ) -> tuple[torch.Tensor, list[torch.Tensor], tuple[int, int, int], list[float]]:
    """A reference video's frames at fps through the vision tower, read at VIDEO_SAMPLE_FPS: merged rows
    [gt * n, hidden] (block-major, n = gh * gw rows a block), DeepStack features (one such a DeepStack layer), merged
    grid (gt, gh, gw) and the blocks' timestamps."""
    config = vision.config
    merge = config.spatial_merge_size
    indices, stamps = sampled_frames(frames.shape[0], fps, VIDEO_SAMPLE_FPS, config.temporal_patch_size)
    patches, (gt, gh, gw) = video_patches(frames[indices], config.patch_size, config.temporal_patch_size, merge)
    weight = vision.patch_embed.proj.weight
    out = vision(patches.to(weight.device, weight.dtype), torch.tensor([[gt, gh, gw]], device=weight.device))
    return out.pooler_output, out.deepstack_features, (gt, gh // merge, gw // merge), stamps


class ReadReferences(NamedTuple):
    """A request's references read: pieces (text, pad or None) of the presentation before the prompt, in order;
    grids (gh, gw) of its vision blocks in order; embeds [n, hidden] and deepstack (one [n, hidden] a DeepStack
    layer) of all blocks' rows in row order, None without blocks."""
    pieces: list[tuple[str, int | None]]
    grids: list[tuple[int, int]]
    embeds: torch.Tensor | None
    deepstack: list[torch.Tensor] | None


def read_references(vision: Qwen3VLVisionModel | None, references: Sequence[PromptReference], missing: str,
                    check: Callable[[], None] | None = None) -> ReadReferences:
    """The references (in packed order) through the vision tower, check() before each image and video, and the
    labels diffusers' _build_presentation gives them, numbered per modality: "<Audio j>: " first for a reference
    with sound (an audio, a video's soundtrack), "<Picture i>: " and an image block, "<Video k>: " then per block
    "<t seconds>" (format .1f: round half to even) and a video block. WeightsError (missing: why there is no tower)
    when an image or video comes without one."""
    for ref in references:
        if ref.kind not in KINDS:
            raise ValueError(f"a reference is an image, a video or an audio, got kind {ref.kind!r}")
    counts = {kind: sum(ref.kind == kind for ref in references) for kind in KINDS}
    if vision is None and (counts["image"] or counts["video"]):
        given = [f"{counts[kind]} {name}(s)" for kind, name in (("image", "picture"), ("video", "video")) if counts[kind]]
        raise WeightsError(f"{missing}; cannot read the {' and '.join(given)} given")
    pieces, grids, embeds, deepstack = [], [], [], []
    counts = dict.fromkeys(KINDS, 0)
    for ref in references:
        if ref.has_audio or ref.kind == "audio":
            counts["audio"] += 1
            pieces.append((f"<Audio {counts['audio']}>: ", None))
        if ref.kind == "audio":
            continue
        if check is not None:
            check()
        counts[ref.kind] += 1
        if ref.kind == "image":
            merged, deep, grid = picture_rows(vision, ref.pixels)
            pieces.append((f"<Picture {counts['image']}>: ", IMAGE_PAD_ID))
            grids.append(grid)
        else:
            merged, deep, (gt, gh, gw), stamps = video_rows(vision, ref.pixels, ref.fps)
            pieces.append((f"<Video {counts['video']}>: ", None))
            pieces += [(f"<{t:.1f} seconds>", VIDEO_PAD_ID) for t in stamps]
            grids += [(gh, gw)] * gt
        embeds.append(merged)
        deepstack.append(deep)
    if not embeds:
        return ReadReferences(pieces, grids, None, None)
    return ReadReferences(pieces, grids, torch.cat(embeds), [torch.cat(d) for d in zip(*deepstack)])
