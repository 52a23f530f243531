"""LTX-2.5's audio VAE decoder (ltx-2.5-audio-vae: `audio_vae.*` beside the vocoder's `vocoder.*`) in f32: latents
[B, 8, L, 16] -> stereo log-mel [B, 2, 4L - 3, 64] (reference/families/ltx25.md section 8).

Math as diffusers 0.42.1 autoencoder_kl_ltx2_audio.py (LTX2AudioDecoder with norm_type "pixel", causality_axis
"height": time is the height axis); names as its single-file converter reads them (convert_ltx2_audio_vae_to_
diffusers: the prefix dropped, per_channel_statistics.{mean,std}-of-means the latent normalization over the 128
values of a latent row, channel-major). No attention: the released config has neither attn_resolutions nor a
mid-block attention, and a file with such tensors is refused."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor
from .conv import checked_latents, pixel_norm

LATENT_CHANNELS = 8
NORM_EPS = 1e-6  # LTX2AudioPixelNorm's
ANCHOR = "decoder.conv_in.conv.weight"
EXPECTED = ("an LTX-2 audio VAE (audio_vae.decoder.conv_in.conv.*, audio_vae.decoder.mid.*, "
            "audio_vae.decoder.up.N.block.M.*, audio_vae.decoder.conv_out.conv.*, audio_vae.per_channel_statistics.*)")


@dataclass(frozen=True)
class AudioDecoderShape:
    channels: tuple[int, ...]  # per level, level 0 (full resolution) first: base x ch_mult
    blocks: int  # resnets per level (diffusers num_res_blocks + 1)
    out_channels: int  # 2: stereo


class AudioDecoder:
    """LTX-2 audio latents [B, 8, L, 16] (normalized, as the sampler gives them) -> log-mel [B, 2, 4L - 3, 64]."""

    def __init__(self, shape: AudioDecoderShape, weights: dict[str, torch.Tensor], latents_mean: torch.Tensor,
                 latents_std: torch.Tensor):
        self.shape = shape
        self.w = weights  # the file's names without `audio_vae.decoder.`
        self.latents_mean, self.latents_std = latents_mean, latents_std

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, prefix: str = "audio_vae.") -> AudioDecoder:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED}")

        d = prefix + "decoder."
        if d + "conv_in.conv.weight" not in ckpt:
            raise error(f"no '{prefix}{ANCHOR}' tensor")
        conv_in = ckpt.shape(d + "conv_in.conv.weight")
        if len(conv_in) != 4 or conv_in[1] != LATENT_CHANNELS:
            raise error(f"'{d}conv_in.conv.weight' has shape {conv_in}, not [C, {LATENT_CHANNELS}, 3, 3]")
        levels = ckpt.numbered(d + "up.", ".block.0.conv1.conv.weight")
        if levels == 0:
            raise error(f"no '{d}up.N.block.0' resnets")
        channels = tuple(ckpt.shape(f"{d}up.{i}.block.0.conv1.conv.weight")[0] for i in range(levels))
        blocks = ckpt.numbered(f"{d}up.0.block.", ".conv1.conv.weight")
        shape = AudioDecoderShape(channels, blocks, ckpt.shape(d + "conv_out.conv.weight")[0])
        w = {name: read_tensor(ckpt, d + name, s) for name, s in decoder_tensors(shape).items()}
        extra = sorted(k for k in ckpt.keys() if k.startswith(d) and k[len(d):] not in w)  # noqa: SIM118
        if extra:
            raise error(f"unexpected decoder tensors {extra[:3]}{' ...' if len(extra) > 3 else ''} (attention?)")
        stats = [read_tensor(ckpt, f"{prefix}per_channel_statistics.{k}").flatten()
                 for k in ("mean-of-means", "std-of-means")]
        return cls(shape, w, *stats)

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> AudioDecoder:
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()},
                          self.latents_mean.to(device), self.latents_std.to(device))

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents [B, C, L, M] -> the decoder's: x * std + mean with the statistics indexed by
        c * M + m (a latent row patchified channel-major, as diffusers and ComfyUI apply them)."""
        c, m = latents.shape[1], latents.shape[3]
        view = (1, c, 1, m)
        return latents * self.latents_std.view(view).to(latents) + self.latents_mean.view(view).to(latents)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Normalized latents [B, 8, L, 16] -> log-mel [B, 2, 4L - 3, 64] (de-normalized, then forward)."""
        return self.forward(self.raw_latents(self._check(latents)), check)

    def forward(self, z: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents [B, 8, L, M] -> [B, 2, 4L - 3, 4M]: causal in time (each x2 upsample drops its first row)."""
        s, check = self.shape, check or (lambda: None)
        x = _conv(z.to(self.w["conv_in.conv.weight"]), self.w, "conv_in")
        x = self._resnet(x, "mid.block_1")
        x = self._resnet(x, "mid.block_2")
        for level in reversed(range(len(s.channels))):
            check()
            for j in range(s.blocks):
                x = self._resnet(x, f"up.{level}.block.{j}")
            if level > 0:
                x = _conv(F.interpolate(x, scale_factor=2.0, mode="nearest"), self.w, f"up.{level}.upsample.conv")
                x = x[:, :, 1:]
        x = F.silu(pixel_norm(x, NORM_EPS))
        return _conv(x, self.w, "conv_out").float()

    def _resnet(self, x: torch.Tensor, name: str) -> torch.Tensor:
        h = _conv(F.silu(pixel_norm(x, NORM_EPS)), self.w, f"{name}.conv1")
        h = _conv(F.silu(pixel_norm(h, NORM_EPS)), self.w, f"{name}.conv2")
        if f"{name}.nin_shortcut.conv.weight" in self.w:  # 1x1 where the channel count changes
            x = _conv(x, self.w, f"{name}.nin_shortcut")
        return x + h

    def _check(self, latents: torch.Tensor) -> torch.Tensor:
        return checked_latents(latents, 4, LATENT_CHANNELS, 1, f"samples: expected LTX-2 audio latents [B, "
                               f"{LATENT_CHANNELS}, L, 16], got {{got}}; is this the video part of an AV latent?",
                               self.w["conv_in.conv.weight"], torch.float32)


def _conv(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    """LTX2AudioCausalConv2d along height (time): zero-padded k - 1 rows above, none below; width centred."""
    weight = w[f"{name}.conv.weight"]
    kh, kw = weight.shape[-2:]
    return F.conv2d(F.pad(x, ((kw - 1) // 2, kw // 2, kh - 1, 0)), weight, w[f"{name}.conv.bias"])


def decoder_tensors(shape: AudioDecoderShape) -> dict[str, tuple[int, ...]]:
    """Every decoder tensor the forward reads (names without `decoder.`), with its shape."""
    t: dict[str, tuple[int, ...]] = {}

    def conv(name: str, cin: int, cout: int, k: int = 3) -> None:
        t[f"{name}.conv.weight"], t[f"{name}.conv.bias"] = (cout, cin, k, k), (cout,)

    def resnet(name: str, cin: int, cout: int) -> None:
        conv(f"{name}.conv1", cin, cout)
        conv(f"{name}.conv2", cout, cout)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cin, cout, 1)

    ch = shape.channels
    conv("conv_in", LATENT_CHANNELS, ch[-1])
    resnet("mid.block_1", ch[-1], ch[-1])
    resnet("mid.block_2", ch[-1], ch[-1])
    cin = ch[-1]
    for level in reversed(range(len(ch))):
        for j in range(shape.blocks):
            resnet(f"up.{level}.block.{j}", cin, ch[level])
            cin = ch[level]
        if level > 0:
            conv(f"up.{level}.upsample.conv", cin, cin)
    conv("conv_out", ch[0], shape.out_channels)
    return t
