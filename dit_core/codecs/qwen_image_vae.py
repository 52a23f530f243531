"""Qwen-Image's VAE decoder (qwen_image_vae.safetensors, Krea 2's), one frame, as 2-D convolutions.

The file is Wan 2.1's causal 3-D VAE (ComfyUI v0.3.75 comfy/ldm/wan/vae.py WanVAE, its names; diffusers
AutoencoderKLQwenImage). A causal conv pads two zero frames before its input, so one frame meets only the kernel's
last temporal slice: each 3x3x3 conv is the 3x3 conv of weight[:, :, -1], each 1x1x1 a 1x1; an upsample's time conv
runs from the second frame on, never for one. What is left, for raw latents z [B, 16, h, w]:
  x = conv1x1(z, conv2); x = conv3x3(x, decoder.conv1)
  middle: residual block, attention (one head over all positions), residual block
  upsamples: residual blocks (x + [norm, SiLU, conv, norm, SiLU, conv](x), a 1x1 shortcut where the width changes)
             and resamples (nearest x2, then a 3x3 conv to half the channels)
  head: norm, SiLU, conv3x3 to RGB in about -1..1
where norm is RMS over the channels at each position: x / max(|x|, 1e-12) * sqrt(C) * gamma (F.normalize), on a GPU
with the activations channels last one kernel (kernels/channel_rms.py), the bias of the conv before it added there (the
biases carried as conv.Pending: to a norm's shift, along the residual sums, through a 1x1 shortcut).
The IMAGE is clamp((x + 1) / 2) as ComfyUI's VAE gives it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor
from .conv import Pending, added, conv, conv1x1_pending, conv_pending, kernels_built_ahead, nearest_x2, summed
from .flux1_vae import host_image, laid_out

LATENT_CHANNELS = 16
NORM_WIDTHS = (96, 192, 384)  # qwen_image_vae's decoder norms (dim 96, dim_mult 1 2 4 4)
ANCHOR = "decoder.middle.0.residual.0.gamma"
EXPECTED = ("a Qwen-Image VAE (qwen_image_vae.safetensors: Wan 2.1's causal 3-D VAE, 16 latent channels, tensors "
            "named conv2.*, decoder.conv1.*, decoder.middle.N.*, decoder.upsamples.N.*, decoder.head.N.*)")


def _rms(pending: Pending, gamma: torch.Tensor, silu: bool) -> torch.Tensor:
    """RMS over channels (dim 1) of x + its pending bias, times gamma [C] read times sqrt(C) (comfy RMS_norm:
    F.normalize(x, dim=1) * sqrt(C) * gamma), then SiLU where silu."""
    x, bias = pending
    if x.is_cuda and x.movedim(1, -1).is_contiguous():
        from ..gpu.block import run
        return run("channel_rms", x, gamma, bias, silu)
    y = F.normalize(added(pending), dim=1) * gamma.reshape(-1, 1, 1)
    return F.silu(y) if silu else y


def _residual(pending: Pending, w: dict, name: str) -> Pending:
    h = conv_pending(_rms(pending, w[f"{name}.residual.0.gamma"], True), w, f"{name}.residual.2")
    h = conv_pending(_rms(h, w[f"{name}.residual.3.gamma"], True), w, f"{name}.residual.6")
    shortcut = f"{name}.shortcut"  # 1x1 where the width changes
    return summed(conv1x1_pending(pending, w, shortcut) if f"{shortcut}.weight" in w else pending, h)


def _attention(pending: Pending, w: dict, name: str) -> Pending:
    b, c, hh, ww = pending[0].shape
    q, k, v = conv(_rms(pending, w[f"{name}.norm.gamma"], False), w, f"{name}.to_qkv").flatten(2) \
        .transpose(1, 2).chunk(3, dim=-1)  # [B, HW, C] each
    a = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
    return summed(pending, conv_pending(a.transpose(1, 2).reshape(b, c, hh, ww), w, f"{name}.proj"))


def norms_built_ahead(device: str | torch.device, dtype: torch.dtype, widths=NORM_WIDTHS):
    """The channels-last decoder's norm kernels (kernels/channel_rms.py) at these widths, built on a thread of their
    own (conv.kernels_built_ahead)."""
    return kernels_built_ahead(device, lambda ops: ops.channel_rms.build(dtype, widths))


class QwenImageDecoder:
    """Qwen-Image VAE decoder: raw latents [B, 16, h, w] (or [B, 16, 1, h, w]) -> ComfyUI IMAGE [B, 8h, 8w, 3]."""

    def __init__(self, weights: dict[str, torch.Tensor], layers: tuple[str, ...], channels_last: bool = False):
        self.w = weights  # the file's names; 3-D convs as their last temporal slice, gammas [C]
        self.layers = layers  # decoder.upsamples.N in order: "residual" or "resample"
        self.channels_last = channels_last
        self.norms_ahead = None  # the norm's kernels built on a thread of their own (to()), joined by the first decode

    @classmethod
    def load(cls, source: str | Checkpoint) -> QwenImageDecoder:
        """The decoder's tensors of a file (or tensors in memory: weights.TensorSource), f32."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        if ANCHOR not in ckpt or "decoder.conv1.weight" not in ckpt or "conv2.weight" not in ckpt:
            raise WeightsError(f"{ckpt.path.name}: no '{ANCHOR}', 'decoder.conv1.weight' or 'conv2.weight' tensor; "
                               f"expected {EXPECTED}")
        if "decoder.upsamples.0.upsamples.0.residual.2.weight" in ckpt:
            raise WeightsError(f"{ckpt.path.name}: a Wan 2.2 VAE (48 latent channels); expected {EXPECTED}")
        if ckpt.shape("conv2.weight")[:2] != (LATENT_CHANNELS, LATENT_CHANNELS):
            raise WeightsError(f"{ckpt.path.name}: conv2.weight is {ckpt.shape('conv2.weight')}; expected {EXPECTED}")
        names = [k for k in ckpt.keys() if k.startswith("decoder.") or k.startswith("conv2.")]  # noqa: SIM118
        layers, i = [], 0
        while any(k.startswith(f"decoder.upsamples.{i}.") for k in names):
            layers.append("resample" if f"decoder.upsamples.{i}.resample.1.weight" in ckpt else "residual")
            i += 1
        w = {}
        for k in names:
            if ".time_conv." in k:  # (from the second frame on)
                continue
            t = read_tensor(ckpt, k)
            if t.dim() == 5:  # a causal 3-D conv: its last temporal slice
                t = t[:, :, -1].contiguous()
            elif k.endswith(".gamma"):  # [C, 1, 1(, 1)], times sqrt(C) once here
                t = t.reshape(-1) * math.sqrt(t.shape[0])
            w[k] = t
        return cls(w, tuple(layers))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32,
           channels_last: bool = False) -> QwenImageDecoder:
        """The decoder with its weights on device in dtype; channels_last: its convs on activations laid out
        [B, H, W, C] in memory (cuDNN's own layout)."""
        moved = type(self)(laid_out(self.w, device, dtype, channels_last), self.layers, channels_last)
        if channels_last:
            moved.norms_ahead = norms_built_ahead(device, dtype, [t.numel() for k, t in self.w.items()
                                                                  if k.endswith(".gamma")])
        return moved

    @torch.no_grad()  # not inference_mode: a node downstream may still modify the IMAGE in place
    def decode(self, latents: torch.Tensor, check=None, progress=None) -> torch.Tensor:
        """Raw latents -> IMAGE on the host, f32 0..1, in one piece; check() after each layer (it raises to cancel),
        progress(1, 1) at the end."""
        z = latents[:, :, 0] if latents.dim() == 5 and latents.shape[2] == 1 else latents
        ref = self.w["conv2.weight"]
        if z.dim() != 4 or z.shape[1] != LATENT_CHANNELS:
            raise ValueError(f"samples: expected raw Qwen-Image VAE latents [B, {LATENT_CHANNELS}, 1, h, w] (one "
                             f"frame), got {tuple(latents.shape)}; is this latent from another model family?")
        image = host_image(self.forward(z.to(ref.device, ref.dtype), check))
        if progress is not None:
            progress(1, 1)
        return image

    def forward(self, z: torch.Tensor, check=None) -> torch.Tensor:
        """Raw latents [B, 16, h, w] -> image [B, 3, 8h, 8w], about -1..1."""
        w, check = self.w, check or (lambda: None)
        if self.norms_ahead is not None:  # its kernels, not built twice
            self.norms_ahead.join()
            self.norms_ahead = None
        if self.channels_last:
            z = z.contiguous(memory_format=torch.channels_last)
        x = conv_pending(conv(z, w, "conv2"), w, "decoder.conv1")
        x = _residual(x, w, "decoder.middle.0")
        x = _residual(_attention(x, w, "decoder.middle.1"), w, "decoder.middle.2")
        for i, kind in enumerate(self.layers):
            check()
            name = f"decoder.upsamples.{i}"
            if kind == "residual":
                x = _residual(x, w, name)
            else:  # the bias added first (a quarter of the values); nearest-exact at x2 picks nearest's pixels
                x = conv_pending(nearest_x2(added(x)), w, f"{name}.resample.1")
        return conv(_rms(x, w["decoder.head.0.gamma"], True), w, "decoder.head.2")
