"""MiniMax H3's audio VAE (minimax_h3_audio_vae_fp32.safetensors) in f32: the decoder (latents -> mono 32 kHz
waveforms) and the encoder (waveforms -> latents), stereo as two batch items (reference/families/minimax_h3.md
section 7).

File layout assumed: diffusers' AutoencoderKLMiniMaxH3Audio names, which diffusers says are the original
checkpoint's (no single-file converter exists: a passthrough): `dec_in_proj.{weight,bias}`, `decoder.conv_pre`,
`decoder.ups.N.0`, `decoder.resblocks.M.{convs1,convs2}.D`, `decoder.resblocks.M.activations.A.{act.alpha,
act.beta,upsample.filter,downsample.lowpass.filter}`, `decoder.activation_post.*`, `decoder.conv_post`; convs as
weight_g/weight_v (weight norm) or already folded (`.weight`), optionally under a prefix such as 'vae.'; optional
`latents_mean`/`latents_std` [32]. The encoder: `encoder.block.N` (DAC: a conv, stages of three residual units and a
strided conv, Snake, a conv), `pre_block.*` (causal attention + GeGLU), `mean_proj` (`logs_proj` unused: H3 takes
the posterior mean)."""
from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor
from . import bigvgan
from .conv import checked_latents

SAMPLE_RATE = 32000
LATENT_CHANNELS = 32
# Not in the file: the upsampling rates (5*5*2^5 = hop 800, 40 latents/s) and the AMP blocks' dilations.
RATES = (5, 5, 2, 2, 2, 2, 2)
DILATIONS = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
# The encoder: pre_block's attention heads (diffusers' num_attention_heads, not in the file) and the dilations of
# every DAC stage's three residual units.
HEADS = 8
DAC_DILATIONS = (1, 3, 9)
ANCHOR = "dec_in_proj.weight"
EXPECTED = ("a MiniMax H3 audio VAE (minimax_h3_audio_vae_fp32.safetensors: dec_in_proj + a BigVGAN `decoder.` "
            "with conv_pre, ups.N.0, resblocks.M, conv_post, in diffusers/original names)")
ENCODER_ANCHOR = "mean_proj.weight"
ENCODER_EXPECTED = ("a MiniMax H3 audio VAE with its encoder (minimax_h3_audio_vae_fp32.safetensors: a DAC "
                    "`encoder.block.N`, pre_block.*, mean_proj.*, in diffusers/original names)")


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

        prefix = _find_prefix(ckpt, ANCHOR, error)
        proj = ckpt.shape(prefix + ANCHOR)
        shape = bigvgan.read_shape(ckpt, prefix + "decoder.", rates, dilations, error)
        if len(proj) != 3 or proj[2] != 1 or proj[0] != shape.in_channels:
            raise error(f"'{prefix}{ANCHOR}' has shape {proj}, not [{shape.in_channels}, latent channels, 1]")
        w = bigvgan.read_weights(ckpt, prefix + "decoder.", shape, error)
        w["dec_in_proj.weight"] = read_tensor(ckpt, prefix + ANCHOR, proj)
        w["dec_in_proj.bias"] = read_tensor(ckpt, prefix + "dec_in_proj.bias", (proj[0],))
        return cls(shape, w, *_file_stats(ckpt, prefix))

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
        return checked_latents(z, dims, c, -2, f"decode: expected raw MiniMax H3 audio latents {form} with C = {c}, "
                               f"got {{got}}", self.w["dec_in_proj.weight"])


class AudioEncoder:
    """32 kHz waveforms [N, 1, S] -> H3 audio latents [N, 32, ceil(S / 800)], the posterior mean (diffusers' encode
    + latent_dist.mode()); encode() gives the normalized stereo latent of ComfyUI's AV latent from a waveform."""

    def __init__(self, strides: tuple[int, ...], heads: int, weights: dict[str, torch.Tensor],
                 latents_mean: torch.Tensor | None = None, latents_std: torch.Tensor | None = None,
                 sample_rate: int = SAMPLE_RATE):
        self.strides, self.heads = strides, heads
        self.w = weights  # diffusers' names: encoder.block.*, pre_block.*, mean_proj.*
        self.latents_mean, self.latents_std = latents_mean, latents_std
        self.sample_rate = sample_rate

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, heads: int = HEADS) -> AudioEncoder:
        """The encoder of `source` (the same file as the decoder's). The strides come from the strided convs'
        kernels (2 x stride); the head count is not in the file."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {ENCODER_EXPECTED}")

        p = _find_prefix(ckpt, ENCODER_ANCHOR, error)
        w = {}

        def tensor(name: str, shape: tuple[int, ...]) -> None:
            if p + name not in ckpt:
                raise error(f"tensor '{p}{name}' is missing")
            w[name] = read_tensor(ckpt, p + name, shape)

        def conv(name: str, cout: int, cin: int, k: int) -> None:
            if bigvgan.conv_shape(ckpt, p + name) is None:
                raise error(f"tensor '{p}{name}.weight' (or weight_v) is missing")
            w[name + ".weight"] = bigvgan.read_conv(ckpt, p + name, (cout, cin, k))
            tensor(name + ".bias", (cout,))

        first = bigvgan.conv_shape(ckpt, p + "encoder.block.0")
        if first is None or len(first) != 3 or first[1:] != (1, 7):
            raise error(f"'{p}encoder.block.0' is {first}, not the DAC's first conv [C, 1, 7]")
        strides, dim = [], first[0]
        conv("encoder.block.0", dim, 1, 7)
        while (down := bigvgan.conv_shape(ckpt, f"{p}encoder.block.{len(strides) + 1}.block.4")) is not None:
            b = f"encoder.block.{len(strides) + 1}.block."
            if down[:2] != (2 * dim, dim) or down[2] % 2:
                raise error(f"'{p}{b}4' is {down}, not a strided conv [{2 * dim}, {dim}, 2 x stride]")
            for u in range(len(DAC_DILATIONS)):
                tensor(f"{b}{u}.block.0.alpha", (1, dim, 1))
                conv(f"{b}{u}.block.1", dim, dim, 7)
                tensor(f"{b}{u}.block.2.alpha", (1, dim, 1))
                conv(f"{b}{u}.block.3", dim, dim, 1)
            tensor(f"{b}3.alpha", (1, dim, 1))
            conv(f"{b}4", 2 * dim, dim, down[2])
            strides.append(down[2] // 2)
            dim *= 2
        n = len(strides)
        tensor(f"encoder.block.{n + 1}.alpha", (1, dim, 1))
        top = bigvgan.conv_shape(ckpt, f"{p}encoder.block.{n + 2}")
        if top is None:
            raise error(f"no '{p}encoder.block.{n + 2}' conv after {n} stages")
        width = top[0]  # latent_dim, the attention's width
        conv(f"encoder.block.{n + 2}", width, dim, 3)
        latent = ckpt.shape(p + ENCODER_ANCHOR)[0]
        if width % heads:
            raise error(f"the encoder's width {width} does not split into {heads} heads")
        for name, c in (("norm1", width), ("norm3", width), ("norm2", latent), ("mlp.norm", latent)):
            tensor(f"pre_block.{name}.weight", (c,))
            tensor(f"pre_block.{name}.bias", (c,))
        tensor("pre_block.attn.qkv.weight", (3 * width, width))
        tensor("pre_block.attn.q_bias", (width,))
        tensor("pre_block.attn.v_bias", (width,))
        for name, shape in (("attn.proj", (latent, latent)), ("proj", (latent, width)),
                            ("mlp.w0", (2 * latent, latent)), ("mlp.w1", (2 * latent, latent)),
                            ("mlp.w2", (latent, 2 * latent))):
            tensor(f"pre_block.{name}.weight", shape)
            tensor(f"pre_block.{name}.bias", shape[:1])
        tensor("mean_proj.weight", (latent, latent, 1))
        tensor("mean_proj.bias", (latent,))
        return cls(tuple(strides), heads, w, *_file_stats(ckpt, p))

    @property
    def hop(self) -> int:
        return math.prod(self.strides)

    @property
    def latent_channels(self) -> int:
        return self.w["mean_proj.weight"].shape[0]

    def to(self, device: str | torch.device) -> AudioEncoder:
        """The encoder on device, in f32 (diffusers pins it to f32: the DAC stack degrades in bf16)."""
        move = (lambda t: None if t is None else t.to(device, torch.float32))
        return type(self)(self.strides, self.heads, {k: move(v) for k, v in self.w.items()},
                          move(self.latents_mean), move(self.latents_std), self.sample_rate)

    @torch.no_grad()
    def encode(self, waveform: torch.Tensor, sample_rate: int, check: Callable[[], None] | None = None
               ) -> torch.Tensor:
        """ComfyUI AUDIO's waveform [B, 1 or 2, S] at 32 kHz -> normalized latents [B, 32, 2, ceil(S / 800)] (the
        AV latent's audio part): mono repeated to stereo, each channel a batch item of the mono VAE (as diffusers'
        reference encoder), then (z - latents_mean) / latents_std."""
        if sample_rate != self.sample_rate:
            raise ValueError(f"audio: {sample_rate} Hz; the H3 audio VAE encodes {self.sample_rate} Hz, resample first")
        if not isinstance(waveform, torch.Tensor) or waveform.dim() != 3 or waveform.shape[1] not in (1, 2):
            got = tuple(waveform.shape) if isinstance(waveform, torch.Tensor) else type(waveform).__name__
            raise ValueError(f"audio: expected a mono or stereo waveform [B, 1 or 2, samples], got {got}")
        if self.latents_mean is None or self.latents_std is None:
            raise ValueError("this audio VAE file holds no latents_mean/latents_std; use forward() for raw latents")
        b = waveform.shape[0]
        weight = self.w["mean_proj.weight"]
        stereo = waveform.to(weight.device, torch.float32).expand(-1, 2, -1)
        z = self.forward(stereo.reshape(2 * b, 1, -1), check)  # items in (batch, channel) order
        z = (z - self.latents_mean.view(-1, 1)) / self.latents_std.view(-1, 1)
        return z.view(b, 2, *z.shape[1:]).transpose(1, 2).cpu()

    @torch.no_grad()
    def forward(self, wave: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Waveforms [N, 1, S] -> raw posterior means [N, C, ceil(S / hop)]: right-padded with zeros to whole hops,
        DAC, pre_block, mean_proj. check() after each stage."""
        w = self.w
        x = F.pad(wave, (0, (-wave.shape[-1]) % self.hop))
        x = bigvgan.conv(x, w, "encoder.block.0")
        for i, stride in enumerate(self.strides, 1):
            b = f"encoder.block.{i}.block."
            for u, dilation in enumerate(DAC_DILATIONS):
                # Residual unit: the dilated conv keeps the length, so diffusers' centre crop never cuts.
                r = f"{b}{u}.block."
                y = bigvgan.conv(_snake(x, w[r + "0.alpha"]), w, r + "1", dilation)
                x = x + bigvgan.conv(_snake(y, w[r + "2.alpha"]), w, r + "3")
            x = F.conv1d(_snake(x, w[b + "3.alpha"]), w[b + "4.weight"], w[b + "4.bias"], stride=stride,
                         padding=math.ceil(stride / 2))
            if check is not None:
                check()
        n = len(self.strides)
        x = bigvgan.conv(_snake(x, w[f"encoder.block.{n + 1}.alpha"]), w, f"encoder.block.{n + 2}")
        x = self._pre_block(x.transpose(1, 2)).transpose(1, 2)
        return F.conv1d(x, w["mean_proj.weight"], w["mean_proj.bias"])

    def _pre_block(self, x: torch.Tensor) -> torch.Tensor:
        """[N, T, width] -> [N, T, C]: proj(norm3(x)) + causal attention(norm1(x)), then + GeGLU(norm2(.)).
        The attention's heads are averaged rather than concatenated and the head width average-pooled down to C
        (diffusers' MiniMaxH3AudioCausalAttention); the key has no bias."""
        w, p = self.w, "pre_block."

        def norm(t: torch.Tensor, name: str) -> torch.Tensor:
            return F.layer_norm(t, t.shape[-1:], w[p + name + ".weight"], w[p + name + ".bias"])

        def linear(t: torch.Tensor, name: str) -> torch.Tensor:
            return F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])

        n, length = x.shape[:2]
        bias = torch.cat([w[p + "attn.q_bias"], torch.zeros_like(w[p + "attn.q_bias"]), w[p + "attn.v_bias"]])
        qkv = F.linear(norm(x, "norm1"), w[p + "attn.qkv.weight"], bias).view(n, length, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [N, heads, T, head width]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).mean(dim=1)
        a = linear(F.adaptive_avg_pool1d(a, self.latent_channels), "attn.proj")
        h = linear(norm(x, "norm3"), "proj") + a
        m = norm(norm(h, "norm2"), "mlp.norm")  # pre_block.norm2, then the MLP's own pre-norm
        return h + linear(F.gelu(linear(m, "mlp.w0"), approximate="tanh") * linear(m, "mlp.w1"), "mlp.w2")


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """DAC's Snake: x + sin(alpha x)^2 / alpha, alpha [1, C, 1] as stored (not in log space, unlike SnakeBeta)."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def _find_prefix(ckpt: Checkpoint, anchor: str, error: Callable[[str], WeightsError]) -> str:
    """The prefix before `anchor` (e.g. '', 'vae.'); the shortest if several."""
    found = [k[: -len(anchor)] for k in ckpt.keys() if k.endswith(anchor)  # noqa: SIM118 (a list)
             and (k == anchor or k[-len(anchor) - 1] == ".")]
    if not found:
        raise error(f"no '{anchor}' tensor")
    return min(found, key=len)


def _file_stats(ckpt: Checkpoint, prefix: str) -> list[torch.Tensor | None]:
    """[latents_mean, latents_std] where the file holds them, else None (diffusers keeps them in config.json)."""
    return [read_tensor(ckpt, prefix + k).flatten() if prefix + k in ckpt else None
            for k in ("latents_mean", "latents_std")]
