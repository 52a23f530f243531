"""MiniMax H3 (text + image to video + audio) on the shared block, on the host: the Comfy-Org single file -> text
refiner, blocks, final layer, over one packed sequence of text, condition (keyframe, reference), audio and video rows.

Facts: reference/families/minimax_h3.md (diffusers 0.42.1 transformer_minimax_h3.py; single_file_utils.py
convert_minimax_h3_transformer_checkpoint_to_diffusers for the names, whose inverse the file's names are). The layout
is converted once, here, at load: QKV as stored (the Comfy-Org files stack [q; k; v]), fc1's [gate; value] halves
interleaved into UP. The attention is wider than the residual (56 heads x 128 = 7168 over 5376: Arch.inner) and
turns the first 96 of a head's 128 values (three axes of 16 frequencies, split halves). Time is t = 1 - sigma
(1 = clean, unscaled) and the velocity points data-ward: x0 = x + sigma v (section 11, item 4).

A layer is a block with its modulation linear (40% of its bytes), the unit that stays on the GPU or streams.
sampling/minimax_h3.py runs a prompt on it (sample_t2va).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Block, rms_norm
from ..linear import float_on, linear
from ..modulation import Modulation, sinusoids
from ..sequence import Sequence
from ..weights import Checkpoint, Linear, WeightsError, read_tensor
from .loading import Detection, OpenedFile

PREFIXES = ("model.diffusion_model.", "")
MARKER = "token_refiner.blocks.0.attn.qkv_proj.weight"
TIME_TABLE = "adaln_t_table"  # the "pruned" files' curve form of the time embedding (section 5, variants)
PATCH = (1, 2, 2)
EPS = 1e-5  # block, head and final norms alike (section 1)
ROPE_THETA = 10000.0
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
# Indexes of a block's six modulation rows in adaln_proj's output (diffusers' shift, scale, gate order).
SHIFT1, SCALE1, GATE1, SHIFT2, SCALE2, GATE2 = range(6)

# The file's names of its linears -> diffusers' (LoRAs trained on diffusers): single_file_utils.py's converter, in
# the other direction. QKV's three parts map to its row blocks; fc1 has no alias, as diffusers holds its halves in
# the other order ([value; gate]), which no first row expresses.
DIFFUSERS_PREFIXES = (("blocks.", "transformer_blocks."), ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
                      ("time_embedder.proj_in", "time_embedder.linear_1"),
                      ("time_embedder.proj_out", "time_embedder.linear_2"), ("video_patch_proj", "proj_in"),
                      ("audio_patch_proj", "audio_proj_in"), ("condition_proj", "context_embedder"),
                      ("final_layer.adaln_proj.linear", "norm_out.linear"), ("final_layer.video_out", "proj_out"),
                      ("final_layer.audio_out", "audio_proj_out"))
DIFFUSERS_LINEARS = {"attn.out_proj": "attn.to_out.0", "mlp.fc2": "ff.net.2", "adaln_proj.linear": "adaln_proj.linear"}

DETECTION = Detection((MARKER,), PREFIXES, "a MiniMax H3 diffusion model",
                      "a MiniMax H3 file such as minimax_h3_fl2va_pruned_int8_convrot.safetensors")


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


def lora_aliases(names: set[str], inner: int) -> dict[str, tuple[str, int]]:
    """diffusers' names of H3's linears -> (the file's name, first row); q, k and v land on QKV's rows 0, inner and
    2 inner (LoRAs merge into each linear as it is read, QKV as stored)."""
    aliases = {}
    for name in names:
        for old, new in DIFFUSERS_PREFIXES:
            if name.startswith(old):
                alias = new + name[len(old):]
                break
        else:
            continue
        if name.endswith(".attn.qkv_proj"):
            base = alias[: -len("qkv_proj")]
            aliases.update({f"{base}to_{n}": (name, i * inner) for i, n in enumerate("qkv")})
            continue
        for old, new in DIFFUSERS_LINEARS.items():
            if alias.endswith("." + old):
                alias = alias[: -len(old)] + new
                break
        else:
            if name.startswith(("blocks.", "token_refiner.")):
                continue  # fc1, and norms: no diffusers alias
        aliases[alias] = (name, 0)
    return aliases


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


def read_arch(ckpt: Checkpoint, p: str) -> Arch:
    """The blocks' Arch from the file's shapes (section 1). The rotary turns three axes of rope_freq_dim
    frequencies each (rope.inv_freq where the file keeps it, else an eighth of a head: 16 of 128, as released)."""
    hidden, video_in = ckpt.shape(f"{p}video_patch_proj.weight")
    head = ckpt.shape(f"{p}blocks.0.attn.q_norm.weight")[0]
    inner = ckpt.shape(f"{p}blocks.0.attn.out_proj.weight")[1]
    freqs = ckpt.shape(f"{p}rope.inv_freq")[0] if f"{p}rope.inv_freq" in ckpt else head // 8
    if f"{p}{TIME_TABLE}" in ckpt:
        freq_dim, time_hidden, time_dim = 0, 0, ckpt.shape(f"{p}{TIME_TABLE}")[1]
    else:
        time_hidden, freq_dim = ckpt.shape(f"{p}time_embedder.proj_in.weight")
        time_dim = ckpt.shape(f"{p}time_embedder.proj_out.weight")[0]
    if video_in % math.prod(PATCH) or inner % head:
        raise WeightsError(f"{ckpt.path.name}: video rows of {video_in} values or attention {inner} wide in heads "
                           f"of {head} do not fit MiniMax H3")
    return Arch(family="minimax_h3", hidden=hidden, layers=ckpt.numbered(f"{p}blocks.", ".attn.qkv_proj.weight"),
                refiner=ckpt.numbered(f"{p}token_refiner.blocks.", ".attn.qkv_proj.weight"), heads=inner // head,
                head=head, inner=inner, ffn=ckpt.shape(f"{p}blocks.0.mlp.fc2.weight")[1],
                latents=video_in // math.prod(PATCH), patch=PATCH,
                text_dim=ckpt.shape(f"{p}condition_proj.weight")[1], freq_dim=freq_dim, time_hidden=time_hidden,
                time_dim=time_dim, eps=EPS, qk_eps=EPS, final_eps=EPS, rope_axes=(2 * freqs,) * 3,
                rope_theta=ROPE_THETA)


def _read_block(ckpt: Checkpoint, stem: str, a: Arch, lin) -> Block:
    """Block `stem` (full key prefix): QKV as stored ([q; k; v]), UP = gluRows of fc1's [gate; value] halves."""
    qkv = lin(f"{stem}attn.qkv_proj")
    if qkv.weight.shape != (a.qkv_width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{stem}attn.qkv_proj' is {tuple(qkv.weight.shape)}, expected "
                           f"{(a.qkv_width, a.hidden)}")
    up = lin(f"{stem}mlp.fc1").rows(torch.stack([torch.arange(a.ffn), a.ffn + torch.arange(a.ffn)], 1).reshape(-1))
    norm = lambda key, n: read_tensor(ckpt, f"{stem}{key}.weight", (n,))  # noqa: E731
    return Block((qkv, lin(f"{stem}attn.out_proj"), up, lin(f"{stem}mlp.fc2"), norm("norm1", a.hidden),
                  norm("norm2", a.hidden), norm("attn.q_norm", a.head), norm("attn.k_norm", a.head), None, None))


def unrotated(rows: int) -> Sequence:
    """rows that attend with no rotary and one modulation row (the token refiner)."""
    empty = torch.zeros(rows, 0)
    return Sequence(torch.zeros(rows, dtype=torch.long), empty, empty)


@dataclass(frozen=True)
class Layer:
    """One block and its modulation linear (adaln_proj: 40% of the block's bytes), the unit that streams."""
    block: Block
    modulation: Linear   # time_dim -> 3 modalities x 6 x hidden

    def on(self, device: torch.device) -> Layer:
        """The layer as it runs on a CUDA device: both through the GPU block's linears (dit_core/gpu/block.py)."""
        from ..gpu.block import GpuBlock, GpuLinear  # the GPU path: imported where used
        return Layer(GpuBlock.of(self.block, device), GpuLinear.of(self.modulation, device))

    def modulation_rows(self, temb: torch.Tensor, options) -> torch.Tensor:
        """adaln_proj(temb) [nT, 18 hidden] f32: the host linear, or the GPU linear's product (bf16 out)."""
        if isinstance(self.modulation, Linear):
            return linear(temb, self.modulation)
        from ..gpu.block import product
        return product(temb, self.modulation, options).float()


@dataclass(frozen=True)
class MiniMaxH3:
    """MiniMax H3 where it runs: the text embedder and token refiner, the video and audio embedders, the time
    embedding (an MLP, or the pruned files' table), the layers (blocks with their modulation linears), the final
    layer."""
    arch: Arch
    text_in: Linear
    refiners: tuple[Block, ...]
    refiner_norm: torch.Tensor
    video_in: Linear
    audio_in: Linear
    time: tuple[Linear, Linear] | None   # time_embedder: freq_dim -> time_hidden -> time_dim (SiLU between)
    time_table: torch.Tensor | None      # [grid, time_dim] f32: the curve form, already past the SiLU
    blocks: tuple[Layer, ...]            # or StreamedBlocks of them (dit_core/gpu/streaming.py)
    final_modulation: Linear             # time_dim -> [shift | scale]
    final_norm: torch.Tensor
    video_out: Linear
    audio_out: Linear
    # The GPU path's options (dit_core/gpu/options.py), passed to each block: set by to(), default_options()'s
    # unless given; None on a model never moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """H3's GPU options: the engine's defaults (cuDNN's bf16 attention scores)."""
        from ..gpu.options import Options
        return Options(int8_attention=False)

    @property
    def device(self) -> torch.device:
        return self.video_in.weight.device

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             loras: tuple[tuple[str | Path, float], ...] = ()) -> MiniMaxH3:
        """MiniMax H3 from the Comfy-Org single file (optional model.diffusion_model. prefix; the time embedding as
        time_embedder or as the pruned files' adaln_t_table). linears: 'stored' keeps each block linear as stored,
        'int8' quantizes float ones to INT8 ConvRot, 'bf16' dequantizes INT8 ones. loras: (file, strength) pairs in
        the file's own names, merged into the linears as they load."""
        opened = OpenedFile.open(path, DETECTION, linears)
        ckpt, p = opened.ckpt, opened.prefix
        a = read_arch(ckpt, p)
        opened = opened.with_loras(loras, lambda names: lora_aliases(names, a.inner))
        lin = lambda key: opened.linear(key[len(p):])  # noqa: E731 (key: the full prefix, less .weight)
        blocks = lambda stem, n: tuple(opened.convert(_read_block(ckpt, f"{p}{stem}{i}.", a, lin))  # noqa: E731
                                       for i in range(n))
        curve = f"{p}{TIME_TABLE}" in ckpt
        return MiniMaxH3(
            arch=a, text_in=lin(f"{p}condition_proj"), refiners=blocks("token_refiner.blocks.", a.refiner),
            refiner_norm=read_tensor(ckpt, f"{p}token_refiner.final_norm.weight", (a.hidden,)),
            video_in=lin(f"{p}video_patch_proj"), audio_in=lin(f"{p}audio_patch_proj"),
            time=None if curve else (lin(f"{p}time_embedder.proj_in"), lin(f"{p}time_embedder.proj_out")),
            time_table=read_tensor(ckpt, f"{p}{TIME_TABLE}") if curve else None,
            blocks=tuple(Layer(b, lin(f"{p}blocks.{i}.adaln_proj.linear"))
                         for i, b in enumerate(blocks("blocks.", a.layers))),
            final_modulation=lin(f"{p}final_layer.adaln_proj.linear"),
            final_norm=read_tensor(ckpt, f"{p}final_layer.norm.weight", (a.hidden,)),
            video_out=lin(f"{p}final_layer.video_out"), audio_out=lin(f"{p}final_layer.audio_out"))

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> MiniMaxH3:
        """H3 where it runs: on a CUDA device the layers and the token refiner become GPU blocks (INT8 ConvRot
        linears on the matrix cores, or BF16; the modulation linears too), the small linears and tensors f32 there.
        With budget_bytes the layers take at most that much device memory: those that do not fit stream from host
        memory (dit_core/gpu/streaming.py; on the CPU through CPU slots, the same numerics); a function of the
        layers' total bytes is asked once the rest is on the device. options: the GPU path's (by default the
        model's, else default_options())."""
        dev = torch.device(device)
        options = options or self.options or self.default_options()
        from ..gpu.streaming import StreamedBlocks  # the GPU path: imported where used
        cuda = dev.type == "cuda"
        if budget_bytes is None:
            return self.gpu_form(dev, options) if cuda else replace(self, options=options)
        form = (lambda layer, where: layer.on(where)) if cuda else None
        placed = self.gpu_form(dev, options, with_layers=False) if cuda else replace(self, options=options)
        return replace(placed, blocks=StreamedBlocks(self.blocks, dev, budget_bytes, form=form))

    def gpu_form(self, device: torch.device, options, with_layers: bool = True) -> MiniMaxH3:
        """The model as the GPU path runs it on `device` (a CUDA device; on the CPU the kernels' references run,
        as the tests use it): GPU blocks and linears for the layers (unless with_layers is False) and the token
        refiner, the small linears and tensors f32."""
        from ..gpu.block import GpuBlock
        small = lambda lin: float_on(lin, device)  # noqa: E731
        return replace(self, text_in=small(self.text_in),
                       refiners=tuple(GpuBlock.of(b, device) for b in self.refiners),
                       refiner_norm=self.refiner_norm.float().to(device), video_in=small(self.video_in),
                       audio_in=small(self.audio_in), time=None if self.time is None else tuple(map(small, self.time)),
                       time_table=None if self.time_table is None else self.time_table.float().to(device),
                       blocks=tuple(layer.on(device) for layer in self.blocks) if with_layers else self.blocks,
                       final_modulation=small(self.final_modulation), final_norm=self.final_norm.float().to(device),
                       video_out=small(self.video_out), audio_out=small(self.audio_out), options=options)

    def time_rows(self, times: torch.Tensor) -> torch.Tensor:
        """The modulation linears' input [nT, time_dim] f32 for times t = 1 - sigma [nT]: silu(time_embedder(
        [cos | sin] of t)), t unscaled; or, in the curve form, the table at clamp(t, 0, 1) by linear interpolation
        between its grid points (ComfyUI's rule, section 5: the table already holds the activation)."""
        if self.time_table is None:
            first, second = self.time
            return F.silu(linear(F.silu(linear(sinusoids(times, self.arch.freq_dim), first)), second))
        grid = self.time_table.shape[0]
        pos = times.float().clamp(0, 1) * (grid - 1)
        i0 = pos.floor().long().clamp(max=grid - 2)
        table = self.time_table.to(times.device)
        return torch.lerp(table[i0], table[i0 + 1], (pos - i0)[:, None])

    def text_rows(self, text: torch.Tensor) -> torch.Tensor:
        """Text features [Nt, text_dim] -> refined rows [Nt, hidden]: context embedder, the unmodulated refiner
        blocks (no rotary), their final norm. They do not change between steps, so a sampler refines them once."""
        a = self.arch
        x = linear(text.to(self.device), self.text_in).to(torch.promote_types(text.dtype, torch.float32))
        seq, m = unrotated(x.shape[0]).to(x.device), Modulation.identity(a.hidden, dtype=x.dtype, device=x.device)
        for block in self.refiners:
            x = block.forward(a, x, m, seq, options=self.options)
        return rms_norm(x, self.refiner_norm, a.final_eps)

    def sequence(self, layout: Layout, time_index: torch.Tensor) -> Sequence:
        """The packed rows' Sequence: modulation row time_index * 3 + tag; angles of fp32 positions times the fp32
        frequencies, per axis, as diffusers and ComfyUI compute them (positions cast from float64 first)."""
        a = self.arch
        freqs = a.rope_axes[0] // 2
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, 2 * freqs, 2, dtype=torch.float32) / (2 * freqs)))
        angles = (layout.positions.float()[:, :, None] * inv_freq).reshape(layout.rows, -1)
        return Sequence(time_index.long() * MODALITIES + layout.tags, angles.cos(), angles.sin())

    def velocity(self, video: torch.Tensor, audio: torch.Tensor, txt: torch.Tensor, layout: Layout,
                 times: torch.Tensor, time_index: torch.Tensor,
                 check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(video velocity [video rows, 4C], audio velocity [audio rows, C_audio]) of one packed sequence: video rows
        [condition + target rows, 4C] (patchify's), audio rows [condition + target rows, C_audio] (channel-major),
        refined text rows txt [Nt, hidden] (text_rows'), the distinct times [nT] (t = 1 - sigma) and each row's
        index into them (row_times'). Condition rows' output is returned too; they are not stepped. check() runs
        after each block (ComfyUI's cancel within a step)."""
        a = self.arch
        want = (layout.video_rows.shape[0], layout.audio_rows.shape[0], layout.text)
        if (video.shape[0], audio.shape[0], txt.shape[0]) != want:
            raise ValueError(f"MiniMaxH3: {video.shape[0]} video, {audio.shape[0]} audio and {txt.shape[0]} text rows "
                             f"for a layout of {want[0]}, {want[1]} and {want[2]}")
        video_rows, audio_rows = layout.video_rows.to(txt.device), layout.audio_rows.to(txt.device)
        x = txt.new_zeros(layout.rows, a.hidden)
        x[:layout.text] = txt
        x[video_rows] = linear(video, self.video_in).to(x.dtype)
        x[audio_rows] = linear(audio, self.audio_in).to(x.dtype)
        temb = self.time_rows(times.to(txt.device))
        seq = self.sequence(layout, time_index).to(txt.device)
        for layer in self.blocks:
            # [nT, 18 hidden] -> rows t0m0, t0m1, t0m2, t1m0, ... of six [3 nT, hidden] parts
            rows = layer.modulation_rows(temb, self.options).reshape(-1, 6, a.hidden).unbind(1)
            x = layer.block.forward(a, x, Modulation(attn_scale=rows[SCALE1], attn_gate=rows[GATE1],
                                                     mlp_scale=rows[SCALE2], mlp_gate=rows[GATE2],
                                                     attn_shift=rows[SHIFT1], mlp_shift=rows[SHIFT2]), seq,
                                    options=self.options)
            if check is not None:
                check()
        shift, scale = linear(temb, self.final_modulation).chunk(2, dim=-1)
        index = time_index.long().to(txt.device)
        y = rms_norm(x, self.final_norm, a.final_eps) * (1 + scale[index]) + shift[index]
        return linear(y[video_rows], self.video_out), linear(y[audio_rows], self.audio_out)

    def output(self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, layout: Layout,
               times: torch.Tensor, time_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """velocity() from the text encoder's features text [Nt, text_dim]."""
        return self.velocity(video, audio, self.text_rows(text), layout, times, time_index)

    def denoised(self, video: torch.Tensor, audio: torch.Tensor, txt: torch.Tensor, layout: Layout,
                 sigma_video: float, sigma_audio: float,
                 check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x0 of the target rows, x + sigma v (H3's velocity points data-ward), each stream at its own sigma; the
        condition rows come back as given. Rows and txt as velocity's."""
        times, index = row_times(layout, 1.0 - sigma_video, 1.0 - sigma_audio)
        v_video, v_audio = self.velocity(video, audio, txt, layout, times, index, check)
        x0_video = video + sigma_video * v_video.to(video.dtype)
        x0_audio = audio + sigma_audio * v_audio.to(audio.dtype)
        x0_video[:layout.video_conditions] = video[:layout.video_conditions]
        x0_audio[:layout.audio_conditions] = audio[:layout.audio_conditions]
        return x0_video, x0_audio
