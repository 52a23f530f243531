"""Qwen3-VL's videos inside a prompt, as MiniMax H3 presents a ref2va request's references (ComfyUI's
MiniMaxH3ReferenceToVideo and MiniMaxH3Tokenizer / MiniMaxQwen3VL.preprocess_embed; diffusers 0.42.1's
MiniMaxH3Ref2VATextEncoderStep gives the same labels and blocks): a reference video read at 2 fps, its frames merged
in pairs (the vision tower's temporal patch; an odd count repeats its last frame) into vision blocks, each after a
"<t seconds>" label; the labels of every reference in packed order, numbered per modality. Each pair is sized,
normalized and patched as a picture is (qwen3_vl_vision.py: ComfyUI's process_video_block keeps
process_qwen2vl_images' rule) and read through the vision tower alone, a block of one temporal step."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..weights import WeightsError
from .qwen3_vl_vision import IMAGE_PAD_ID, VIDEO_PAD_ID, picture_patches, picture_rows

if TYPE_CHECKING:
    from transformers import Qwen3VLVisionModel

H3_FPS = 24.0  # the rate a reference video is at (ComfyUI's FPS, diffusers' components.fps)
VIDEO_SAMPLE_FPS = 2.0  # ComfyUI's node reads every FPS // 2-th frame; diffusers' video_sample_fps=2.0
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
    fps / sample_fps-th frame from the first (Python's round, repeats dropped; at 24 fps range(0, count, 12), as
    ComfyUI's node); the read frames merged in groups of temporal_patch, the last frame (and its timestamp)
    repeated to fill the last group, a group labelled with the mean of its timestamps (index / sample_fps).
    ValueError for a video of no frames."""
    if count < 1:
        raise ValueError(f"a reference video has at least one frame, got {count}")
    stride = fps / sample_fps
    indices, cursor = [], 0.0
    while round(cursor) < count:
        if not indices or round(cursor) > indices[-1]:
            indices.append(round(cursor))
        cursor += stride
    stamps = [i / sample_fps for i in range(len(indices))]
    stamps += [stamps[-1]] * (-len(stamps) % temporal_patch)
    blocks = [(stamps[i] + stamps[i + temporal_patch - 1]) / 2 for i in range(0, len(stamps), temporal_patch)]
    return indices, blocks


def video_patches(frames: torch.Tensor, patch: int, temporal_patch: int, merge: int
                  ) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Read frames [T, H, W, 3] in [0, 1] -> (patches [gt * gh * gw, 3 * temporal_patch * patch^2], (gt, gh, gw)):
    the last frame repeated to fill the last temporal group, each frame sized, resized (bilinear, float) and mapped
    to [-1, 1] as a picture (picture_patches), a group's frames filling the temporal patch; group-major, each group
    cut into patches as a picture is."""
    if frames.dim() != 4 or frames.shape[-1] < 3 or frames.shape[0] < 1:
        raise ValueError(f"a reference video is IMAGE frames [F, H, W, 3], got {tuple(frames.shape)}")
    if pad := -frames.shape[0] % temporal_patch:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    groups = [picture_patches(frames[i:i + temporal_patch], patch, temporal_patch, merge)
              for i in range(0, frames.shape[0], temporal_patch)]
    gh, gw = groups[0][1]
    return torch.cat([g[0] for g in groups]), (len(groups), gh, gw)


def video_rows(vision: Qwen3VLVisionModel, frames: torch.Tensor, fps: float = H3_FPS
               ) -> tuple[torch.Tensor, list[torch.Tensor], tuple[int, int, int], list[float]]:
    """A reference video's frames at fps through the vision tower, read at VIDEO_SAMPLE_FPS, one temporal group
    at a time (ComfyUI's blocks, grid (1, gh, gw) each): merged rows [gt * n, hidden] (block-major, n = gh * gw rows
    a block), DeepStack features (one such a DeepStack layer), merged grid (gt, gh, gw) and the blocks' timestamps."""
    config = vision.config
    merge = config.spatial_merge_size
    indices, stamps = sampled_frames(frames.shape[0], fps, VIDEO_SAMPLE_FPS, config.temporal_patch_size)
    patches, (gt, gh, gw) = video_patches(frames[indices], config.patch_size, config.temporal_patch_size, merge)
    weight = vision.patch_embed.proj.weight
    grid = torch.tensor([[1, gh, gw]], device=weight.device)
    outs = [vision(block.to(weight.device, weight.dtype), grid) for block in patches.split(gh * gw)]
    deepstack = [torch.cat(d) for d in zip(*(out.deepstack_features for out in outs))]
    return torch.cat([out.pooler_output for out in outs]), deepstack, (gt, gh // merge, gw // merge), stamps


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
    labels ComfyUI's MiniMaxH3Tokenizer (and diffusers' _build_presentation) gives them, numbered per modality:
    "<Audio j>: " first for a reference with sound (an audio, a video's soundtrack), "<Picture i>: " and an image
    block, "<Video k>: " then per block "<t seconds>" (format .1f: round half to even) and a video block. WeightsError (missing: why there is no tower)
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
