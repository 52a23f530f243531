"""MiniMax H3's packed sequence: where text, condition (keyframe, reference), audio and video rows sit, their rotary
positions and times, and the latents <-> rows maps (reference/families/minimax_h3.md section 4; diffusers 0.42.1
build_packed_sequence and build_ref2va_packed_sequence, ComfyUI's PackedLayout). The recipe, minimax_h3.py, runs the
model over a Layout."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

PATCH = (1, 2, 2)
# Modality tags of the packed rows; a block's modulation row of packed row r is time_index[r] * 3 + tag[r].
VIDEO, TEXT, AUDIO = 0, 1, 2
MODALITIES = 3
# The rotary clock (section 4): a latent frame spans 5/3 x (1, 4, 4, 4, 4) (one VAE clip = 17 pixel frames at
# 24 fps, one audio latent = 1/40 s = 5/3 frames); the spatial grid spans 32 units across the short-normalised side.
FRAME_SPAN = 5.0 / 3.0
FRAMES_PER_LATENT = (1, 4, 4, 4, 4)
SPATIAL_SCALE = 32
KEYFRAME_TIME = 0.999  # video condition rows' time: max(t_video, 0.999), their noise augmentation level
AUDIO_CONDITION_TIME = 1.0  # audio condition rows' time: max(t_audio, 1.0) (ComfyUI's AUDIO_COND_TIMESTEP: no noise)
CANVAS_MULTIPLE = 32  # pixels: the VAE's 16 times the 2x2 patch
REFERENCE_SHORT_EDGE = 2048  # a reference image's short edge at most (ComfyUI's REF_IMAGE_SHORT_EDGE)
REFERENCE_VIDEO_SHORT_EDGE, REFERENCE_VIDEO_PIXELS = 768, 768 * 1344  # a reference video's canvas (adapt_canvas)


@dataclass(frozen=True)
class Reference:
    """One ref2va reference (section 4; ComfyUI's minimax_refs block): kind "image" (video: its normalized latent
    [1, C, 1, h, w], a frame of its own size), "video" (video [1, C, F, h, w] and, with a soundtrack, audio) or
    "audio" (audio: its normalized latent [1, C_audio, 2, Na]). The layout reads only their shapes."""
    kind: str
    video: torch.Tensor | None = None
    audio: torch.Tensor | None = None

    def __post_init__(self):
        wants = {"image": (True, False), "video": (True, None), "audio": (False, True)}.get(self.kind)
        if wants is None:
            raise ValueError(f"MiniMaxH3: a reference is an 'image', a 'video' or an 'audio', got {self.kind!r}")
        for name, want, got in (("video", wants[0], self.video), ("audio", wants[1], self.audio)):
            if want is not None and want != (got is not None):
                raise ValueError(f"MiniMaxH3: {'a' if want else 'no'} {name} latent for the {self.kind} "
                                 "reference")
        v = self.video
        if v is not None and (v.dim() != 5 or v.shape[0] != 1 or v.shape[3] % PATCH[1] or v.shape[4] % PATCH[2] or
                              (self.kind == "image" and v.shape[2] != 1)):
            raise ValueError(f"MiniMaxH3: the {self.kind} reference's latent is [1, C, "
                             f"{'1' if self.kind == 'image' else 'F'}, h, w] with even sides, got {tuple(v.shape)}")
        if self.audio is not None and (self.audio.dim() != 4 or self.audio.shape[0] != 1):
            raise ValueError(f"MiniMaxH3: a reference's audio latent is [1, C, 2, Na], got {tuple(self.audio.shape)}")

    @property
    def audio_latents(self) -> int:
        return 0 if self.audio is None else self.audio.shape[-1]

    def span(self) -> float:
        """The rotary time the block takes ahead of the targets: an image one slot; audio its latents; a video the
        longer of its soundtrack and its frames (summed in order, as ComfyUI's _ref_t_span and diffusers do)."""
        if self.kind == "image":
            return 1.0
        frames = 0 if self.video is None else self.video.shape[2]
        video = sum(FRAME_SPAN * FRAMES_PER_LATENT[i % len(FRAMES_PER_LATENT)] for i in range(frames))
        return max(float(self.audio_latents), video)

    def rows(self, audio_channels: int = 2) -> int:
        """Its packed rows: video rows (2x2 patches of each frame) and audio rows (all channels)."""
        video = 0 if self.video is None else math.prod(self.video.shape[2:]) // (PATCH[1] * PATCH[2])
        return video + self.audio_latents * audio_channels


def reference_image_size(height: int, width: int, canvas_height: int, canvas_width: int,
                         sizing: str) -> tuple[int, int]:
    """(height, width) in pixels a ref2va reference image is resized to (ComfyUI's MiniMaxH3ReferenceToVideo):
    'match' scales it down (never up, keeping its aspect) to the canvas's area, 'max' to a short edge of 2048 (the
    reference pipeline's, diffusers' too); each side then rounded to a multiple of 32 (at least 32), Python's round."""
    if sizing == "match":
        scale = min(1.0, math.sqrt(canvas_width * canvas_height / (width * height)))
    elif sizing == "max":
        scale = min(1.0, REFERENCE_SHORT_EDGE / min(width, height))
    else:
        raise ValueError(f"MiniMaxH3: reference image sizing is 'match' or 'max', got {sizing!r}")
    side = lambda n: max(CANVAS_MULTIPLE, round(n * scale / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)  # noqa: E731
    return side(height), side(width)


def reference_video_size(height: int, width: int) -> tuple[int, int]:
    """(height, width) in pixels a ref2va reference video's frames are resized to (ComfyUI's
    MiniMaxH3ReferenceToVideo, its adapt_canvas): a 768 short edge keeping the aspect, scaled down to at most
    768 x 1344 pixels, sides rounded to multiples of 32; a video smaller than that keeps its own sides, rounded to 32s
    (at least 32 each, Python's round)."""
    ratio = width / height
    w, h = (REFERENCE_VIDEO_SHORT_EDGE * ratio, REFERENCE_VIDEO_SHORT_EDGE) if ratio >= 1.0 else \
        (REFERENCE_VIDEO_SHORT_EDGE, REFERENCE_VIDEO_SHORT_EDGE / ratio)
    if w * h > REFERENCE_VIDEO_PIXELS:
        s = math.sqrt(REFERENCE_VIDEO_PIXELS / (w * h))
        w, h = w * s, h * s
    side = lambda n: max(CANVAS_MULTIPLE, round(n / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)  # noqa: E731
    if width * height < side(w) * side(h):
        return side(height), side(width)
    return side(h), side(w)


def reference_video_frames(frames: int, length: int) -> int:
    """How many of a reference video's frames ref2va encodes (ComfyUI's MiniMaxH3ReferenceToVideo): at most the
    target's `length`, then down to 17n + 5 (the video VAE's clips); fewer than 5 frames are refused."""
    n = min(frames, length)
    if n < 5:
        raise ValueError(f"a reference video has at least 5 frames (0.2 s at 24 fps), got {n}")
    return n - (n - 5) % 17


@dataclass(frozen=True)
class Layout:
    """One packed sequence, [text | keyframe rows | reference blocks | audio L | audio R | target video] (section 4),
    and where each kind of row sits. Video rows, as the model takes and returns them, are the condition rows
    (keyframes, then the references' frames) then the target rows; audio rows the references' then the target's."""
    positions: torch.Tensor   # [rows, 3] float64: rotary (t, h, w)
    tags: torch.Tensor        # [rows] long: VIDEO, TEXT or AUDIO
    text: int                 # text rows
    video_rows: torch.Tensor  # [video conditions + targets] long: the packed row of each video row
    audio_rows: torch.Tensor  # [audio conditions + targets] long
    video_conditions: int     # leading video rows that are conditions (keyframes, reference frames)
    audio_conditions: int     # leading audio rows that are conditions (reference audio)

    @property
    def rows(self) -> int:
        return self.positions.shape[0]

    @property
    def video(self) -> int:
        """Target video rows."""
        return self.video_rows.shape[0] - self.video_conditions

    @property
    def audio(self) -> int:
        """Target audio rows, both channels."""
        return self.audio_rows.shape[0] - self.audio_conditions


def _spatial_axis(size: int, patch: int, sqrt_area: float) -> torch.Tensor:
    """One spatial rotary axis: size/patch values centred on 0.5 of a side normalised by sqrt(area), times 32.
    numpy's linspace, as diffusers builds it: torch.linspace rounds differently and the grid is float64 exact."""
    ratio = size / sqrt_area
    left = (1.0 - ratio) / 2.0
    return torch.from_numpy(np.linspace(left, left + ratio, size // patch, endpoint=False) * SPATIAL_SCALE)


def frame_times(frames: int, origin: float) -> torch.Tensor:
    """The rotary time of each latent frame from origin: spans 5/3 x (1, 4, 4, 4, 4), summed in order."""
    spans = torch.tensor([FRAME_SPAN * FRAMES_PER_LATENT[i % len(FRAMES_PER_LATENT)] for i in range(frames)],
                         dtype=torch.float64)
    return origin + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])


def _frame_grid(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (h, w) positions [rows, 2] of one latent frame's 2x2 patches, and its width axis."""
    ph, pw = PATCH[1], PATCH[2]
    if height % ph or width % pw:
        raise ValueError(f"MiniMaxH3: latent frames of {height}x{width} are not on the {ph}x{pw} patch grid")
    hs, ws = _spatial_axis(height, ph, math.sqrt(height * width)), _spatial_axis(width, pw, math.sqrt(height * width))
    return torch.stack([g.reshape(-1) for g in torch.meshgrid(hs, ws, indexing="ij")], -1), ws


def _video_positions(times: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Frames at rotary times [F] over one frame's grid [P, 2] -> positions [F P, 3], frame-major."""
    video = torch.empty(times.shape[0], grid.shape[0], 3, dtype=torch.float64)
    video[:, :, 0] = times[:, None]
    video[:, :, 1:] = grid[None]
    return video.reshape(-1, 3)


def _audio_positions(origin: float, latents: int, ws: torch.Tensor, channels: int) -> torch.Tensor:
    """Audio rows, channel-major, on the video's clock from origin (one latent a unit), no height, at the two ends
    of the width axis ws of their block (the target's, or a reference video's own)."""
    t = (origin + torch.arange(latents, dtype=torch.float64)).repeat(channels)
    w = torch.cat([torch.full((latents,), float(ws[0]), dtype=torch.float64),
                   torch.full((latents * (channels - 1),), float(ws[-1]), dtype=torch.float64)])
    return torch.stack([t, torch.zeros_like(t), w], -1)


def packed_layout(text_tags: torch.Tensor | int, frames: int, height: int, width: int, audio_latents: int,
                  keyframes: tuple[str, ...] = (), audio_channels: int = 2,
                  references: tuple[Reference, ...] = ()) -> Layout:
    """The t2va / fl2va / ref2va layout of text rows (their tags, or a count of plain text rows), `keyframes`
    condition frames ("first" or "last", in packed order), `references` blocks (in request order), audio_latents per
    channel and frames target latent frames of height x width latents (section 4; diffusers' build_packed_sequence
    and build_ref2va_packed_sequence, ComfyUI's PackedLayout, which puts keyframe rows before reference blocks).
    The references push the targets' origin on by their spans; an image block sits at one time on its own grid, a
    video block's soundtrack rows come before its frames, both from one origin."""
    tags_text = torch.full((text_tags,), TEXT) if isinstance(text_tags, int) else text_tags.long()
    nt = tags_text.shape[0]
    grid, ws = _frame_grid(height, width)
    origin = float(nt) + sum(r.span() for r in references)
    parts = [torch.stack([torch.arange(nt, dtype=torch.float64), torch.zeros(nt, dtype=torch.float64),
                          torch.zeros(nt, dtype=torch.float64)], -1)]
    kinds = [(TEXT, nt, None)]  # (tag, rows, condition or target video / audio)

    def add(positions: torch.Tensor, tag: int, condition: bool):
        parts.append(positions)
        kinds.append((tag, positions.shape[0], condition))

    for anchor in keyframes:
        if anchor == "first":
            t = origin
        elif anchor == "last":
            # numpy's pairwise sum, as diffusers (and the release) place the last frame: a sequential sum differs
            # in the last ulp from 16 latent frames on.
            spans = np.ones(frames) * FRAME_SPAN
            for i, n in enumerate(FRAMES_PER_LATENT):
                spans[i::len(FRAMES_PER_LATENT)] *= n
            t = origin + float(spans.sum()) - FRAME_SPAN
        else:
            raise ValueError(f"MiniMaxH3: a keyframe is 'first' or 'last', got {anchor!r}")
        add(_video_positions(torch.tensor([t], dtype=torch.float64), grid), VIDEO, True)
    cursor = float(nt)
    for ref in references:
        if ref.audio is not None:
            own_ws = ws if ref.video is None else _frame_grid(*ref.video.shape[3:])[1]
            add(_audio_positions(cursor, ref.audio_latents, own_ws, audio_channels), AUDIO, True)
        if ref.video is not None:
            times = torch.full((1,), cursor, dtype=torch.float64) if ref.kind == "image" else \
                frame_times(ref.video.shape[2], cursor)
            add(_video_positions(times, _frame_grid(*ref.video.shape[3:])[0]), VIDEO, True)
        cursor += ref.span()
    add(_audio_positions(origin, audio_latents, ws, audio_channels), AUDIO, False)
    add(_video_positions(frame_times(frames, origin), grid), VIDEO, False)
    starts = np.cumsum([0] + [n for _, n, _ in kinds])
    rows_of = lambda tag, condition: [torch.arange(starts[i], starts[i] + n)  # noqa: E731
                                      for i, (t, n, c) in enumerate(kinds) if t == tag and c == condition]
    video_conditions, audio_conditions = rows_of(VIDEO, True), rows_of(AUDIO, True)
    tags = torch.cat([tags_text] + [torch.full((n,), tag) for tag, n, _ in kinds[1:]])
    return Layout(torch.cat(parts), tags, nt, torch.cat(video_conditions + rows_of(VIDEO, False)),
                  torch.cat(audio_conditions + rows_of(AUDIO, False)), sum(r.numel() for r in video_conditions),
                  sum(r.numel() for r in audio_conditions))


def row_times(layout: Layout, t_video: float, t_audio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct times, sorted, [nT] f32; each row's index into them [rows]): text and target video rows at
    t_video, video condition rows at max(t_video, 0.999), target audio rows at t_audio, audio condition rows at
    max(t_audio, 1.0) (diffusers' build_row_timesteps; ComfyUI's segment times)."""
    t = torch.full((layout.rows,), t_video, dtype=torch.float32)
    t[layout.video_rows[:layout.video_conditions]] = max(t_video, KEYFRAME_TIME)
    t[layout.audio_rows[layout.audio_conditions:]] = t_audio
    t[layout.audio_rows[:layout.audio_conditions]] = max(t_audio, AUDIO_CONDITION_TIME)
    return torch.unique(t, sorted=True, return_inverse=True)


def patchify(latent: torch.Tensor) -> torch.Tensor:
    """Video latent [C, F, H, W] -> rows [F H/2 W/2, 4C]: frame-major, then (y, x); values c*4 + 2p + q."""
    c, f, h, w = latent.shape
    if h % PATCH[1] or w % PATCH[2]:
        raise ValueError(f"MiniMaxH3: video latent {tuple(latent.shape)} is not on the 2x2 patch grid")
    return latent.reshape(c, f, h // 2, 2, w // 2, 2).permute(1, 2, 4, 0, 3, 5).reshape(f * (h // 2) * (w // 2), 4 * c)


def unpatchify(rows: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
    """patchify's inverse: rows [F H/2 W/2, 4C] -> video latent [C, F, H, W]."""
    c = rows.shape[1] // 4
    return rows.reshape(frames, height // 2, width // 2, c, 2, 2).permute(3, 0, 1, 4, 2, 5).reshape(
        c, frames, height, width)


def audio_to_rows(latent: torch.Tensor) -> torch.Tensor:
    """ComfyUI's AV audio latent [1, C, 2, Na] -> the packed audio rows [2 Na, C]: all of channel L, then R."""
    return latent[0].permute(1, 2, 0).reshape(-1, latent.shape[1])


def rows_to_audio(rows: torch.Tensor, channels: int = 2) -> torch.Tensor:
    """audio_to_rows' inverse: rows [channels Na, C] -> [1, C, channels, Na]."""
    return rows.reshape(channels, -1, rows.shape[1]).permute(2, 0, 1)[None]
