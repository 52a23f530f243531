"""MiniMax H3's audio VAE decoder (minimax_h3_audio_vae_fp32.safetensors) in f32: latents -> mono 32 kHz
waveforms, stereo as two batch items (reference/families/minimax_h3.md section 7).

File layout assumed: diffusers' AutoencoderKLMiniMaxH3Audio names, which diffusers says are the original
checkpoint's (no single-file converter exists: a passthrough): `dec_in_proj.{weight,bias}`, `decoder.conv_pre`,
`decoder.ups.N.0`, `decoder.resblocks.M.{convs1,convs2}.D`, `decoder.resblocks.M.activations.A.{act.alpha,
act.beta,upsample.filter,downsample.lowpass.filter}`, `decoder.activation_post.*`, `decoder.conv_post`; convs as
weight_g/weight_v (weight norm) or already folded (`.weight`), optionally under a prefix such as 'vae.'; optional
`latents_mean`/`latents_std` [32]. The encoder (DAC, pre_block, mean_proj) is a later piece."""
from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor
from . import bigvgan

SAMPLE_RATE = 32000
LATENT_CHANNELS = 32
# Not in the file: the upsampling rates (5*5*2^5 = hop 800, 40 latents/s) and the AMP blocks' dilations.
RATES = (5, 5, 2, 2, 2, 2, 2)
DILATIONS = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
ANCHOR = "dec_in_proj.weight"
EXPECTED = ("a MiniMax H3 audio VAE (minimax_h3_audio_vae_fp32.safetensors: dec_in_proj + a BigVGAN `decoder.` "
            "with conv_pre, ups.N.0, resblocks.M, conv_post, in diffusers/original names)")


class AudioDecoder:
    """H3 audio latents [N, 32, T] -> waveforms [N, 1, T * 800] (diffusers' decode); audio() gives ComfyUI's
    AUDIO from stereo latents (left and right as two items)."""

    def __init__(self, shape: bigvgan.BigVGANShape, weights: dict[str, torch.Tensor],
                 latents_mean: torch.Tensor | None = None, latents_std: torch.Tensor | None = None,
                 sample_rate: int = SAMPLE_RATE):
        self.shape = shape
        self.w = weights  # 'dec_in_proj.*' plus the BigVGAN's names without 'decoder.'
        self.latents_mean, self.latents_std = latents_mean, latents_std
        self.sample_rate = sample_rate

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, rates: tuple[int, ...] = RATES,
             dilations: tuple[tuple[int, ...], ...] = DILATIONS) -> AudioDecoder:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED}")

        found = [k[: -len(ANCHOR)] for k in ckpt.keys() if k.endswith(ANCHOR)  # noqa: SIM118 (a list)
                 and (k == ANCHOR or k[-len(ANCHOR) - 1] == ".")]
        if not found:
            raise error(f"no '{ANCHOR}' tensor")
        prefix = min(found, key=len)
        proj = ckpt.shape(prefix + ANCHOR)
        shape = bigvgan.read_shape(ckpt, prefix + "decoder.", rates, dilations, error)
        if len(proj) != 3 or proj[2] != 1 or proj[0] != shape.in_channels:
            raise error(f"'{prefix}{ANCHOR}' has shape {proj}, not [{shape.in_channels}, latent channels, 1]")
        w = bigvgan.read_weights(ckpt, prefix + "decoder.", shape, error)
        w["dec_in_proj.weight"] = read_tensor(ckpt, prefix + ANCHOR, proj)
        w["dec_in_proj.bias"] = read_tensor(ckpt, prefix + "dec_in_proj.bias", (proj[0],))
        stats = [read_tensor(ckpt, prefix + k).flatten() if prefix + k in ckpt else None
                 for k in ("latents_mean", "latents_std")]
        return cls(shape, w, *stats)

    @property
    def latent_channels(self) -> int:
        return self.w["dec_in_proj.weight"].shape[1]

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> AudioDecoder:
        """Weights on device in dtype (H3 keeps this VAE in f32: BigVGAN loses ~20 dB under bf16, per diffusers)."""
        move = (lambda t: None if t is None else t.to(device, dtype))
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()},
                          move(self.latents_mean), move(self.latents_std), self.sample_rate)

    def raw_latents(self, normalized: torch.Tensor) -> torch.Tensor:
        """Normalized latents [..., 32, T] -> raw (x * std + mean per channel), when the file holds the stats;
        diffusers keeps them in its config and its pipeline applies them before decode."""
        if self.latents_mean is None or self.latents_std is None:
            raise ValueError("this audio VAE file holds no latents_mean/latents_std; pass raw latents to decode")
        shape = (-1, 1)
        return normalized * self.latents_std.view(shape).to(normalized) + self.latents_mean.view(shape).to(normalized)

    @torch.no_grad()
    def forward(self, z: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents [N, C, T] -> waveform [N, 1, T * hop], clamped to [-1, 1] (diffusers' decode)."""
        z = self._check(z, 3, "[N, C, T]")
        x = F.conv1d(z, self.w["dec_in_proj.weight"], self.w["dec_in_proj.bias"])
        return bigvgan.forward(x, self.w, self.shape, check)

    decode = forward

    def audio(self, latents: torch.Tensor, check: Callable[[], None] | None = None) -> dict:
        """Raw stereo latents [2, C, T] (left, right) or [B, 2, C, T] -> ComfyUI AUDIO {"waveform": [B, 2, T * hop]
        f32 on the CPU, "sample_rate": 32000}: the mono VAE decodes each channel as a batch item."""
        if latents.dim() == 3:
            latents = latents[None]
        if latents.dim() != 4 or latents.shape[1] != 2:
            raise ValueError(f"audio: expected stereo H3 audio latents [2, {self.latent_channels}, T] or "
                             f"[B, 2, {self.latent_channels}, T], got {tuple(latents.shape)}")
        b = latents.shape[0]
        wave = self.forward(latents.flatten(0, 1), check)  # [B*2, 1, S], items in (batch, channel) order
        return {"waveform": wave.reshape(b, 2, -1).float().cpu(), "sample_rate": self.sample_rate}

    def _check(self, z: torch.Tensor, dims: int, form: str) -> torch.Tensor:
        c = self.latent_channels
        if not isinstance(z, torch.Tensor) or z.dim() != dims or z.shape[-2] != c:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(f"decode: expected raw MiniMax H3 audio latents {form} with C = {c}, got {got}")
        weight = self.w["dec_in_proj.weight"]
        return z.to(weight.device, weight.dtype)
