"""LTX-2.5's video VAE (ltx-2.5-video-vae: the original / ComfyUI names, optionally under 'vae.') in f32: the
decoder, whole or in the tiles of ComfyUI's VAEDecodeTiled, and the encoder for i2v keyframes
(reference/families/ltx25.md section 8).

Math as diffusers 0.42.1 autoencoder_kl_ltx2.py (LTX2VideoDecoder3d, LTX2VideoEncoder3d); names as its single-file
converter (convert_ltx2_vae_to_diffusers) reads them: `encoder.down_blocks.{even}` res blocks, `{odd}`
space-to-depth downsamplers, the last the mid block; `decoder.up_blocks.{even}` are res blocks
(`res_blocks.K.conv1.conv`, ...), `decoder.up_blocks.{odd}` depth-to-space upsamplers (`conv.conv`);
per_channel_statistics.{mean,std}-of-means the latent normalization. A timestep-conditioned decoder (`time_embedder`, `scale_shift_table`s,
`last_time_embedder`, `last_scale_shift_table`, `timestep_scale_multiplier`) is read when the file holds one."""
from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..modulation import sinusoids
from ..weights import Checkpoint, WeightsError, read_tensor
from .conv import checked_latents, feather, pixel_norm, sliding_tiles

LATENT_CHANNELS = 128
PATCH = 4  # pixels per side of a conv_out position (unpatchified from 48 = 3 x 4 x 4 channels)
STRIDE = (2, 2, 2)  # every upsampler: x2 in time, height and width ("compress_all"; not in the file)
TIME_FACTOR, SPACE_FACTOR = 8, 32  # F latents -> 8F - 7 frames; h -> 32h
NORM_EPS = 1e-8  # PerChannelRMSNorm's
TIME_CHANNELS = 256  # the timestep embedders' sinusoid width (PixArtAlphaCombinedTimestepSizeEmbeddings)
# VAEDecodeTiled's widgets in the LTX-2.5 template (reference/families/ltx25.md section 7): pixels and frames.
TEMPLATE_TILES = (512, 64, 64, 16)
ANCHOR = "per_channel_statistics.mean-of-means"
EXPECTED = ("an LTX-2 video VAE in its original names (decoder.conv_in.conv.*, decoder.up_blocks.N.res_blocks.K.*, "
            "decoder.up_blocks.N.conv.conv.*, decoder.conv_out.conv.*, per_channel_statistics.*), optionally under "
            "'vae.'")


@dataclass(frozen=True)
class VideoDecoderShape:
    """Channels of the res blocks from the latent end (the mid block first) and resnets in each; the rest is not
    in the file: whether the decoder's time padding is causal (the file's config `causal_decoder`, else False as
    LTX-2's), and whether upsamplers add their rearranged input (LTX-2: all do)."""
    channels: tuple[int, ...]
    layers: tuple[int, ...]
    out_channels: int = 3
    timestep_conditioning: bool = False
    causal: bool = False
    residual: bool = True


def tile_sizes(tile_size: int, overlap: int, temporal_size: int, temporal_overlap: int
               ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """VAEDecodeTiled's widgets (pixels, frames) -> latent (tile, overlap) per axis (t, h, w), with the same
    arithmetic as ComfyUI's node and VAE.decode_tiled for a x8 / x32 VAE."""
    if tile_size < overlap * 4:
        overlap = tile_size // 4
    if temporal_size < temporal_overlap * 2:
        temporal_overlap = temporal_overlap // 2
    tile_t = max(2, temporal_size // TIME_FACTOR)
    overlap_t = max(1, min(tile_t // 2, temporal_overlap // TIME_FACTOR))
    s, o = tile_size // SPACE_FACTOR, overlap // SPACE_FACTOR
    return (tile_t, s, s), (overlap_t, o, o)


class VideoDecoder:
    """LTX-2 video latents [B, 128, F, h, w] (normalized, as the sampler gives them) -> ComfyUI IMAGE
    [B * (8F - 7), 32h, 32w, 3] in 0..1."""

    def __init__(self, shape: VideoDecoderShape, weights: dict[str, torch.Tensor], latents_mean: torch.Tensor,
                 latents_std: torch.Tensor):
        self.shape = shape
        self.w = weights  # the file's names without the `decoder.` prefix
        self.latents_mean, self.latents_std = latents_mean, latents_std

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, causal: bool | None = None,
             residual: bool = True) -> VideoDecoder:
        """The decoder of `source`; causal None: the file's config (metadata 'config' -> 'vae' ->
        'causal_decoder', as ComfyUI reads it), else False."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED}")

        p = _prefix(ckpt, error)
        d = p + "decoder."
        if d + "conv_in.conv.weight" not in ckpt:
            raise error(f"no '{d}conv_in.conv.weight' tensor")
        conv_in = ckpt.shape(d + "conv_in.conv.weight")
        if len(conv_in) != 5 or conv_in[1] != LATENT_CHANNELS:
            raise error(f"'{d}conv_in.conv.weight' has shape {conv_in}, not [C, {LATENT_CHANNELS}, 3, 3, 3]")
        levels = 0
        while f"{d}up_blocks.{2 * levels}.res_blocks.0.conv1.conv.weight" in ckpt:
            levels += 1
        if levels == 0 or any(f"{d}up_blocks.{2 * i + 1}.conv.conv.weight" not in ckpt for i in range(levels - 1)):
            raise error("the up blocks do not alternate res blocks and upsamplers")
        channels = tuple(ckpt.shape(f"{d}up_blocks.{2 * i}.res_blocks.0.conv1.conv.weight")[0] for i in range(levels))
        layers = tuple(ckpt.numbered(f"{d}up_blocks.{2 * i}.res_blocks.", ".conv1.conv.weight") for i in range(levels))
        if causal is None:
            config = json.loads(ckpt.metadata.get("config", "{}")).get("vae") or {}
            causal = bool(config.get("causal_decoder", False))
        out = ckpt.shape(d + "conv_out.conv.weight")[0]
        shape = VideoDecoderShape(channels, layers, out // PATCH ** 2, d + "last_scale_shift_table" in ckpt,
                                  causal, residual)
        w = {name: read_tensor(ckpt, d + name, s) for name, s in decoder_tensors(shape).items()}
        extra = sorted(k for k in ckpt.keys() if k.startswith(d) and k[len(d):] not in w)  # noqa: SIM118
        if extra:
            raise error(f"unexpected decoder tensors {extra[:3]}{' ...' if len(extra) > 3 else ''}")
        return cls(shape, w, *_latent_stats(ckpt, p))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> VideoDecoder:
        """Weights on device in dtype (the statistics stay f32); IMAGE comes back on the CPU in f32."""
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()},
                          self.latents_mean.to(device), self.latents_std.to(device))

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents -> the decoder's (x * std + mean per channel; ComfyUI's un_normalize)."""
        view = (1, -1, 1, 1, 1)
        return latents * self.latents_std.view(view).to(latents) + self.latents_mean.view(view).to(latents)

    @torch.no_grad()  # not inference_mode: a node downstream may still modify the IMAGE in place
    def decode(self, latents: torch.Tensor, tiles: tuple[int, int, int, int] | None = TEMPLATE_TILES,
               timestep: float | None = None, progress: Callable[[int, int], None] | None = None,
               check: Callable[[], None] | None = None) -> torch.Tensor:
        """Normalized latents -> IMAGE frames in 0..1. tiles: VAEDecodeTiled's (tile_size, overlap,
        temporal_size, temporal_overlap) in pixels and frames, or None for a whole decode. timestep: the
        conditioned decoder's (diffusers' decode_timestep, ComfyUI's 0.05); the decode noise is the caller's
        to add. progress(done, total) after each tile; check() after each block (it raises to cancel)."""
        z = self._check(latents)
        tile, overlap = tile_sizes(*tiles) if tiles is not None else (z.shape[2:], (0, 0, 0))
        x = torch.cat([self.decode_raw(self.raw_latents(z[i:i + 1]), tile, overlap, timestep, progress, check)
                       for i in range(z.shape[0])])
        x = ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)
        return x.permute(0, 2, 3, 4, 1).flatten(0, 1).contiguous().cpu()

    def decode_raw(self, z: torch.Tensor, tile: tuple[int, ...], overlap: tuple[int, ...],
                   timestep: float | None = None, progress=None, check=None) -> torch.Tensor:
        """Raw latents [B, 128, F, h, w] -> pixels [B, 3, 8F - 7, 32h, 32w] in -1..1 from latent tiles (t, h, w)
        as ComfyUI's tiled_scale_multidim places and blends them: a tile from latent (f, y, x) lands at pixel
        (8f, 32y, 32x); each is feathered over its overlap (9 frames per latent of overlap: 8o - 7, and 32
        pixels) and the sum divided by the weights'. A latent that fits one tile is decoded whole."""
        if all(n <= t for n, t in zip(z.shape[2:], tile)):
            out = self.forward(z, timestep, check)
            if progress is not None:
                progress(1, 1)
            return out
        f, h, w = z.shape[2:]
        out = z.new_zeros(z.shape[0], self.shape.out_channels, TIME_FACTOR * f - 7, SPACE_FACTOR * h, SPACE_FACTOR * w)
        weight = z.new_zeros(1, 1, *out.shape[2:])
        axes = [sliding_tiles(n, t, o) for n, t, o in zip(z.shape[2:], tile, overlap)]
        factors = (TIME_FACTOR, SPACE_FACTOR, SPACE_FACTOR)
        widths = (TIME_FACTOR * overlap[0] - 7, SPACE_FACTOR * overlap[1], SPACE_FACTOR * overlap[2])
        total = len(axes[0]) * len(axes[1]) * len(axes[2])
        for done, ((t0, tn), (y0, yn), (x0, xn)) in enumerate(itertools.product(*axes), 1):
            px = self.forward(z[:, :, t0:t0 + tn, y0:y0 + yn, x0:x0 + xn], timestep, check)
            ramps = [feather(n, width).to(px) for n, width in zip(px.shape[2:], widths)]
            mask = ramps[0][:, None, None] * ramps[1][None, :, None] * ramps[2][None, None, :]
            at = tuple(slice(s * k, s * k + n) for s, k, n in zip((t0, y0, x0), factors, px.shape[2:]))
            out[(..., *at)] += px * mask
            weight[(..., *at)] += mask
            if progress is not None:
                progress(done, total)
        return out / weight

    def forward(self, z: torch.Tensor, timestep: float | None = None,
                check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents [B, 128, F, h, w] -> pixels [B, 3, 8F - 7, 32h, 32w] (diffusers' LTX2VideoDecoder3d)."""
        s, w, check = self.shape, self.w, check or (lambda: None)
        wt = w["conv_in.conv.weight"]
        x = self._conv(z.to(wt), "conv_in")
        t = None
        if s.timestep_conditioning:
            if timestep is None:
                raise ValueError("this LTX video VAE is timestep-conditioned: pass decode's timestep (e.g. 0.05)")
            t = torch.full((z.shape[0],), float(timestep), device=x.device) * w["timestep_scale_multiplier"]
        for level, layers in enumerate(s.layers):
            block = 2 * level
            if level > 0:
                x = self._upsample(x, f"up_blocks.{block - 1}.conv")
            emb = self._embed(t, f"up_blocks.{block}.time_embedder") if t is not None else None
            for k in range(layers):
                check()
                x = self._resnet(x, f"up_blocks.{block}.res_blocks.{k}", emb)
        mod = None
        if t is not None:
            shift, scale = (w["last_scale_shift_table"][None] + self._embed(t, "last_time_embedder").unflatten(
                1, (2, -1))).unbind(1)
            mod = scale, shift
        x = _norm_silu_conv(x, w, "conv_out", s.causal, "reflect", mod)
        b, _, f, h, wd = x.shape
        x = x.float().view(b, -1, PATCH, PATCH, f, h, wd)  # channel = c * 16 + (w offset) * 4 + (h offset)
        return x.permute(0, 1, 4, 5, 3, 6, 2).reshape(b, -1, f, h * PATCH, wd * PATCH)

    def _conv(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return _conv(x, self.w, name, self.shape.causal, "reflect")

    def _resnet(self, x: torch.Tensor, name: str, emb: torch.Tensor | None) -> torch.Tensor:
        return _resnet(x, self.w, name, self.shape.causal, "reflect", emb)

    def _upsample(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Depth to space x2 in (t, h, w), the first frame dropped (causal latents: 1 + 8k frames); residual: plus
        the input rearranged the same way, its channels repeated up to the output's."""
        y = _depth_to_space(self._conv(x, name))
        if self.shape.residual:
            r = _depth_to_space(x)  # added to each block of its channel count (broadcast: no repeated copy)
            y = (y.unflatten(1, (y.shape[1] // r.shape[1], r.shape[1])) + r[:, None]).flatten(1, 2)
        return y

    def _embed(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """PixArtAlphaCombinedTimestepSizeEmbeddings without size terms: linear_2(silu(linear_1(sinusoids)))."""
        w, e = self.w, sinusoids(t, TIME_CHANNELS)
        e = F.linear(e, w[f"{name}.timestep_embedder.linear_1.weight"], w[f"{name}.timestep_embedder.linear_1.bias"])
        return F.linear(F.silu(e), w[f"{name}.timestep_embedder.linear_2.weight"],
                        w[f"{name}.timestep_embedder.linear_2.bias"])

    def _check(self, latents: torch.Tensor) -> torch.Tensor:
        return checked_latents(latents, 5, LATENT_CHANNELS, 1, f"samples: expected LTX-2 video latents [B, "
                               f"{LATENT_CHANNELS}, F, h, w], got {{got}}; is this latent from another model family "
                               f"(or the audio part of an AV latent)?", self.w["conv_in.conv.weight"], torch.float32)


@dataclass(frozen=True)
class VideoEncoderShape:
    """Channels of each res-block stage (the mid block last), resnets in each, and each downsampler's stride
    (t, h, w), told apart in the file by its conv's width: out / stride product (x4 spatial, x2 temporal, x8)."""
    channels: tuple[int, ...]
    layers: tuple[int, ...]
    strides: tuple[tuple[int, int, int], ...]
    in_channels: int = 3


STRIDES = {4: (1, 2, 2), 2: (2, 1, 1), 8: (2, 2, 2)}  # product -> stride (diffusers' downsample_type)


class VideoEncoder:
    """LTX-2 video encoder: ComfyUI IMAGE frames [1 + 8k, H, W, 3] in 0..1 (H, W multiples of 32) -> normalized
    latents [1, 128, 1 + k, H / 32, W / 32] (the posterior mean, as ComfyUI's and diffusers' i2v conditioning
    take it)."""

    def __init__(self, shape: VideoEncoderShape, weights: dict[str, torch.Tensor], latents_mean: torch.Tensor,
                 latents_std: torch.Tensor):
        self.shape = shape
        self.w = weights  # the file's names without the `encoder.` prefix
        self.latents_mean, self.latents_std = latents_mean, latents_std

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint) -> VideoEncoder:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED} with its encoder.*")

        p = _prefix(ckpt, error)
        e = p + "encoder."
        if e + "conv_in.conv.weight" not in ckpt:
            raise error(f"no '{e}conv_in.conv.weight' tensor (a decoder-only file?)")
        stages = 0
        while f"{e}down_blocks.{2 * stages}.res_blocks.0.conv1.conv.weight" in ckpt:
            stages += 1
        res = [f"{e}down_blocks.{2 * i}.res_blocks." for i in range(stages)]
        channels = tuple(ckpt.shape(r + "0.conv1.conv.weight")[0] for r in res)
        layers = tuple(ckpt.numbered(r, ".conv1.conv.weight") for r in res)
        strides = []
        for i in range(stages - 1):
            name = f"{e}down_blocks.{2 * i + 1}.conv.conv.weight"
            width = ckpt.shape(name)[0] if name in ckpt else 0
            if not width or channels[i + 1] % width or channels[i + 1] // width not in STRIDES:
                raise error(f"no downsampler '{name}' from {channels[i]} to {channels[i + 1]} channels")
            strides.append(STRIDES[channels[i + 1] // width])
        in_channels = ckpt.shape(e + "conv_in.conv.weight")[1] // PATCH ** 2
        shape = VideoEncoderShape(channels, layers, tuple(strides), in_channels)
        w = {name: read_tensor(ckpt, e + name, s) for name, s in encoder_tensors(shape).items()}
        return cls(shape, w, *_latent_stats(ckpt, p))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> VideoEncoder:
        """Weights on device in dtype (the statistics stay f32); latents come back on that device."""
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()},
                          self.latents_mean.to(device), self.latents_std.to(device))

    @torch.no_grad()
    def encode(self, image: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """IMAGE [F, H, W, 3] in 0..1 -> normalized latents [1, 128, (F - 1) / 8 + 1, H / 32, W / 32]."""
        f, h, w = image.shape[:3]
        if image.dim() != 4 or (f - 1) % TIME_FACTOR or h % SPACE_FACTOR or w % SPACE_FACTOR:
            raise ValueError(f"pixels: expected IMAGE frames [1 + 8k, H, W, 3] with H and W multiples of "
                             f"{SPACE_FACTOR}, got {tuple(image.shape)}")
        wt = self.w["conv_in.conv.weight"]
        x = image[..., :self.shape.in_channels].to(wt.device, torch.float32).permute(3, 0, 1, 2)[None] * 2.0 - 1.0
        means = self.forward(x, check)
        view = (1, -1, 1, 1, 1)
        return (means - self.latents_mean.view(view).to(means)) / self.latents_std.view(view).to(means)

    def forward(self, x: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Pixels [B, 3, F, H, W] in -1..1 -> raw latent means [B, 128, (F - 1) / 8 + 1, H / 32, W / 32]
        (diffusers' LTX2VideoEncoder3d, causal in time, zero-padded in space; the log-variance channel dropped)."""
        s, w, check = self.shape, self.w, check or (lambda: None)
        b, c, f, hh, ww = x.shape
        # Patchify 4 x 4: channel c * 16 + (w offset) * 4 + (h offset), as the decoder's unpatchify reads it.
        x = x.to(w["conv_in.conv.weight"]).view(b, c, f, hh // PATCH, PATCH, ww // PATCH, PATCH)
        x = x.permute(0, 1, 6, 4, 2, 3, 5).reshape(b, c * PATCH ** 2, f, hh // PATCH, ww // PATCH)
        x = _conv(x, w, "conv_in", True, "constant")
        for i, layers in enumerate(s.layers):
            for k in range(layers):
                check()
                x = _resnet(x, w, f"down_blocks.{2 * i}.res_blocks.{k}", True, "constant")
            if i < len(s.strides):
                x = self._downsample(x, f"down_blocks.{2 * i + 1}.conv", s.strides[i])
        x = _conv(F.silu(pixel_norm(x, NORM_EPS)), w, "conv_out", True, "constant")
        return x[:, :LATENT_CHANNELS].float()

    def _downsample(self, x: torch.Tensor, name: str, stride: tuple[int, int, int]) -> torch.Tensor:
        """LTX2VideoDownsampler3d: the first stride_t - 1 frames repeated in front, then space to depth of the conv
        plus space to depth of the input averaged down to the output's channels."""
        x = torch.cat([x[:, :, :stride[0] - 1], x], dim=2)
        y = _space_to_depth(_conv(x, self.w, name, True, "constant"), stride)
        r = _space_to_depth(x, stride)
        return y + r.view(r.shape[0], y.shape[1], -1, *r.shape[2:]).mean(dim=2)


def _prefix(ckpt: Checkpoint, error: Callable[[str], WeightsError]) -> str:
    """The prefix before the VAE's names ('' in the VAE file, 'vae.' in a full checkpoint); the shortest if
    several (the audio VAE's 'audio_vae.' stands beside 'vae.' in a full checkpoint)."""
    found = [k[: -len(ANCHOR)] for k in ckpt.keys() if k.endswith(ANCHOR)  # noqa: SIM118 (a list)
             and (k == ANCHOR or k[-len(ANCHOR) - 1] == ".") and not k.startswith("audio_vae.")]
    if not found:
        raise error(f"no '{ANCHOR}' tensor")
    return min(found, key=len)


def _latent_stats(ckpt: Checkpoint, prefix: str) -> list[torch.Tensor]:
    """The latent normalization (ComfyUI's un_normalize: x * std + mean per channel): mean, std of the 128."""
    return [read_tensor(ckpt, f"{prefix}per_channel_statistics.{k}", (LATENT_CHANNELS,))
            for k in ("mean-of-means", "std-of-means")]


def _conv(x: torch.Tensor, w: dict, name: str, causal: bool, padding: str) -> torch.Tensor:
    """LTX2VideoCausalConv3d: time padded by repeating the first frame (causal) or both end frames, space padded by
    `padding` ('reflect': the decoder's; 'constant': the encoder's zeros), in one buffer the conv reads: x copied into
    its interior once (a concatenation, then a pad, copied it twice)."""
    weight = w[f"{name}.conv.weight"]
    k = weight.shape[2]
    front, back = (k - 1, 0) if causal else ((k - 1) // 2,) * 2
    ph, pw = weight.shape[3] // 2, weight.shape[4] // 2
    b, c, t, h, wd = x.shape
    if padding == "reflect" and (ph >= h or pw >= wd):
        raise ValueError(f"{name}: a reflection of {ph} rows and {pw} columns needs more than {h} x {wd} positions")
    buf = x.new_empty(b, c, front + t + back, h + 2 * ph, wd + 2 * pw)
    buf[:, :, front:front + t, ph:ph + h, pw:pw + wd].copy_(x)
    frames = buf[:, :, front:front + t]  # the borders: columns, then rows (the corners from the columns' borders)
    for i in range(1, pw + 1):
        frames[..., pw - i] = frames[..., pw + i] if padding == "reflect" else 0
        frames[..., -1 - pw + i] = frames[..., -1 - pw - i] if padding == "reflect" else 0
    for i in range(1, ph + 1):
        frames[..., ph - i, :] = frames[..., ph + i, :] if padding == "reflect" else 0
        frames[..., -1 - ph + i, :] = frames[..., -1 - ph - i, :] if padding == "reflect" else 0
    buf[:, :, :front] = buf[:, :, front:front + 1]
    buf[:, :, front + t:] = buf[:, :, front + t - 1:front + t]
    return F.conv3d(buf, weight, w[f"{name}.conv.bias"])


def _resnet(x: torch.Tensor, w: dict, name: str, causal: bool, padding: str,
            emb: torch.Tensor | None = None) -> torch.Tensor:
    """norm, (timestep scale/shift), silu, conv, twice, plus the input (channels never change in LTX-2's)."""
    mods = None
    if emb is not None:  # [B, 4C] + table [4, C] -> shift1, scale1, shift2, scale2, each [B, C]
        mods = (emb.unflatten(1, (4, -1)) + w[f"{name}.scale_shift_table"][None]).unbind(1)
    h = _norm_silu_conv(x, w, f"{name}.conv1", causal, padding, mods and (mods[1], mods[0]))
    return x + _norm_silu_conv(h, w, f"{name}.conv2", causal, padding, mods and (mods[3], mods[2]))


def _norm_silu_conv(x: torch.Tensor, w: dict, name: str, causal: bool, padding: str,
                    mod: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """conv `name` of silu(pixel norm of x, times 1 + scale plus shift where mod = (scale, shift) [B, C])."""
    h = pixel_norm(x, NORM_EPS)
    if mod is not None:
        h = h * (1 + mod[0].to(x)[..., None, None, None]) + mod[1].to(x)[..., None, None, None]
    return _conv(F.silu(h), w, name, causal, padding)


def _depth_to_space(x: torch.Tensor) -> torch.Tensor:
    """[B, C * 8, T, H, W] -> [B, C, 2T - 1, 2H, 2W]: channel c * 8 + 4i + 2j + k goes to (2t + i, 2h + j, 2w + k);
    the first frame dropped."""
    b, c, t, h, w = x.shape
    st, sh, sw = STRIDE
    x = x.view(b, c // (st * sh * sw), st, sh, sw, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, -1, t * st, h * sh, w * sw)[:, :, st - 1:]


def _space_to_depth(x: torch.Tensor, stride: tuple[int, int, int]) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, C * st * sh * sw, T / st, H / sh, W / sw]: (st t + i, sh h + j, sw w + k) goes to
    channel c * st sh sw + (i sh + j) sw + k (the inverse of _depth_to_space's order, no frame dropped)."""
    b, c, t, h, w = x.shape
    st, sh, sw = stride
    x = x.view(b, c, t // st, st, h // sh, sh, w // sw, sw).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, c * st * sh * sw, t // st, h // sh, w // sw)


def encoder_tensors(shape: VideoEncoderShape) -> dict[str, tuple[int, ...]]:
    """Every encoder tensor the forward reads (names without `encoder.`), with its shape."""
    t: dict[str, tuple[int, ...]] = {}

    def conv(name: str, cin: int, cout: int) -> None:
        t[f"{name}.conv.weight"], t[f"{name}.conv.bias"] = (cout, cin, 3, 3, 3), (cout,)

    ch = shape.channels
    conv("conv_in", shape.in_channels * PATCH ** 2, ch[0])
    for i, (c, layers) in enumerate(zip(ch, shape.layers)):
        for k in range(layers):
            conv(f"down_blocks.{2 * i}.res_blocks.{k}.conv1", c, c)
            conv(f"down_blocks.{2 * i}.res_blocks.{k}.conv2", c, c)
        if i < len(shape.strides):
            conv(f"down_blocks.{2 * i + 1}.conv", c, ch[i + 1] // math.prod(shape.strides[i]))
    conv("conv_out", ch[-1], LATENT_CHANNELS + 1)
    return t


def decoder_tensors(shape: VideoDecoderShape) -> dict[str, tuple[int, ...]]:
    """Every decoder tensor the forward reads (names without `decoder.`), with its shape."""
    t: dict[str, tuple[int, ...]] = {}

    def conv(name: str, cin: int, cout: int) -> None:
        t[f"{name}.conv.weight"], t[f"{name}.conv.bias"] = (cout, cin, 3, 3, 3), (cout,)

    def embedder(name: str, width: int) -> None:
        e = f"{name}.timestep_embedder."
        t[e + "linear_1.weight"], t[e + "linear_1.bias"] = (width, TIME_CHANNELS), (width,)
        t[e + "linear_2.weight"], t[e + "linear_2.bias"] = (width, width), (width,)

    ch, cond = shape.channels, shape.timestep_conditioning
    conv("conv_in", LATENT_CHANNELS, ch[0])
    for level, (c, layers) in enumerate(zip(ch, shape.layers)):
        block = 2 * level
        if level > 0:
            conv(f"up_blocks.{block - 1}.conv", ch[level - 1], c * 8)
        if cond:
            embedder(f"up_blocks.{block}.time_embedder", 4 * c)
        for k in range(layers):
            r = f"up_blocks.{block}.res_blocks.{k}"
            conv(f"{r}.conv1", c, c)
            conv(f"{r}.conv2", c, c)
            if cond:
                t[f"{r}.scale_shift_table"] = (4, c)
    if cond:
        t["timestep_scale_multiplier"] = ()
        embedder("last_time_embedder", 2 * ch[-1])
        t["last_scale_shift_table"] = (2, ch[-1])
    conv("conv_out", ch[-1], shape.out_channels * PATCH ** 2)
    return t
