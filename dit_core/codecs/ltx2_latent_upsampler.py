"""LTX-2.5's latent spatial upsampler (ltx-2.5-latent-spatial-upscaler-x2: twice the video latent's height and
width) in f32, and ComfyUI's LTXVLatentUpsampler around it (the latent un-normalized by the video VAE's statistics,
upsampled, normalized again); reference/families/ltx25.md sections 7-8.

Math as diffusers 0.42.1 pipelines/ltx2/latent_upsampler.py (LTX2LatentUpsamplerModel, spatial x2): a conv from the
latent to `mid` channels, GroupNorm(32) and SiLU, res blocks (conv, norm, SiLU, conv, norm, SiLU of the sum), a 2-D
conv to 4 mid channels per frame and a 2 x 2 pixel shuffle, res blocks, a conv back. Names as the file (and
ComfyUI's loader, which builds the module from the header's config) holds them: initial_conv, initial_norm,
res_blocks.N.{conv1, norm1, conv2, norm2}, the upsampler's conv as upsampler.conv (the rational resampler at scale 2:
its blur is stride 1, nothing) or upsampler.0 (the plain one), post_upsample_res_blocks.N, final_conv. Convolutions
are 3-D (3 x 3 x 3, zero padded) or, in a dims=2 file, 2-D per frame, as the initial conv's weight says."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor

GROUPS = 32
EPS = 1e-5  # torch.nn.GroupNorm's default, which the model keeps
ANCHOR = "post_upsample_res_blocks.0.conv2.bias"  # ComfyUI's LatentUpscaleModelLoader's detection key
UPSAMPLER_CONVS = ("upsampler.conv", "upsampler.0")
EXPECTED = ("an LTX-2 latent spatial upsampler (initial_conv.*, res_blocks.N.*, upsampler.conv.* or upsampler.0.*, "
            "post_upsample_res_blocks.N.*, final_conv.*) such as ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0")
RES_BLOCK = ("conv1", "norm1", "conv2", "norm2")


@dataclass(frozen=True)
class UpsamplerShape:
    channels: int  # the latent's (128)
    mid: int       # the inner width (1024 released)
    blocks: int    # res blocks before and after the upsampling each
    dims: int      # 3: 3-D convolutions; 2: 2-D per frame
    upsampler: str  # the upsampling conv's name in the file (UPSAMPLER_CONVS)


class LatentUpsampler:
    """Raw (un-normalized) video latents [B, C, F, H, W] -> [B, C, F, 2H, 2W]; upsample() takes and gives the
    normalized latents the sampler works on."""

    def __init__(self, shape: UpsamplerShape, weights: dict[str, torch.Tensor]):
        self.shape = shape
        self.w = weights

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint) -> LatentUpsampler:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED}")

        if ANCHOR not in ckpt or "initial_conv.weight" not in ckpt:
            raise error(f"no '{ANCHOR}' or 'initial_conv.weight' tensor")
        config = json.loads(ckpt.metadata.get("config", "{}"))
        if config.get("temporal_upsample") or not config.get("spatial_upsample", True):
            raise error("the header's config describes a temporal upsampler; only the spatial x2 one is supported")
        scale = float(config.get("spatial_scale", config.get("rational_spatial_scale", 2.0)))
        if scale != 2.0:
            raise error(f"the header's config asks for spatial scale {scale}; only x2 is supported")
        initial = ckpt.shape("initial_conv.weight")
        names = [n for n in UPSAMPLER_CONVS if f"{n}.weight" in ckpt]
        if not names:
            raise error(f"no upsampling conv ({' or '.join(n + '.weight' for n in UPSAMPLER_CONVS)})")
        up = ckpt.shape(f"{names[0]}.weight")
        if len(initial) not in (4, 5) or len(up) != 4 or up[0] != 4 * initial[0]:
            raise error(f"initial_conv.weight {initial} and {names[0]}.weight {up} are not a spatial x2 upsampler's "
                        f"([mid, C, 3, 3(, 3)] and a 2-D conv to 4 mid channels)")
        shape = UpsamplerShape(initial[1], initial[0], ckpt.numbered("res_blocks.", ".conv1.weight"), len(initial) - 2,
                               names[0])
        if shape.mid % GROUPS:
            raise error(f"{shape.mid} inner channels do not split into {GROUPS} norm groups")
        expected = upsampler_tensors(shape)
        w = {name: read_tensor(ckpt, name, s) for name, s in expected.items()}
        blur = f"{shape.upsampler.split('.')[0]}.blur_down.kernel"  # the rational resampler's buffer, unused at x2
        extra = sorted(k for k in ckpt.keys() if k not in w and k != blur)  # noqa: SIM118 (a list)
        if extra:
            raise error(f"unexpected tensors {extra[:3]}{' ...' if len(extra) > 3 else ''}")
        return cls(shape, w)

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> LatentUpsampler:
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()})

    @property
    def device(self) -> torch.device:
        return self.w["initial_conv.weight"].device

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """Raw latents [B, C, F, H, W] -> [B, C, F, 2H, 2W] f32, on the upsampler's device."""
        s, w = self.shape, self.w
        if latents.ndim != 5 or latents.shape[1] != s.channels:
            raise ValueError(f"LatentUpsampler: latents must be [B, {s.channels}, F, H, W], got "
                             f"{tuple(latents.shape)}")
        b, _, f, _, _ = latents.shape
        x = latents.to(self.device, w["initial_conv.weight"].dtype)
        if s.dims == 2:
            x = per_frame(x)
        x = F.silu(_norm(_conv(x, w, "initial_conv"), w, "initial_norm"))
        for k in range(s.blocks):
            x = _res_block(x, w, f"res_blocks.{k}")
        x = per_frame(x) if s.dims == 3 else x
        x = F.pixel_shuffle(_conv(x, w, s.upsampler), 2)  # b (c 2 2) h w -> b c (h 2) (w 2)
        x = x if s.dims == 2 else frames_back(x, b, f)
        for k in range(s.blocks):
            x = _res_block(x, w, f"post_upsample_res_blocks.{k}")
        x = _conv(x, w, "final_conv")
        return frames_back(x, b, f) if s.dims == 2 else x

    def upsample(self, latents: torch.Tensor, latents_mean: torch.Tensor, latents_std: torch.Tensor) -> torch.Tensor:
        """ComfyUI's LTXVLatentUpsampler on normalized latents: x std + mean per channel (the video VAE's
        per_channel_statistics, e.g. VideoDecoder.latents_mean / latents_std), upsampled on the upsampler's device,
        then (y - mean)/std; on the latents' device in their dtype."""
        view = (1, -1, 1, 1, 1)
        mean, std = (t.to(self.device, torch.float32).view(view) for t in (latents_mean, latents_std))
        y = self(latents.to(self.device, torch.float32) * std + mean).float()
        return ((y - mean) / std).to(latents.device, latents.dtype)


def per_frame(x: torch.Tensor) -> torch.Tensor:
    """[B, C, F, H, W] -> [B F, C, H, W]."""
    return x.transpose(1, 2).flatten(0, 1)


def frames_back(x: torch.Tensor, batch: int, frames: int) -> torch.Tensor:
    """[B F, C, H, W] -> [B, C, F, H, W]."""
    return x.unflatten(0, (batch, frames)).transpose(1, 2)


def _conv(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    weight = w[f"{name}.weight"]
    conv = F.conv3d if weight.ndim == 5 else F.conv2d
    return conv(x, weight, w[f"{name}.bias"], padding=weight.shape[-1] // 2)


def _norm(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return F.group_norm(x, GROUPS, w[f"{name}.weight"], w[f"{name}.bias"], EPS)


def _res_block(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    h = F.silu(_norm(_conv(x, w, f"{name}.conv1"), w, f"{name}.norm1"))
    return F.silu(_norm(_conv(h, w, f"{name}.conv2"), w, f"{name}.norm2") + x)


def upsampler_tensors(shape: UpsamplerShape) -> dict[str, tuple[int, ...]]:
    """Every tensor the file holds for `shape`, with its shape (the rational resampler's blur kernel aside)."""
    c, m = shape.channels, shape.mid
    k = (3,) * shape.dims
    out = {"initial_conv.weight": (m, c, *k), "initial_conv.bias": (m,), "initial_norm.weight": (m,),
           "initial_norm.bias": (m,), f"{shape.upsampler}.weight": (4 * m, m, 3, 3),
           f"{shape.upsampler}.bias": (4 * m,),
           "final_conv.weight": (c, m, *k), "final_conv.bias": (c,)}
    for stage in ("res_blocks", "post_upsample_res_blocks"):
        for i in range(shape.blocks):
            for part in RES_BLOCK:
                stem = f"{stage}.{i}.{part}"
                out[f"{stem}.weight"] = (m, m, *k) if part.startswith("conv") else (m,)
                out[f"{stem}.bias"] = (m,)
    return out
