"""MiniMax H3's video VAE in f32, in diffusers' AutoencoderKLMiniMaxH3 names: the ViT decoder and the causal 3-D
CNN encoder, each in diffusers' clips and pixel tiles."""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_linear, read_tensor
from .conv import checked_latents

# reference/families/minimax_h3.md section 7; diffusers 0.42.1 autoencoder_kl_minimax_h3.py defaults.
LATENT_CHANNELS = 24
HEAD_DIM = 64
ROPE_RATIO = 0.75  # the first 48 of 64 channels a head are rotated
ROPE_THETA = 100.0
EPS = 1e-5
PATCH, PATCH_T = 16, 4  # /16 spatial, /4 temporal (products of the encoder's downsample factors)
CLIP_LENGTH, TOKEN_DROP = 17, 3  # the encoder's clips: 17 frames -> 5 latents, 3 trailing ones dropped
TILE, TILE_OVERLAP = 256, 64  # pixels; on by default in diffusers: the released frames are the tiled ones
# Pixels are ImageNet-normalized (AutoencoderKLMiniMaxH3's docstring; the pipeline's decode step).
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
# The encoder (diffusers' defaults): where each level downsamples, and its norms (neither is in the file).
SPATIAL_FACTORS = (2, 2, 2, 2, 1, 1)
TEMPORAL_FACTORS = (1, 2, 2, 1, 1, 1)
ENCODER_GROUPS, ENCODER_EPS = 32, 1e-6
ANCHOR = "decoder.proj_in.weight"
EXPECTED = ("an H3 video VAE in diffusers' AutoencoderKLMiniMaxH3 names (post_quant_conv.*, decoder.proj_in.*, "
            "decoder.register_tokens, decoder.transformer_blocks.N.*, decoder.norm_out.*, decoder.proj_out.*), "
            "optionally under a prefix such as 'vae.'")
ENCODER_ANCHOR = "encoder.conv_in.weight"
ENCODER_EXPECTED = ("an H3 video VAE with its encoder in diffusers' AutoencoderKLMiniMaxH3 names (encoder.conv_in.*, "
                    "encoder.down_blocks.N.resnets.J.*, encoder.down_blocks.N.downsamplers.0.conv.*, "
                    "encoder.norm_out.*, encoder.conv_out.*, quant_conv.*), optionally under a prefix such as 'vae.'")


@dataclass(frozen=True)
class VideoDecoderShape:
    width: int
    heads: int
    head_dim: int
    layers: int
    registers: int
    out_channels: int = 3
    patch: int = PATCH
    patch_t: int = PATCH_T
    rope_theta: float = ROPE_THETA
    rope_ratio: float = ROPE_RATIO
    eps: float = EPS

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.rope_ratio)


class VideoDecoder:
    """H3 video VAE decoder: normalized latents [B, 24, T, h, w] -> ComfyUI IMAGE [B * F, 16h, 16w, 3] in 0..1."""

    def __init__(self, shape: VideoDecoderShape, weights: dict[str, torch.Tensor], latents_mean: torch.Tensor,
                 latents_std: torch.Tensor):
        self.shape = shape
        self.w = weights  # diffusers' names without the `decoder.` prefix; post_quant_conv as a [24, 24] linear
        self.latents_mean, self.latents_std = latents_mean, latents_std

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, latents_mean=None, latents_std=None,
             head_dim: int = HEAD_DIM) -> VideoDecoder:
        """The decoder of `source`. latents_mean/std (24 values each) come from the file when it holds
        `latents_mean`/`latents_std` tensors, else from the arguments (diffusers' vae/config.json)."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        name = ckpt.path.name
        p = _find_prefix(ckpt, ANCHOR, EXPECTED)
        width, latent = ckpt.shape(p + ANCHOR)
        if latent != LATENT_CHANNELS or width % head_dim:
            raise WeightsError(f"{name}: '{p + ANCHOR}' is {[width, latent]}, expected [k * {head_dim}, "
                               f"{LATENT_CHANNELS}]; expected {EXPECTED}")
        layers = ckpt.numbered(p + "decoder.transformer_blocks.", ".norm1.weight")
        registers = ckpt.shape(p + "decoder.register_tokens")[1]
        out_rows = ckpt.shape(p + "decoder.proj_out.weight")[0]
        if out_rows % (PATCH_T * PATCH * PATCH):
            raise WeightsError(f"{name}: decoder.proj_out has {out_rows} rows, expected channels x {PATCH_T} x "
                               f"{PATCH} x {PATCH} pixels")
        shape = VideoDecoderShape(width, width // head_dim, head_dim, layers, registers,
                                  out_rows // (PATCH_T * PATCH * PATCH))
        w = {}

        def linear(key: str) -> None:  # read_linear: BF16/F16/F32 as stored, INT8 ConvRot dequantized
            lin = read_linear(ckpt, p + "decoder." + key, markers)
            w[key + ".weight"] = lin.dequantized()
            w[key + ".bias"] = lin.bias.float() if lin.bias is not None else torch.zeros(lin.out_features)

        markers = ckpt.quantization_markers()
        conv = read_tensor(ckpt, p + "post_quant_conv.weight", (latent, latent, 1, 1, 1))
        w["post_quant_conv.weight"] = conv.reshape(latent, latent)  # a 1x1x1 conv is a linear over channels
        w["post_quant_conv.bias"] = read_tensor(ckpt, p + "post_quant_conv.bias", (latent,))
        linear("proj_in")
        w["register_tokens"] = read_tensor(ckpt, p + "decoder.register_tokens", (1, registers, width))[0]
        for i in range(layers):
            b = f"transformer_blocks.{i}."
            for key in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2"):
                linear(b + key)
            for key in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
                w[b + key] = read_tensor(ckpt, p + "decoder." + b + key, (width,))
        for key in ("norm_out.weight", "norm_out.bias"):
            w[key] = read_tensor(ckpt, p + "decoder." + key, (width,))
        linear("proj_out")
        return cls(shape, w, *_latent_stats(ckpt, p, latents_mean, latents_std, "VideoDecoder.load"))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> VideoDecoder:
        """The decoder with its weights on device in dtype (norms and residual gates stay f32, as diffusers keeps
        them); IMAGE comes back on the CPU in f32."""
        keep = ("norm", "scale", "register")
        w = {k: v.to(device, torch.float32 if any(s in k for s in keep) else dtype) for k, v in self.w.items()}
        return type(self)(self.shape, w, self.latents_mean.to(device), self.latents_std.to(device))

    @torch.no_grad()  # not inference_mode: a node downstream may still modify the IMAGE in place
    def decode(self, latents: torch.Tensor, tile: int | None = TILE, overlap: int = TILE_OVERLAP,
               progress: Callable[[int, int], None] | None = None,
               check: Callable[[], None] | None = None) -> torch.Tensor:
        """Normalized latents -> IMAGE frames in 0..1: de-normalized with latents_mean/std, decoded in diffusers'
        clips of 7 latents 5 apart (cross-fading 5 frames), each clip in pixel tiles of `tile` overlapping by at
        least `overlap` (tile=None: whole frames), ImageNet de-normalized and clamped. progress(done, total)
        after each clip; check() after each block (it raises to cancel)."""
        z = self._check(latents)
        mean, std = self.latents_mean.view(1, -1, 1, 1, 1), self.latents_std.view(1, -1, 1, 1, 1)
        z = z * std.to(z) + mean.to(z)
        x = torch.cat([self.decode_raw(z[i:i + 1], tile, overlap, progress, check) for i in range(z.shape[0])])
        pm = torch.tensor(PIXEL_MEAN, dtype=torch.float32, device=x.device).view(1, -1, 1, 1, 1)
        ps = torch.tensor(PIXEL_STD, dtype=torch.float32, device=x.device).view(1, -1, 1, 1, 1)
        x = (x.float() * ps + pm).clamp(0.0, 1.0)
        return x.permute(0, 2, 3, 4, 1).flatten(0, 1).contiguous().cpu()

    def decode_raw(self, z: torch.Tensor, tile: int | None = TILE, overlap: int = TILE_OVERLAP,
                   progress=None, check=None) -> torch.Tensor:
        """Raw latents [1, 24, T, h, w] -> ImageNet-normalized pixels [1, 3, F, 16h, 16w] as diffusers'
        AutoencoderKLMiniMaxH3._decode: chunks of 5 latents plus the 2 the encoder's dropped tail overlaps, the
        trailing 5 frames of one chunk cross-faded into the next; a length that is no whole number of chunks
        padded with the last latent and the extra frames cut."""
        pt = self.shape.patch_t
        chunk = math.ceil(CLIP_LENGTH / pt)  # 5 latents a chunk
        pre = (-CLIP_LENGTH) % pt  # 3 leading frames the encoder never saw
        token_overlap = (-TOKEN_DROP) % chunk  # 2
        frame_overlap = max(token_overlap * pt - pre, 0)  # 5
        n = z.shape[2] + TOKEN_DROP
        pad = (-n) % chunk
        clips = (n + pad) // chunk - 1
        if clips < 1:
            # Fewer than 7 latents (an image, or the 2 latents of 5 frames): diffusers' loop decodes nothing here;
            # one whole clip with the encoder's leading pad dropped is what its chunks do to their first latents.
            x = self._clip(z, tile, overlap, check)[:, :, pre:]
            if progress is not None:
                progress(1, 1)
            return x
        if pad:
            z = torch.cat([z, z[:, :, -1:].expand(-1, -1, pad, -1, -1)], dim=2)
        out, tail = [], None
        for i in range(clips):
            x = self._clip(z[:, :, i * chunk:i * chunk + chunk + token_overlap], tile, overlap, check)
            head = x[:, :, pre:chunk * pt]
            if tail is not None:
                head = _blend(tail, head, frame_overlap, dim=2)
            out.append(head)
            tail = x[:, :, chunk * pt + pre:2 * chunk * pt]
            if progress is not None:
                progress(i + 1, clips)
        out.append(tail)
        x = torch.cat(out, dim=2)
        if pad:
            # A chunk's first latent covers CLIP_LENGTH % pt frames, the others pt (diffusers' pad_frames).
            tail_frames = CLIP_LENGTH % pt
            before = z.shape[2] - pad
            cut = sum(tail_frames if tail_frames and (before + k) % chunk == 0 else pt for k in range(pad))
            x = x[:, :, :-cut]
        return x

    def _clip(self, z: torch.Tensor, tile: int | None, overlap: int, check) -> torch.Tensor:
        """One clip, in diffusers' pixel tiles (AutoencoderKLMiniMaxH3._decode_clip) when tile is set."""
        if tile is None:
            return self.forward(z, check)
        f = self.shape.patch
        ys, yo = _split_tiles(z.shape[-2] * f, tile, overlap, f)
        xs, xo = _split_tiles(z.shape[-1] * f, tile, overlap, f)
        rows = [[self.forward(z[..., y // f:y // f + ty // f, x // f:x // f + tx // f], check) for x, tx in xs]
                for y, ty in ys]
        return _stitch(rows, yo, xo)

    def forward(self, z: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Raw latents [B, 24, T, h, w] of one clip -> ImageNet-normalized pixels [B, 3, 4T, 16h, 16w] (diffusers'
        post_quant_conv + MiniMaxH3VideoViTDecoder3d, every latent voxel a token)."""
        s, w, check = self.shape, self.w, check or (lambda: None)
        wt = w["proj_in.weight"]
        b, _, t, h, wd = z.shape
        x = z.to(wt).permute(0, 2, 3, 4, 1).reshape(b, t * h * wd, -1)
        x = F.linear(F.linear(x, w["post_quant_conv.weight"].to(wt), w["post_quant_conv.bias"].to(wt)), wt,
                     w["proj_in.bias"])
        n = x.shape[1]
        # Registers, then one all-zero token; all of them at position 0 (cos 1, sin 0: not rotated).
        x = torch.cat([x, w["register_tokens"].to(x).expand(b, -1, -1), x.new_zeros(b, 1, s.width)], dim=1).float()
        cos, sin = self._rope(t, h, wd, x.device)
        for i in range(s.layers):
            check()
            x = self._block(x, f"transformer_blocks.{i}.", cos, sin)
        x = F.layer_norm(x, (s.width,), w["norm_out.weight"], w["norm_out.bias"], s.eps)
        wo = w["proj_out.weight"]
        x = F.linear(x[:, :n].to(wo), wo, w["proj_out.bias"])
        p, pt, c = s.patch, s.patch_t, s.out_channels
        x = x.view(b, t, h, wd, c, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return x.reshape(b, c, t * pt, h * p, wd * p)

    def _rope(self, t: int, h: int, wd: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [S, rope_dim]: positions ((i + 0.5) / n * 2 - 1) per axis, angles 2 pi pos inv_freq, the
        three axes' angles concatenated then repeated twice (rotate-half pairs c with c + rope_dim / 2)."""
        s = self.shape
        inv = 1.0 / s.rope_theta ** torch.arange(0, 1, 6 / s.rope_dim, dtype=torch.float32, device=device)
        grids = [2.0 * (torch.arange(0.5, n, dtype=torch.float32, device=device) / n) - 1.0 for n in (t, h, wd)]
        pos = torch.stack(torch.meshgrid(*grids, indexing="ij"), dim=-1).flatten(0, 2)
        pos = torch.cat([pos, pos.new_zeros(s.registers + 1, 3)])
        angles = (2.0 * math.pi * pos[:, :, None] * inv).flatten(1, 2).tile(2)
        return angles.cos(), angles.sin()

    def _block(self, x: torch.Tensor, b: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Pre-norm block: RMSNorm (affine), attention with per-head q/k RMSNorm (no affine) and partial RoPE,
        SwiGLU (diffusers' net.0.proj holds [value; gate]), each branch times its per-channel gate."""
        s, w = self.shape, self.w
        wq = w[b + "attn.to_q.weight"]
        y = F.rms_norm(x, (s.width,), w[b + "norm1.weight"], s.eps).to(wq)
        bsz, n, _ = y.shape
        q, k, v = (F.linear(y, w[b + f"attn.to_{c}.weight"], w[b + f"attn.to_{c}.bias"]).view(bsz, n, s.heads, -1)
                   for c in "qkv")
        q = _rotate(F.rms_norm(q.float(), (s.head_dim,), eps=s.eps).to(wq), cos, sin)
        k = _rotate(F.rms_norm(k.float(), (s.head_dim,), eps=s.eps).to(wq), cos, sin)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        a = F.linear(a.transpose(1, 2).flatten(2), w[b + "attn.to_out.0.weight"], w[b + "attn.to_out.0.bias"])
        x = x + a.float() * w[b + "scale1"]
        y = F.rms_norm(x, (s.width,), w[b + "norm2.weight"], s.eps).to(wq)
        value, gate = F.linear(y, w[b + "ff.net.0.proj.weight"], w[b + "ff.net.0.proj.bias"]).chunk(2, dim=-1)
        y = F.linear(value * F.silu(gate), w[b + "ff.net.2.weight"], w[b + "ff.net.2.bias"])
        return x + y.float() * w[b + "scale2"]

    def _check(self, latents: torch.Tensor) -> torch.Tensor:
        return checked_latents(latents, 5, LATENT_CHANNELS, 1, f"samples: expected H3 video latents [B, "
                               f"{LATENT_CHANNELS}, T, h, w], got {{got}}; is this latent from another model family "
                               f"(or the audio part of an AV latent)?", self.w["proj_in.weight"], torch.float32)


@dataclass(frozen=True)
class VideoEncoderShape:
    """The causal CNN's sizes: channels and resnets per level from the file; where each level downsamples is not in
    it (only whether it does), so the family supplies the factors."""
    channels: tuple[int, ...]  # per level
    blocks: int  # resnets per level
    spatial: tuple[int, ...]  # downsample factor per level
    temporal: tuple[int, ...]
    latent_channels: int = LATENT_CHANNELS
    groups: int = ENCODER_GROUPS
    eps: float = ENCODER_EPS

    @property
    def patch(self) -> int:
        return math.prod(self.spatial)


class VideoEncoder:
    """H3 video VAE encoder: IMAGE frames [F, H, W, 3] in 0..1 (one video) -> normalized latents
    [1, 24, T, H/16, W/16] (sizes halved with the floor), T = 1 for one frame, else 5 per 17 frames begun, less 3."""

    def __init__(self, shape: VideoEncoderShape, weights: dict[str, torch.Tensor], latents_mean: torch.Tensor,
                 latents_std: torch.Tensor):
        self.shape = shape
        self.w = weights  # diffusers' names without the `encoder.` prefix, plus quant_conv.*
        self.latents_mean, self.latents_std = latents_mean, latents_std

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, latents_mean=None, latents_std=None,
             spatial: tuple[int, ...] = SPATIAL_FACTORS, temporal: tuple[int, ...] = TEMPORAL_FACTORS,
             groups: int = ENCODER_GROUPS) -> VideoEncoder:
        """The encoder of `source` (the same file as the decoder's); latents_mean/std as VideoDecoder.load."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {ENCODER_EXPECTED}")

        p = _find_prefix(ckpt, ENCODER_ANCHOR, ENCODER_EXPECTED)
        e = p + "encoder."
        conv_in = ckpt.shape(e + "conv_in.weight")
        if len(conv_in) != 5 or conv_in[1] != 3:
            raise error(f"'{e}conv_in.weight' has shape {list(conv_in)}, not a 3-D conv over RGB")
        levels = ckpt.numbered(e + "down_blocks.", ".resnets.0.conv1.weight")
        if levels != len(spatial) or levels != len(temporal):
            raise error(f"{levels} levels ({e}down_blocks.N) but downsample factors {spatial} / {temporal}")
        for i in range(levels):
            if (f"{e}down_blocks.{i}.downsamplers.0.conv.weight" in ckpt) != (spatial[i] * temporal[i] > 1):
                raise error(f"level {i}'s downsampler does not fit the factors {spatial[i]} x {temporal[i]}")
        channels = tuple(ckpt.shape(f"{e}down_blocks.{i}.resnets.0.conv1.weight")[0] for i in range(levels))
        if any(c % groups for c in channels):
            raise error(f"channels {channels} are not divisible by {groups} norm groups")
        moments = ckpt.shape(e + "conv_out.weight")[0]
        shape = VideoEncoderShape(channels, ckpt.numbered(e + "down_blocks.0.resnets.", ".conv1.weight"),
                                  tuple(spatial), tuple(temporal), moments // 2, groups)
        if shape.latent_channels != LATENT_CHANNELS:
            raise error(f"'{e}conv_out.weight' gives {moments} moments, expected {2 * LATENT_CHANNELS}")
        w = {}
        for name, expected in _encoder_tensors(shape).items():
            key = p + name if name.startswith("quant_conv.") else e + name
            if key not in ckpt:
                raise error(f"tensor '{key}' is missing")
            if not ckpt.dtype(key).is_floating_point:  # INT8 codes need their scales: never read them as values
                raise error(f"'{key}' is stored as {ckpt.dtype(key)}; the encoder reads float convs only")
            w[name] = read_tensor(ckpt, key, expected)
        return cls(shape, w, *_latent_stats(ckpt, p, latents_mean, latents_std, "VideoEncoder.load"))

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> VideoEncoder:
        """The encoder on device in dtype (f32 by default: diffusers pins it to f32); latents come back on the CPU."""
        w = {k: v.to(device, dtype) for k, v in self.w.items()}
        return type(self)(self.shape, w, self.latents_mean.to(device), self.latents_std.to(device))

    @torch.no_grad()
    def encode(self, image: torch.Tensor, tile: int | None = TILE, overlap: int = TILE_OVERLAP,
               sample_seed: int | None = None, progress: Callable[[int, int], None] | None = None,
               check: Callable[[], None] | None = None) -> torch.Tensor:
        """IMAGE frames [F, H, W, C >= 3] in 0..1 -> normalized latents [1, 24, T, h, w] on the CPU: ImageNet-
        normalized, encoded as diffusers' AutoencoderKLMiniMaxH3.encode (clips of 17, pixel tiles of `tile`
        overlapping by at least `overlap`; tile=None: whole frames), then (z - latents_mean) / latents_std.
        z is the posterior mean; with sample_seed, diffusers' condition recipe (encode_vae_condition): a sample
        under torch.Generator().manual_seed(sample_seed), rounded to f16. progress(done, total) after each clip;
        check() after each resnet (it raises to cancel)."""
        if not isinstance(image, torch.Tensor) or image.dim() != 4 or image.shape[-1] < 3:
            got = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"pixels: expected IMAGE frames [F, H, W, 3] in 0..1, got {got}")
        device = self.latents_mean.device
        pm = torch.tensor(PIXEL_MEAN, dtype=torch.float32, device=device)
        ps = torch.tensor(PIXEL_STD, dtype=torch.float32, device=device)
        x = (image[..., :3].to(device, torch.float32) - pm) / ps  # VAEEncode's [..., :3]: alpha dropped
        mean, logvar = self.moments(x.permute(3, 0, 1, 2)[None], tile, overlap, progress, check).chunk(2, dim=1)
        z = mean
        if sample_seed is not None:  # DiagonalGaussianDistribution.sample on a CPU generator
            noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(sample_seed)).to(mean)
            z = (mean + torch.exp(0.5 * logvar.clamp(-30.0, 20.0)) * noise).half().float()
        shape = (1, -1, 1, 1, 1)
        return ((z - self.latents_mean.view(shape)) / self.latents_std.view(shape)).cpu()

    def moments(self, pixels: torch.Tensor, tile: int | None = TILE, overlap: int = TILE_OVERLAP,
                progress=None, check=None) -> torch.Tensor:
        """ImageNet-normalized pixels [B, 3, F, H, W] -> posterior moments [B, 48, T, h, w] (mean, then log
        variance) as diffusers' AutoencoderKLMiniMaxH3._encode: one frame through the encoder alone; more in clips
        of 17 frames (the last padded with copies of the last frame), each clip causal from its own start, and
        the 3 trailing latents of the whole dropped."""
        n = pixels.shape[2]
        if n == 1:
            clips = [pixels]
        else:
            pad = (-n) % CLIP_LENGTH
            if pad:
                pixels = torch.cat([pixels, pixels[:, :, -1:].expand(-1, -1, pad, -1, -1)], dim=2)
            clips = pixels.split(CLIP_LENGTH, dim=2)
        out = []
        for i, clip in enumerate(clips):
            out.append(self._clip(clip, tile, overlap, check))
            if progress is not None:
                progress(i + 1, len(clips))
        x = torch.cat(out, dim=2)
        return x if n == 1 else x[:, :, :-TOKEN_DROP]

    def _clip(self, x: torch.Tensor, tile: int | None, overlap: int, check) -> torch.Tensor:
        """One clip, in diffusers' pixel tiles (AutoencoderKLMiniMaxH3._encode_clip), blended in latent space."""
        if tile is None:
            return self.forward(x, check)
        f = self.shape.patch
        ys, yo = _split_tiles(x.shape[-2], tile, overlap, f)
        xs, xo = _split_tiles(x.shape[-1], tile, overlap, f)
        rows = [[self.forward(x[..., y:y + ty, c:c + tx], check) for c, tx in xs] for y, ty in ys]
        return _stitch(rows, [o // f for o in yo], [o // f for o in xo])

    def forward(self, x: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Pixels [B, 3, F, H, W] of one clip -> moments [B, 48, T, h, w] (MiniMaxH3VideoEncoder3d + quant_conv)."""
        s, w, check = self.shape, self.w, check or (lambda: None)
        x = _causal_conv(x, w, "conv_in")
        cin = s.channels[0]
        for i, c in enumerate(s.channels):
            for j in range(s.blocks):
                name = f"down_blocks.{i}.resnets.{j}"
                h = _causal_conv(F.silu(self._norm(x, name + ".norm1")), w, name + ".conv1")
                h = _causal_conv(F.silu(self._norm(h, name + ".norm2")), w, name + ".conv2")
                x = (_causal_conv(x, w, name + ".conv_shortcut") if cin != c else x) + h
                cin = c
                check()
            if s.spatial[i] * s.temporal[i] > 1:
                # The conv has no spatial padding: a stride of 2 gets one reflected row and column at the bottom
                # and right first (size // 2 out); time stays causal (2 zero frames in front).
                if s.spatial[i] == 2:
                    x = F.pad(x, (0, 1, 0, 1, 0, 0), mode="reflect")
                x = _causal_conv(x, w, f"down_blocks.{i}.downsamplers.0.conv", (s.temporal[i], s.spatial[i],
                                                                                s.spatial[i]), spatial_pad=0)
        x = _causal_conv(F.silu(self._norm(x, "norm_out")), w, "conv_out")
        return F.conv3d(x, w["quant_conv.weight"], w["quant_conv.bias"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """GroupNorm of each frame alone (the original's use_t_isolated_gn): time folded into the batch."""
        b, c, t, h, wd = x.shape
        y = F.group_norm(x.transpose(1, 2).reshape(b * t, c, h, wd), self.shape.groups, self.w[name + ".weight"],
                         self.w[name + ".bias"], self.shape.eps)
        return y.view(b, t, c, h, wd).transpose(1, 2)


def _encoder_tensors(shape: VideoEncoderShape) -> dict[str, tuple[int, ...]]:
    """Every tensor the encoder's forward reads (names without `encoder.`, but quant_conv.*), with its shape."""
    t: dict[str, tuple[int, ...]] = {}

    def conv(name: str, cin: int, cout: int, k: int = 3) -> None:
        t[name + ".weight"], t[name + ".bias"] = (cout, cin, k, k, k), (cout,)

    def norm(name: str, c: int) -> None:
        t[name + ".weight"], t[name + ".bias"] = (c,), (c,)

    ch, moments = shape.channels, 2 * shape.latent_channels
    conv("conv_in", 3, ch[0])
    cin = ch[0]
    for i, c in enumerate(ch):
        for j in range(shape.blocks):
            name = f"down_blocks.{i}.resnets.{j}"
            norm(name + ".norm1", cin)
            conv(name + ".conv1", cin, c)
            norm(name + ".norm2", c)
            conv(name + ".conv2", c, c)
            if cin != c:
                conv(name + ".conv_shortcut", cin, c, 1)
            cin = c
        if shape.spatial[i] * shape.temporal[i] > 1:
            conv(f"down_blocks.{i}.downsamplers.0.conv", c, c)
    norm("norm_out", ch[-1])
    conv("conv_out", ch[-1], moments)
    conv("quant_conv", moments, moments, 1)
    return t


def _causal_conv(x: torch.Tensor, w: dict, name: str, stride: tuple[int, int, int] = (1, 1, 1),
                 spatial_pad: int | None = None) -> torch.Tensor:
    """MiniMaxH3VideoCausalConv3d: reflect-padded in space (k // 2 unless given), k_t - 1 zero frames in front
    (a frame sees only itself and earlier ones), unpadded conv."""
    weight = w[name + ".weight"]
    pad = weight.shape[-1] // 2 if spatial_pad is None else spatial_pad
    if pad:
        x = F.pad(x, (pad, pad, pad, pad, 0, 0), mode="reflect")
    if weight.shape[2] > 1:
        x = F.pad(x, (0, 0, 0, 0, weight.shape[2] - 1, 0))
    return F.conv3d(x, weight, w[name + ".bias"], stride=stride)


def _find_prefix(ckpt: Checkpoint, anchor: str, expected: str) -> str:
    """The prefix before `anchor` (e.g. '', 'vae.'); the shortest if several."""
    found = [k[: -len(anchor)] for k in ckpt.keys()  # noqa: SIM118 (a list, no __iter__)
             if k.endswith(anchor) and (k == anchor or k[-len(anchor) - 1] == ".")]
    if not found:
        raise WeightsError(f"{ckpt.path.name}: no '{anchor}' tensor; expected {expected}")
    return min(found, key=len)


def _latent_stats(ckpt: Checkpoint, p: str, latents_mean, latents_std, reader: str) -> list[torch.Tensor]:
    """[latents_mean, latents_std] (24 values each): the file's tensors where it holds them, else the arguments
    (diffusers' vae/config.json)."""
    stats = []
    for key, given in (("latents_mean", latents_mean), ("latents_std", latents_std)):
        if p + key in ckpt:
            stats.append(read_tensor(ckpt, p + key).reshape(-1))
        elif given is not None:
            stats.append(torch.as_tensor(given, dtype=torch.float32).reshape(-1))
        else:
            raise WeightsError(f"{ckpt.path.name}: no '{p + key}' tensor; pass {key} ({LATENT_CHANNELS} values, "
                               f"the VAE's config.json) to {reader}")
        if stats[-1].numel() != LATENT_CHANNELS:
            raise WeightsError(f"{ckpt.path.name}: {key} has {stats[-1].numel()} values, expected {LATENT_CHANNELS}")
    return stats


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] channels of each head; x [B, S, H, D], cos/sin [S, R]."""
    r = cos.shape[-1]
    cos, sin = cos[None, :, None].to(x), sin[None, :, None].to(x)
    rot, keep = x[..., :r], x[..., r:]
    first, second = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-second, first], dim=-1) * sin, keep], dim=-1)


def _split_tiles(length: int, tile: int, min_overlap: int, f: int) -> tuple[list[tuple[int, int]], list[int]]:
    """diffusers' _split_tiles: the fewest `tile`-pixel tiles keeping every overlap >= min_overlap, the slack
    spread round-robin over the overlaps in whole latents (f pixels) so tile edges stay on the latent grid.
    Returns ([(start, size)], overlaps)."""
    if tile >= length:
        return [(0, length)], []
    m = math.ceil(length / tile)
    while tile * m - min_overlap * (m - 1) < length:
        m += 1
    overlaps = [min_overlap] * (m - 1)
    for i in range((tile * m - sum(overlaps) - length) // f):
        overlaps[i % (m - 1)] += f
    starts = [0]
    for o in overlaps:
        starts.append(starts[-1] + tile - o)
    return [(s, tile) for s in starts], overlaps


def _blend(a: torch.Tensor, b: torch.Tensor, extent: int, dim: int) -> torch.Tensor:
    """diffusers' _blend: b with its first `extent` entries along dim faded in linearly (weight i / extent) over
    a's last ones."""
    extent = min(a.shape[dim], b.shape[dim], extent)
    shape = [1] * a.dim()
    shape[dim] = extent
    ramp = (torch.arange(extent, device=b.device, dtype=b.dtype) / extent).view(shape)
    mixed = a.narrow(dim, a.shape[dim] - extent, extent) * (1 - ramp) + b.narrow(dim, 0, extent) * ramp
    return torch.cat([mixed, b.narrow(dim, extent, b.shape[dim] - extent)], dim=dim)


def _stitch(tiles: list[list[torch.Tensor]], y_overlaps: list[int], x_overlaps: list[int]) -> torch.Tensor:
    """diffusers' _stitch_tiles: each tile blended into its upper and left neighbours (as decoded, unblended),
    then cut to its share."""
    rows = []
    for i, row in enumerate(tiles):
        out = []
        for j, t in enumerate(row):
            if i > 0:
                t = _blend(tiles[i - 1][j], t, y_overlaps[i - 1], dim=-2)
            if j > 0:
                t = _blend(row[j - 1], t, x_overlaps[j - 1], dim=-1)
            if i < len(tiles) - 1:
                t = t[..., :-y_overlaps[i], :]
            if j < len(row) - 1:
                t = t[..., :, :-x_overlaps[j]]
            out.append(t)
        rows.append(torch.cat(out, dim=-1))
    return torch.cat(rows, dim=-2)
