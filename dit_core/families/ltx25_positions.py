"""LTX-2.5's positions: the video and audio rows' time and space midpoints (reference/families/ltx25.md section 4;
diffusers' prepare_video_coords / prepare_audio_coords), the split rotary's per-head angles of them, the guide frames
appended after the generated ones (ComfyUI's LTXVAddGuide) with their attention bias (one key bias a group of query
rows), and the rows that take the keyframe marker."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..block import GroupBias
from ..sequence import AxisAngles, Sequence

ROPE_THETA = 10000.0
# RoPE coordinates (section 4): a video latent spans 8 pixel frames x 32 x 32 px, the causal VAE's first one frame;
# an audio latent 4 mel hops of 160 samples at 16 kHz, its first 1. Positions over 20 s, 2048 px, 2048 px.
VIDEO_SCALE = (8, 32, 32)
AUDIO_SCALE, MEL_HOP, SAMPLE_RATE = 4, 160, 16000
CAUSAL_OFFSET = 1
MAX_POSITIONS = (20.0, 2048.0, 2048.0)


@dataclass(frozen=True)
class Guide:
    """A latent frame appended after the generated ones (ComfyUI's LTXVAddGuide): the pixel frames it stands for,
    [start, end) (its RoPE time; its cells are the grid's), and how strongly it and the generated rows attend to
    each other (the guide's strength; 1: as any row)."""
    start: int
    end: int
    strength: float = 1.0


@dataclass(frozen=True)
class Grid:
    """The video latent's frames x height x width (rows frame-major, then y, x), its frame rate, and the guide
    frames appended after the generated ones (rows of the same height x width)."""
    frames: int
    height: int
    width: int
    fps: float = 24.0
    guides: tuple[Guide, ...] = ()

    @property
    def rows(self) -> int:
        return (self.frames + len(self.guides)) * self.height * self.width


def video_midpoints(grid: Grid, dtype: torch.dtype) -> torch.Tensor:
    """Each video row's patch midpoint [rows, 3]: seconds, px, px (section 4), computed in dtype in diffusers'
    order (its prepare_video_coords), so float32 gives its values."""
    axes = [torch.arange(n, dtype=dtype) for n in (grid.frames, grid.height, grid.width)]
    start = torch.stack(torch.meshgrid(*axes, indexing="ij")).flatten(1)
    scale = torch.tensor(VIDEO_SCALE, dtype=dtype)[:, None]
    start, end = start * scale, (start + 1) * scale
    for bound in (start, end):
        # the causal VAE's first latent frame is a single pixel frame: time bounds shift back, floored at 0
        bound[0] = (bound[0] + CAUSAL_OFFSET - VIDEO_SCALE[0]).clamp(min=0) / grid.fps
    mid = ((start + end) / 2.0).T
    if not grid.guides:
        return mid
    # a guide frame's rows: its own time span (ComfyUI's keyframe_idxs) over the grid's cells
    span = torch.tensor([[g.start, g.end] for g in grid.guides], dtype=dtype) / grid.fps
    times = ((span[:, 0] + span[:, 1]) / 2.0).repeat_interleave(grid.height * grid.width)
    cells = mid[:grid.height * grid.width, 1:].repeat(len(grid.guides), 1)
    return torch.cat([mid, torch.cat([times[:, None], cells], dim=1)])


def keyframe_rows(grid: Grid) -> torch.Tensor:
    """The rows that take the keyframe marker as ComfyUI's LTX model marks them (keyframes_abs_pos_mask: a pixel
    time span starting at 0, guide frames excluded): the first generated frame's, a single pixel frame of the causal
    VAE. [grid.rows] bool."""
    rows = torch.zeros(grid.rows, dtype=torch.bool)
    rows[:grid.height * grid.width] = True
    return rows


def guide_bias(grid: Grid) -> GroupBias | None:
    """ComfyUI's guide attention mask (comfy/ldm/lightricks/model.py, GuideAttentionMask) as an additive bias on the
    video self-attention's scores, by query group: a generated row's scores on a guide's rows, and that guide's rows'
    scores on the generated rows, take log(strength) (strength 0 or less: float32's lowest); guide rows among
    themselves and generated rows among themselves take 0. So the generated rows share one [rows] key bias and each
    guide's rows another: 1 + guides vectors, never [rows, rows]. None where every strength is 1 (ComfyUI builds no
    mask)."""
    strengths = torch.tensor([g.strength for g in grid.guides], dtype=torch.float32)
    if bool((strengths == 1.0).all()):
        return None
    cells = grid.height * grid.width
    generated = grid.frames * cells
    low = torch.finfo(torch.float32)
    log_strength = torch.where(strengths > 0, strengths.clamp(min=low.tiny).log(), torch.tensor(low.min))
    keys = torch.zeros(1 + len(grid.guides), grid.rows)
    keys[0, generated:] = log_strength.repeat_interleave(cells)
    keys[1:, :generated] = log_strength[:, None]
    rows = [(0, generated)] + [(generated + g * cells, generated + (g + 1) * cells) for g in range(len(grid.guides))]
    return GroupBias.of(keys, rows)


def guide_attention_bias(grid: Grid) -> torch.Tensor | None:
    """guide_bias's dense form [rows, rows] (a reference for tests; the model never builds it)."""
    bias = guide_bias(grid)
    return None if bias is None else bias.dense()


def audio_midpoints(latents: int, dtype: torch.dtype) -> torch.Tensor:
    """Each audio row's midpoint in seconds [rows, 1] (section 4), in dtype in diffusers' order."""
    n = torch.arange(latents, dtype=dtype)
    start, end = ((k * AUDIO_SCALE + CAUSAL_OFFSET - AUDIO_SCALE).clamp(min=0) * MEL_HOP / SAMPLE_RATE
                  for k in (n, n + 1))
    return ((start + end) / 2.0)[:, None]


def split_angles(mid: torch.Tensor, width: int, heads: int) -> AxisAngles:
    """The "split" rotary's per-head angles of midpoints [rows, nd] (section 4), by axis: per axis d and frequency j
    (f_j = theta^(j / (n - 1)) pi / 2 in float64, n = width // 2 nd) the angle f_j (2 mid_d / max_d - 1) at column
    j nd + d, zero angles in front up to width / 2, then head by head [heads, width / (2 heads)]. Each axis's table
    holds its distinct midpoints' angles. In mid's dtype: float64 whole; float32 as diffusers computes them (the
    frequencies rounded to float32 first). cos and sin in float32."""
    rows, nd = mid.shape
    count = width // (2 * nd)
    ladder = torch.pow(ROPE_THETA, torch.linspace(0.0, 1.0, count, dtype=torch.float64)) * math.pi / 2.0
    ladder = ladder.to(mid.device, mid.dtype)
    tables, index = [mid.new_zeros(1, count)], []  # table row 0: the padding columns' zero angle
    for d in range(nd):
        values, at = torch.unique(mid[:, d], return_inverse=True)
        index.append(at + sum(t.shape[0] for t in tables))
        tables.append((values / MAX_POSITIONS[d] * 2 - 1)[:, None] * ladder)
    index.append(torch.zeros_like(index[0]))
    column = torch.arange(width // 2, device=mid.device) - (width // 2 - count * nd)
    padding = column < 0
    axis = torch.where(padding, nd, column % nd).reshape(heads, -1)
    freq = torch.where(padding, 0, column.div(nd, rounding_mode="floor")).reshape(heads, -1)
    angles = torch.cat(tables)
    return AxisAngles(angles.cos().float(), angles.sin().float(), torch.stack(index, 1).to(torch.int32),
                      axis.to(torch.int32), freq.to(torch.int32))


def rotary(mid: torch.Tensor, width: int, heads: int, map_: torch.Tensor) -> Sequence:
    return Sequence(map_, None, None, by_axis=split_angles(mid, width, heads))


def distinct(times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct values of per-row times, each row's index into them): a modulation row per distinct time."""
    return torch.unique(times, sorted=True, return_inverse=True)
