"""What the VAEs' decoders and encoders share: the layers as functions of a weight table (convolution, group norm,
pixel norm, resnet, single-head attention, the middle), the soft tiles' spans and ramps (ours, and ComfyUI's
feathered tiles), reading a decoder or encoder from a file whose layout (Layout) each VAE names, and the check of
the latents a decoder is given."""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor

# BFL's Normalize is GroupNorm(32, eps=1e-6) throughout the decoder; the group count is not in the file.
GROUPS = 32
EPS = 1e-6
ANCHOR = "decoder.conv_in.weight"


@dataclass(frozen=True)
class Layout:
    """What a VAE file of one family holds: checked at load, and named in every error."""
    latent_channels: int
    post_quant: bool  # a 1x1 decoder.post_quant_conv before conv_in (FLUX.2); FLUX.1 has none
    name: str  # e.g. "FLUX.1 VAE"
    expected: str  # the file we expect, for error messages

    def error(self, ckpt: Checkpoint, why: str) -> WeightsError:
        return WeightsError(f"{ckpt.path.name}: {why}; expected {self.expected}")


@dataclass(frozen=True)
class DecoderShape:
    """The decoder's sizes, read from the file. Level 0 is full resolution (BFL's `up.0`, without upsample).
    The image is `factor` = 2^(levels-1) times the latent: 8 for FLUX.1's four levels."""
    latent_channels: int
    channels: tuple[int, ...]  # per level, level 0 first
    blocks: int  # resnet blocks per level (BFL num_res_blocks + 1)
    out_channels: int
    groups: int = GROUPS
    post_quant: bool = False  # decoder.post_quant_conv, 1x1 on the latents (FLUX.2)

    @property
    def factor(self) -> int:
        return 2 ** (len(self.channels) - 1)


# --- the layers, as functions of the weight table --------------------------------------------------------

def checked_latents(latents, dims: int, channels: int, channel_dim: int, expected: str, like: torch.Tensor,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """latents on like's device as dtype (like's when None), when a tensor of `dims` dims with `channels` at
    channel_dim; else ValueError "<expected>, got <its shape>" (expected names the input, the layout and, where it
    helps, the likely mix-up)."""
    if not isinstance(latents, torch.Tensor) or latents.dim() != dims or latents.shape[channel_dim] != channels:
        got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
        head, _, tail = expected.partition("{got}")
        raise ValueError(f"{head}{got}{tail}")
    return latents.to(like.device, like.dtype if dtype is None else dtype)


def conv(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    weight = w[f"{name}.weight"]
    return F.conv2d(x, weight, w[f"{name}.bias"], padding=weight.shape[-1] // 2)


# An activation whose bias is not yet added: (x, one f32 value a channel or None). torch adds a conv's bias in a pass
# of its own (6.3 of a 1024x1024 FLUX.1 decode's 33 ms, H100); carried instead, it is added where the activation is
# read anyway: by a group norm (its shift), summed along a residual, through a 1x1 conv (W (x + b) = W x + W b).
Pending = tuple[torch.Tensor, "torch.Tensor | None"]


def conv_pending(x: torch.Tensor, w: dict, name: str) -> Pending:
    weight = w[f"{name}.weight"]
    return F.conv2d(x, weight, None, padding=weight.shape[-1] // 2), w[f"{name}.bias"].float()


def conv1x1_pending(pending: Pending, w: dict, name: str) -> Pending:
    """A 1x1 conv of a pending activation, exact on its bias: W (x + b) + c = W x + (W b + c)."""
    x, bias = pending
    weight, own = w[f"{name}.weight"], w[f"{name}.bias"].float()
    return F.conv2d(x, weight), own if bias is None else own + weight.flatten(1).float() @ bias


def summed(a: Pending, b: Pending) -> Pending:
    """a + b, their biases summed and still pending (a residual sum)."""
    return a[0] + b[0], a[1] if b[1] is None else b[1] if a[1] is None else a[1] + b[1]


def added(pending: Pending) -> torch.Tensor:
    """The activation with its bias added (before what zero-pads it or spreads it: an upsample's conv, a stride)."""
    x, bias = pending
    return x if bias is None else x + bias.to(x.dtype).reshape(-1, *[1] * (x.dim() - 2))


def nearest_x2(x: torch.Tensor) -> torch.Tensor:
    """F.interpolate(x, scale_factor=2.0, mode="nearest") of [B, C, H, W], in x's memory format; channels last as one
    broadcast copy of [B, H, W, C] rows (torch's channels-last nearest kernel took 0.68 ms a call at the Qwen-Image
    decoder's sizes, H100)."""
    if x.is_contiguous() or not x.movedim(1, -1).is_contiguous():
        return F.interpolate(x, scale_factor=2.0, mode="nearest")
    b, c, h, w = x.shape
    rows = x.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(b, h, 2, w, 2, c)
    return rows.reshape(b, 2 * h, 2 * w, c).permute(0, 3, 1, 2)


def group_norm(x: torch.Tensor, w: dict, name: str, groups: int, silu: bool = False,
               shift: torch.Tensor | None = None) -> torch.Tensor:
    """GroupNorm of x + shift (a pending bias), then SiLU where silu: on a GPU one kernel (kernels/group_norm.py:
    torch's norm keeps most of the card idle at decode sizes), on the CPU torch's."""
    if x.is_cuda:
        from ..gpu.block import run
        laid = x if x.is_contiguous(memory_format=torch.channels_last) else x.contiguous()  # (the kernels take both)
        return run("group_norm", laid, w[f"{name}.weight"], w[f"{name}.bias"], groups, EPS, silu, shift)
    y = F.group_norm(added((x, shift)), groups, w[f"{name}.weight"], w[f"{name}.bias"], EPS)
    return F.silu(y) if silu else y


def kernels_built_ahead(device: str | torch.device, build: Callable[[object], int]) -> threading.Thread | None:
    """build(the kernels package) on a thread of its own, started now (at a decoder's load: a first decode found its
    norms' kernels unbuilt and spent about 1.3 s building them), or None where they don't run (the CPU, Triton's
    interpreter)."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    from ..gpu.block import kernels
    from ..gpu.builds import on_own_thread
    ops = kernels()
    if ops.needs_triton_gpu(device) is not None:
        return None
    return on_own_thread(lambda: build(ops), device, "swiftdit-norm-builds", "norm kernels not built ahead")


def norms_built_ahead(device: str | torch.device, dtype: torch.dtype,
                      channels_last: tuple[int, ...] = ()) -> threading.Thread | None:
    """kernels_built_ahead of group_norm's kernels for a decoder in dtype; channels_last: the widths of a
    channels-last decoder's norms."""
    return kernels_built_ahead(device, lambda ops: ops.group_norm.build(dtype, last_widths=channels_last,
                                                                        groups=GROUPS))


def mid(x: Pending, w: dict, groups: int) -> Pending:
    """The middle of encoder and decoder alike: resnet, attention, resnet (BFL autoencoder.py `mid`)."""
    x = resnet(x, w, "mid.block_1", groups)
    return resnet(attention(x, w, "mid.attn_1", groups), w, "mid.block_2", groups)


def resnet(pending: Pending, w: dict, name: str, groups: int) -> Pending:
    """Pre-norm residual block, no time embedding (diffusers 0.42.1 resnet.py ResnetBlock2D, temb None), its biases
    pending."""
    x, bias = pending
    h, b1 = conv_pending(group_norm(x, w, f"{name}.norm1", groups, True, bias), w, f"{name}.conv1")
    h = conv_pending(group_norm(h, w, f"{name}.norm2", groups, True, b1), w, f"{name}.conv2")
    nin = f"{name}.nin_shortcut"  # 1x1 conv where the channel count changes
    return summed(conv1x1_pending(pending, w, nin) if f"{nin}.weight" in w else pending, h)


def pixel_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x over the root mean square of its channels (dim 1) at each position, no weight: the LTX VAEs' norm
    (diffusers PerChannelRMSNorm / LTX2AudioPixelNorm)."""
    return x / torch.sqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)


def attention(pending: Pending, w: dict, name: str, groups: int) -> Pending:
    """Single-head self-attention over all positions, residual (BFL AttnBlock; diffusers heads = C // C)."""
    x, bias = pending
    b, c, hh, ww = x.shape
    t = group_norm(x, w, f"{name}.norm", groups, shift=bias).flatten(2).transpose(1, 2)  # [B, HW, C]
    q, k, v = (F.linear(t, w[f"{name}.{p}.weight"], w[f"{name}.{p}.bias"]) for p in "qkv")
    a = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
    a = F.linear(a, w[f"{name}.proj_out.weight"], w[f"{name}.proj_out.bias"])
    return x + a.transpose(1, 2).reshape(b, c, hh, ww), bias


# --- tiles -----------------------------------------------------------------------------------------------

def spans(n: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) of tiles covering 0..n: as few as overlap allows, evenly spaced so that neighbours overlap
    by at least `overlap` cells (the stride (n - tile) / (m - 1) is at most tile - overlap)."""
    if n <= tile:
        return [(0, n)]
    m = math.ceil((n - overlap) / (tile - overlap))
    return [(s, s + tile) for s in (round(i * (n - tile) / (m - 1)) for i in range(m))]


def ramp(spans: list[tuple[int, int]], i: int, f: int) -> torch.Tensor:
    """Tile i's blend weights along one axis, in pixels: 1 inside, rising (k + 0.5) / R across the R pixels
    it shares with the previous tile and falling likewise toward the next: neighbours' weights sum to 1."""
    start, end = spans[i]
    wt = torch.ones((end - start) * f, dtype=torch.float32)
    if i > 0:
        r = (spans[i - 1][1] - start) * f
        if r > 0:
            wt[:r] = torch.minimum(wt[:r], (torch.arange(r) + 0.5) / r)
    if i + 1 < len(spans):
        r = (end - spans[i + 1][0]) * f
        if r > 0:
            wt[-r:] = torch.minimum(wt[-r:], (torch.arange(r - 1, -1, -1) + 0.5) / r)
    return wt


def sliding_tiles(n: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """(start, length) of ComfyUI's tiles along one latent axis (comfy.utils.tiled_scale_multidim): starts every
    tile - overlap cells while they leave more than overlap cells, the last one cut at the end."""
    if n <= tile:
        return [(0, n)]
    return [(s, min(tile, n - s)) for s in range(0, n - overlap, tile - overlap)]


def feather(length: int, width: int) -> torch.Tensor:
    """A tile's blend weights along one axis as ComfyUI makes them: the t-th cell from either end (t < width)
    times (t + 1) / width, both factors where the ends meet; all ones when width >= length. Tiles are summed
    with these weights and divided by the weights' sum, so the result is seam-free wherever tiles overlap."""
    wt = torch.ones(length, dtype=torch.float32)
    if 0 < width < length:
        ramp = (torch.arange(width, dtype=torch.float32) + 1) / width
        wt[:width] *= ramp
        wt[length - width:] *= ramp.flip(0)
    return wt


# --- loading ---------------------------------------------------------------------------------------------

def find_prefix(ckpt: Checkpoint, layout: Layout) -> str:
    """The prefix before `decoder.` (e.g. '', 'vae.', 'first_stage_model.'); the shortest if several."""
    found = [k[: -len(ANCHOR)] for k in ckpt.keys() if k.endswith(ANCHOR)  # noqa: SIM118 (a list, no __iter__)
             and (k == ANCHOR or k[-len(ANCHOR) - 1] == ".")]
    if not found:
        raise layout.error(ckpt, f"no '{ANCHOR}' tensor")
    return min(found, key=len)


def read_levels(ckpt: Checkpoint, part: str, kind: str, groups: int, layout: Layout) -> tuple[tuple[int, ...], int]:
    """(channels per level, resnet blocks per level) of BFL's `{part}{kind}.N.block.J` (kind 'up' or 'down')."""
    keys = [k[len(part):] for k in ckpt.keys() if k.startswith(part)]  # noqa: SIM118
    if any(k.startswith(f"{kind}_blocks.") for k in keys):
        raise layout.error(ckpt, f"{part[:-1]} tensors are in diffusers naming ({part}{kind}_blocks.*), not BFL's")
    levels = {int(k.split(".")[1]) for k in keys if k.startswith(f"{kind}.") and k.split(".")[1].isdigit()}
    if not levels or levels != set(range(len(levels))):
        raise layout.error(ckpt, f"levels {part}{kind}.N found: {sorted(levels)}, expected 0..L-1")
    blocks = {lv: {int(k.split(".")[3]) for k in keys if k.startswith(f"{kind}.{lv}.block.")} for lv in levels}
    n = len(blocks[0])
    if n == 0 or any(b != set(range(n)) for b in blocks.values()):
        raise layout.error(ckpt, f"resnet blocks per level differ or have gaps: {blocks}")
    channels = tuple(ckpt.shape(f"{part}{kind}.{lv}.block.0.conv1.weight")[0] for lv in range(len(levels)))
    if any(c % groups for c in channels):
        raise WeightsError(f"{ckpt.path.name}: VAE channels {channels} are not divisible by {groups} "
                           f"norm groups (the FLUX VAEs use 32)")
    return channels, n


def read_shape(ckpt: Checkpoint, prefix: str, groups: int, layout: Layout) -> DecoderShape:
    """Levels, channels and blocks per level from the tensor names and shapes (BFL autoencoder.py layout)."""
    d = prefix + "decoder."
    conv_in = ckpt.shape(d + "conv_in.weight")
    if len(conv_in) != 4 or conv_in[1] != layout.latent_channels:
        raise layout.error(ckpt, f"'{d}conv_in.weight' has shape {conv_in} ({conv_in[1]} latent channels)")
    channels, n = read_levels(ckpt, d, "up", groups, layout)
    if prefix + "post_quant_conv.weight" in ckpt:
        raise layout.error(ckpt, "it has a post_quant_conv (an SD-style VAE)")
    return DecoderShape(conv_in[1], channels, n, ckpt.shape(d + "conv_out.weight")[0], groups, layout.post_quant)


class Shapes(dict):
    """name -> expected shape, filled by the layers' own names (the forward functions above read the same)."""

    def conv(self, name: str, cin: int, cout: int, k: int = 3) -> None:
        self[f"{name}.weight"], self[f"{name}.bias"] = (cout, cin, k, k), (cout,)

    def norm(self, name: str, c: int) -> None:
        self[f"{name}.weight"], self[f"{name}.bias"] = (c,), (c,)

    def resnet(self, name: str, cin: int, cout: int) -> None:
        for i, (a, b) in enumerate(((cin, cout), (cout, cout)), 1):
            self.norm(f"{name}.norm{i}", a)
            self.conv(f"{name}.conv{i}", a, b)
        if cin != cout:
            self.conv(f"{name}.nin_shortcut", cin, cout, 1)

    def mid(self, c: int) -> None:
        self.resnet("mid.block_1", c, c)
        self.resnet("mid.block_2", c, c)
        self.norm("mid.attn_1.norm", c)
        for p in ("q", "k", "v", "proj_out"):
            self.conv(f"mid.attn_1.{p}", c, c, 1)


def decoder_tensors(shape: DecoderShape) -> Shapes:
    """Every decoder tensor the forward uses, with its expected shape (without the `decoder.` prefix)."""
    ch, top, t = shape.channels, shape.channels[-1], Shapes()
    if shape.post_quant:
        t.conv("post_quant_conv", shape.latent_channels, shape.latent_channels, 1)
    t.conv("conv_in", shape.latent_channels, top)
    t.mid(top)
    cin = top
    for level in reversed(range(len(ch))):
        for j in range(shape.blocks):
            t.resnet(f"up.{level}.block.{j}", cin, ch[level])
            cin = ch[level]
        if level > 0:
            t.conv(f"up.{level}.upsample.conv", ch[level], ch[level])
    t.norm("norm_out", ch[0])
    t.conv("conv_out", ch[0], shape.out_channels)
    return t


def read_part(ckpt: Checkpoint, part: str, expected_shapes: dict, layout: Layout) -> dict[str, torch.Tensor]:
    """The tensors under `part` ('decoder.') as f32, named without it, shapes checked; attention 1x1 -> [C, C]."""
    extra = sorted(k for k in ckpt.keys() if k.startswith(part) and k[len(part):] not in expected_shapes)  # noqa: SIM118
    if extra:  # e.g. attention inside the up levels (LDM attn_resolutions), which the FLUX VAEs have not
        raise layout.error(ckpt, f"unexpected {part[:-1].rsplit('.', 1)[-1]} tensors "
                           f"{extra[:3]}{' ...' if len(extra) > 3 else ''}")
    weights = {}
    for name, expected in expected_shapes.items():
        if part + name not in ckpt:
            raise layout.error(ckpt, f"tensor '{part}{name}' is missing")
        t = read_tensor(ckpt, part + name, expected)
        weights[name] = t.flatten(1) if ".attn_1." in name and t.dim() == 4 else t
    return weights
