"""MiniMax H3's video VAE decoder (the ViT of diffusers' AutoencoderKLMiniMaxH3, its names) in f32: clips, tiles."""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_linear, read_tensor

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
ANCHOR = "decoder.proj_in.weight"
EXPECTED = ("an H3 video VAE in diffusers' AutoencoderKLMiniMaxH3 names (post_quant_conv.*, decoder.proj_in.*, "
            "decoder.register_tokens, decoder.transformer_blocks.N.*, decoder.norm_out.*, decoder.proj_out.*), "
            "optionally under a prefix such as 'vae.'")


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
        found = [k[: -len(ANCHOR)] for k in ckpt.keys() if k.endswith(ANCHOR)]  # noqa: SIM118
        if not found:
            raise WeightsError(f"{name}: no '{ANCHOR}' tensor; expected {EXPECTED}")
        p = min(found, key=len)
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
        stats = []
        for key, given in (("latents_mean", latents_mean), ("latents_std", latents_std)):
            if p + key in ckpt:
                stats.append(read_tensor(ckpt, p + key).reshape(-1))
            elif given is not None:
                stats.append(torch.as_tensor(given, dtype=torch.float32).reshape(-1))
            else:
                raise WeightsError(f"{name}: no '{p + key}' tensor; pass {key} (24 values, the VAE's "
                                   f"config.json) to VideoDecoder.load")
            if stats[-1].numel() != LATENT_CHANNELS:
                raise WeightsError(f"{name}: {key} has {stats[-1].numel()} values, expected {LATENT_CHANNELS}")
        return cls(shape, w, *stats)

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
        if not isinstance(latents, torch.Tensor) or latents.dim() != 5 or latents.shape[1] != LATENT_CHANNELS:
            got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise ValueError(f"samples: expected H3 video latents [B, {LATENT_CHANNELS}, T, h, w], got {got}; is "
                             f"this latent from another model family (or the audio part of an AV latent)?")
        return latents.to(self.w["proj_in.weight"].device, torch.float32)


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
