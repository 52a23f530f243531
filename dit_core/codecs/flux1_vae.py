"""The FLUX.1 VAE decoder (ae.safetensors, BFL names) in f32, whole or in soft tiles."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch

from ..weights import Checkpoint
from .conv import (
    GROUPS,
    DecoderShape,
    Layout,
    added,
    checked_latents,
    conv,
    conv_pending,
    decoder_tensors,
    find_prefix,
    group_norm,
    mid,
    nearest_x2,
    norms_built_ahead,
    ramp,
    read_part,
    read_shape,
    resnet,
    spans,
)

# FLUX.1 latent format (reference/families/z_image.md section 8, the VAE; ComfyUI latent_formats.Flux).
LATENT_CHANNELS = 16
SCALING = 0.3611
SHIFT = 0.1159
NORM_WIDTHS = (128, 256, 512)  # the FLUX.1 and FLUX.2 VAE decoders' levels (ch 128, ch_mult 1 2 4 4)
# Latent tile and overlap as ComfyUI v0.3.75 comfy/sd.py VAE.decode_tiled_ (tile_x=tile_y=64, overlap=16).
TILE = 64
OVERLAP = 16

FLUX1 = Layout(LATENT_CHANNELS, False, "FLUX.1 VAE", f"a FLUX.1 VAE (ae.safetensors: AutoencoderKL with "
               f"{LATENT_CHANNELS} latent channels, no quant convs, tensors named decoder.conv_in, decoder.mid.*, "
               f"decoder.up.N.*, optionally under a prefix such as 'vae.')")


def laid_out(weights: dict[str, torch.Tensor], device, dtype: torch.dtype,
             channels_last: bool) -> dict[str, torch.Tensor]:
    """weights on device in dtype, the convs' [out, in, kh, kw] channels last where asked (as their activations)."""
    moved = {k: v.to(device, dtype) for k, v in weights.items()}
    if channels_last:
        moved = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in moved.items()}
    return moved


def host_image(x: torch.Tensor) -> torch.Tensor:
    """A decoder's output [B, 3, H, W] about -1..1 -> ComfyUI IMAGE [B, H, W, 3] f32 0..1 on the host."""
    image = ((x.float().clamp(-1.0, 1.0) + 1.0) / 2.0).permute(0, 2, 3, 1).contiguous()
    if image.is_cuda:  # into page-locked memory: a pageable copy of a 1024x1024 image ran at 2 GB/s (6.5 ms)
        try:
            return torch.empty(image.shape, dtype=image.dtype, pin_memory=True).copy_(image)
        except RuntimeError:  # no page-locked memory to be had (a locked-memory limit): the plain copy
            return image.cpu()
    return image


def raw_latents(normalized: torch.Tensor) -> torch.Tensor:
    """Sampler-space latents -> raw VAE latents (ComfyUI's Flux process_out: z / 0.3611 + 0.1159)."""
    return normalized / SCALING + SHIFT


class ImageDecoder:
    """FLUX.1 VAE decoder: raw latents [B, 16, h, w] -> ComfyUI IMAGE [B, 8h, 8w, 3] in 0..1."""

    LAYOUT = FLUX1  # frozen: a subclass for another family overrides it

    def __init__(self, shape: DecoderShape, weights: dict[str, torch.Tensor], channels_last: bool = False):
        self.shape = shape
        self.w = weights  # BFL names without the `decoder.` prefix; attention 1x1 convs stored as [C, C]
        self.norms_ahead: threading.Thread | None = None  # conv.norms_built_ahead's, joined by the first decode
        self.channels_last = channels_last  # activations [B, H, W, C] in memory (to())

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, groups: int = GROUPS) -> ImageDecoder:
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        prefix = find_prefix(ckpt, cls.LAYOUT)
        shape = read_shape(ckpt, prefix, groups, cls.LAYOUT)
        return cls(shape, read_part(ckpt, prefix + "decoder.", decoder_tensors(shape), cls.LAYOUT))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32,
           channels_last: bool = False) -> ImageDecoder:
        """The decoder with its weights on device in dtype (its decode then runs there in that precision, as stock
        ComfyUI's VAE runs in BF16 on a recent GPU; IMAGE comes back on the CPU, f32). channels_last: its convs
        and norms on activations laid out [B, H, W, C] in memory (cuDNN's own layout: no conversion around each
        conv; the IMAGE is that layout)."""
        moved = type(self)(self.shape, laid_out(self.w, device, dtype, channels_last), channels_last)
        moved.norms_ahead = norms_built_ahead(device, dtype, self.shape.channels if channels_last else ())
        return moved

    @torch.no_grad()  # not inference_mode: a node downstream may still modify the IMAGE in place
    def decode(self, latents: torch.Tensor, tile: int | None = TILE, overlap: int = OVERLAP,
               progress: Callable[[int, int], None] | None = None,
               check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents -> IMAGE. Latents larger than `tile` (latent cells) are decoded in tiles overlapping by
        `overlap` cells and blended with linear feathering; tile=None decodes whole. progress(done, total) after
        each tile; check() after each of the decoder's blocks (it raises to cancel within a tile)."""
        z = self._check(latents)
        _, _, h, w = z.shape
        if tile is not None and (tile < 1 or not 0 <= overlap < tile):
            raise ValueError(f"decode: tile must be >= 1 and 0 <= overlap < tile, got tile={tile}, "
                             f"overlap={overlap}")
        if tile is None or (h <= tile and w <= tile):
            x = self.forward(z, check)
            if progress is not None:
                progress(1, 1)
        else:
            x = self._tiled(z, tile, overlap, progress, check)
        return host_image(x)

    def whole_bytes(self, latents: torch.Tensor) -> int:
        """About the most memory a decode of raw latents [B, C, h, w] in one piece holds: a few activations of the
        full-resolution level at once (its channels are the decoder's fewest, its pixels the most), in the weights'
        dtype, and the f32 image."""
        b, _, h, w = latents.shape
        pixels = b * h * w * self.shape.factor ** 2
        return pixels * (6 * self.shape.channels[0] * self.w["conv_in.weight"].element_size() + 3 * 3 * 4)

    def forward(self, z: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents [B, C, h, w] -> image [B, 3, H, W], about -1..1 (BFL autoencoder.py Decoder); check() after
        each block."""
        w, g, check = self.w, self.shape.groups, check or (lambda: None)
        if self.norms_ahead is not None:  # its kernels, not built twice
            self.norms_ahead.join()
            self.norms_ahead = None
        if self.channels_last:
            z = z.contiguous(memory_format=torch.channels_last)
        if self.shape.post_quant:
            z = conv(z, w, "post_quant_conv")
        x = mid(conv_pending(z, w, "conv_in"), w, g)  # (its biases pending: conv.Pending)
        for level in reversed(range(len(self.shape.channels))):
            for j in range(self.shape.blocks):
                check()
                x = resnet(x, w, f"up.{level}.block.{j}", g)
            if level > 0:  # the bias added before the upsample: a quarter of the values
                x = conv_pending(nearest_x2(added(x)), w, f"up.{level}.upsample.conv")
        return conv(group_norm(x[0], w, "norm_out", g, silu=True, shift=x[1]), w, "conv_out")

    def _check(self, latents: torch.Tensor) -> torch.Tensor:
        c = self.shape.latent_channels
        return checked_latents(latents, 4, c, 1, f"samples: expected raw {self.LAYOUT.name} latents [B, {c}, h, w] "
                               f"({c} channels), got {{got}}; is this latent from another model family?",
                               self.w["conv_in.weight"])

    def _tiled(self, z: torch.Tensor, tile: int, overlap: int, progress, check) -> torch.Tensor:
        """Overlapping tiles weighted by linear ramps across each overlap, normalized by the summed weights: a
        partition of unity, no hard edge (ComfyUI's utils.tiled_scale feathers; ramps sized to the overlap)."""
        b, _, h, w = z.shape
        f = self.shape.factor
        rows, cols = spans(h, tile, overlap), spans(w, tile, overlap)
        out = torch.zeros(b, self.shape.out_channels, h * f, w * f, dtype=torch.float32, device=z.device)
        total = torch.zeros(1, 1, h * f, w * f, dtype=torch.float32, device=z.device)
        done = 0
        for i, (y0, y1) in enumerate(rows):
            wy = ramp(rows, i, f)
            for j, (x0, x1) in enumerate(cols):
                weight = (wy[:, None] * ramp(cols, j, f)[None, :]).to(z.device)
                out[:, :, y0 * f:y1 * f, x0 * f:x1 * f] += self.forward(z[:, :, y0:y1, x0:x1], check) * weight
                total[:, :, y0 * f:y1 * f, x0 * f:x1 * f] += weight
                done += 1
                if progress is not None:
                    progress(done, len(rows) * len(cols))
        return out / total
