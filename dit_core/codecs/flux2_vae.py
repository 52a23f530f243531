"""The FLUX.2 VAE (flux2-vae.safetensors, BFL/ComfyUI names): batch-norm latents packed 2x2; decode and encode."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, read_tensor
from .conv import (
    GROUPS,
    Layout,
    Shapes,
    added,
    conv,
    conv_pending,
    decoder_tensors,
    find_prefix,
    group_norm,
    mid,
    norms_built_ahead,
    read_levels,
    read_part,
    read_shape,
    resnet,
)
from .flux1_vae import OVERLAP, TILE, ImageDecoder, laid_out

LATENT_CHANNELS = 32
# 2x2 cells -> one 128-channel cell at /16 (reference/families/flux3_klein.md sections 4 and 8: packing, VAE)
PATCH = 2
PACKED = LATENT_CHANNELS * PATCH * PATCH
# BatchNorm2d(128, affine False, eps 1e-4): only its running statistics are stored, not its eps (diffusers 0.42.1
# AutoencoderKLFlux2 batch_norm_eps; ComfyUI v0.3.75 autoencoder.py bn_eps).
BN_EPS = 1e-4
# BFL's file nests the quant convs (encoder.quant_conv, decoder.post_quant_conv): ComfyUI v0.3.75 comfy/sd.py
# renames exactly these two prefixes before loading, and keys the batch-norm latent on 'bn.running_mean'.
FLUX2 = Layout(LATENT_CHANNELS, True, "FLUX.2 VAE",
               f"a FLUX.2 VAE (flux2-vae.safetensors: AutoencoderKLFlux2 with {LATENT_CHANNELS} latent channels, "
               f"tensors named encoder.*, encoder.quant_conv, decoder.post_quant_conv, decoder.up.N.*, "
               f"bn.running_mean/var, optionally under a prefix such as 'vae.')")


def pack(z: torch.Tensor) -> torch.Tensor:
    """[B, 32, 2h, 2w] -> [B, 128, h, w], channel c*4 + ph*2 + pw (diffusers Flux2Pipeline._patchify_latents)."""
    b, c, hh, ww = z.shape
    z = z.reshape(b, c, hh // PATCH, PATCH, ww // PATCH, PATCH).permute(0, 1, 3, 5, 2, 4)
    return z.reshape(b, c * PATCH * PATCH, hh // PATCH, ww // PATCH)


def unpack(x: torch.Tensor) -> torch.Tensor:
    """The inverse of pack: [B, 128, h, w] -> [B, 32, 2h, 2w]."""
    b, c, h, w = x.shape
    x = x.reshape(b, c // (PATCH * PATCH), PATCH, PATCH, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // (PATCH * PATCH), h * PATCH, w * PATCH)


@dataclass(frozen=True)
class EncoderShape:
    """The encoder's sizes, read from the file (BFL's `down.N`, level 0 at full resolution)."""
    in_channels: int
    channels: tuple[int, ...]  # per level, level 0 first
    blocks: int  # resnet blocks per level (BFL num_res_blocks)
    latent_channels: int
    groups: int = GROUPS


class Flux2VAE(ImageDecoder):
    """FLUX.2 VAE: normalized packed latents [B, 128, h, w] (or raw [B, 32, 2h, 2w]) -> IMAGE [B, 16h, 16w, 3];
    IMAGE -> normalized packed latents (the posterior mode, as ComfyUI and BFL encode references)."""

    LAYOUT = FLUX2

    def __init__(self, shape, weights, encoder: EncoderShape, encoder_weights: dict[str, torch.Tensor],
                 bn_mean: torch.Tensor, bn_var: torch.Tensor, channels_last: bool = False):
        super().__init__(shape, weights, channels_last)
        self.encoder, self.e = encoder, encoder_weights
        self.bn_mean, self.bn_var, self.bn_std = bn_mean, bn_var, torch.sqrt(bn_var + BN_EPS)

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, groups: int = GROUPS) -> Flux2VAE:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        prefix = find_prefix(ckpt, FLUX2)
        shape = read_shape(ckpt, prefix, groups, FLUX2)
        weights = read_part(ckpt, prefix + "decoder.", decoder_tensors(shape), FLUX2)
        encoder = _read_encoder_shape(ckpt, prefix, groups)
        encoder_weights = read_part(ckpt, prefix + "encoder.", _encoder_tensors(encoder), FLUX2)
        stats = []
        for name in ("running_mean", "running_var"):
            if f"{prefix}bn.{name}" not in ckpt:
                raise FLUX2.error(ckpt, f"no '{prefix}bn.{name}' tensor (the batch-norm latent statistics)")
            stats.append(read_tensor(ckpt, f"{prefix}bn.{name}", (PACKED,)))
        return cls(shape, weights, encoder, encoder_weights, *stats)

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32,
           channels_last: bool = False) -> Flux2VAE:
        """The VAE with its weights on device (decode and encode then run there; results come back on the CPU), the
        decoder's in dtype, channels last where asked (ImageDecoder.to); the encoder (reference images) and the
        latent statistics stay f32."""
        moved = Flux2VAE(self.shape, laid_out(self.w, device, dtype, channels_last), self.encoder,
                         laid_out(self.e, device, torch.float32, False), self.bn_mean.to(device),
                         self.bn_var.to(device), channels_last)
        moved.norms_ahead = norms_built_ahead(device, dtype, self.shape.channels if channels_last else ())
        return moved

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, tile: int | None = TILE, overlap: int = OVERLAP,
               progress=None, check=None) -> torch.Tensor:
        """Latents -> IMAGE in 0..1. 128 channels: sampler-space (normalized, packed) latents, denormalized with
        the batch-norm statistics and unpacked (diffusers Flux2KleinPipeline, end of __call__); 32 channels: raw
        latents as the decoder takes them. `tile` and `overlap` count cells of the latents given (ComfyUI's tile
        64 on the 128-channel latent is 1024 px); larger latents decode in feathered tiles (ImageDecoder)."""
        if isinstance(latents, torch.Tensor) and latents.dim() == 4 and latents.shape[1] == PACKED:
            x = latents.to(self.bn_mean.device, torch.float32)
            latents = unpack(x * self.bn_std[:, None, None] + self.bn_mean[:, None, None])
            tile, overlap = (None if tile is None else tile * PATCH), overlap * PATCH
        elif not (isinstance(latents, torch.Tensor) and latents.dim() == 4 and latents.shape[1] == LATENT_CHANNELS):
            got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise ValueError(f"samples: expected FLUX.2 latents [B, {PACKED}, h, w] (normalized, packed 2x2) or "
                             f"raw [B, {LATENT_CHANNELS}, H, W], got {got}; is this latent from another model?")
        return super().decode(latents, tile, overlap, progress, check)

    def whole_bytes(self, latents: torch.Tensor) -> int:
        """ImageDecoder.whole_bytes of packed [B, 128, h, w] or raw [B, 32, H, W] latents."""
        b, c, h, w = latents.shape
        return super().whole_bytes(torch.empty(b, LATENT_CHANNELS, h * PATCH, w * PATCH, device="meta")
                                   if c == PACKED else latents)

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """IMAGE [B, H, W, 3+] in 0..1 -> normalized packed latents [B, 128, H/16, W/16] on the CPU. Sizes not a
        multiple of 16 are cropped to one, centred (ComfyUI v0.3.75 VAE.vae_encode_crop_pixels)."""
        f = 2 ** (len(self.encoder.channels) - 1) * PATCH
        if not isinstance(image, torch.Tensor) or image.dim() != 4 or image.shape[-1] < 3 \
                or image.shape[1] < f or image.shape[2] < f:
            got = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"image: expected an IMAGE [B, H, W, 3] with H, W >= {f}, got {got}")
        for d in (1, 2):
            n = image.shape[d] // f * f
            image = image.narrow(d, (image.shape[d] - n) // 2, n)
        x = image[..., :3].to(self.bn_mean.device, torch.float32).permute(0, 3, 1, 2) * 2.0 - 1.0
        z = pack(self.moments(x)[:, :LATENT_CHANNELS])  # the mean half: DiagonalGaussian mode
        return ((z - self.bn_mean[:, None, None]) / self.bn_std[:, None, None]).cpu()

    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """Image [B, 3, H, W] in -1..1 -> [mean | logvar] [B, 64, H/8, W/8] (BFL autoencoder.py Encoder, then
        quant_conv)."""
        w, g = self.e, self.encoder.groups
        h = conv_pending(x, w, "conv_in")  # (its biases pending: conv.Pending)
        for level in range(len(self.encoder.channels)):
            for j in range(self.encoder.blocks):
                h = resnet(h, w, f"down.{level}.block.{j}", g)
            if level < len(self.encoder.channels) - 1:  # stride 2 after padding right and bottom only
                name = f"down.{level}.downsample.conv"
                h = F.conv2d(F.pad(added(h), (0, 1, 0, 1)), w[f"{name}.weight"], stride=2), w[f"{name}.bias"].float()
        h, bias = mid(h, w, g)
        return conv(conv(group_norm(h, w, "norm_out", g, silu=True, shift=bias), w, "conv_out"), w, "quant_conv")


def _read_encoder_shape(ckpt: Checkpoint, prefix: str, groups: int) -> EncoderShape:
    e = prefix + "encoder."
    if e + "conv_in.weight" not in ckpt:
        raise FLUX2.error(ckpt, f"no '{e}conv_in.weight' tensor (the encoder)")
    channels, n = read_levels(ckpt, e, "down", groups, FLUX2)
    out = ckpt.shape(e + "conv_out.weight")[0]
    if out != 2 * LATENT_CHANNELS:
        raise FLUX2.error(ckpt, f"'{e}conv_out.weight' gives {out} channels, not mean and logvar of "
                          f"{LATENT_CHANNELS}")
    return EncoderShape(ckpt.shape(e + "conv_in.weight")[1], channels, n, LATENT_CHANNELS, groups)


def _encoder_tensors(shape: EncoderShape) -> Shapes:
    """Every encoder tensor `moments` uses, with its expected shape (without the `encoder.` prefix)."""
    ch, t = shape.channels, Shapes()
    t.conv("conv_in", shape.in_channels, ch[0])
    cin = ch[0]
    for level, c in enumerate(ch):
        for j in range(shape.blocks):
            t.resnet(f"down.{level}.block.{j}", cin, c)
            cin = c
        if level < len(ch) - 1:
            t.conv(f"down.{level}.downsample.conv", c, c)
    t.mid(ch[-1])
    t.norm("norm_out", ch[-1])
    t.conv("conv_out", ch[-1], 2 * shape.latent_channels)
    t.conv("quant_conv", 2 * shape.latent_channels, 2 * shape.latent_channels, 1)
    return t
