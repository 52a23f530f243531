"""BigVGAN vocoders (MiniMax H3's audio decoder; LTX-2.5's vocoder is the same network): the layers as functions of a
weight table, the network's sizes, and reading its tensors with weight norm folded.

Math as diffusers 0.42.1 autoencoder_kl_minimax_h3_audio.py (MiniMaxH3AudioBigVGANDecoder), itself BigVGAN's
AMPBlock1 with alias-free-torch's Activation1d: upsample x2 (Kaiser-sinc), SnakeBeta, low-pass and downsample x2."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor

# Activation1d as BigVGAN builds it (ratio 2, 12 taps); neither number is in the file (the filter buffers may be).
RATIO = 2
TAPS = 12


# --- the anti-aliased activation -------------------------------------------------------------------------

def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """Kaiser-windowed sinc low-pass [1, 1, k], summing to 1. Same arithmetic, in the same order, as
    alias-free-torch (and diffusers' kaiser_sinc_filter1d): the checkpoint was trained with exactly this tensor."""
    half = kernel_size // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5 if kernel_size % 2 == 0 else torch.arange(kernel_size) - half
    filt = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    filt /= filt.sum()
    return filt.view(1, 1, kernel_size)


def activation_filter(ratio: int = RATIO, taps: int = TAPS) -> torch.Tensor:
    """The one filter both halves of Activation1d use (up- and downsampler share cutoff and width)."""
    return kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, taps)


def upsample(x: torch.Tensor, filt: torch.Tensor, ratio: int = RATIO) -> torch.Tensor:
    """x ratio: replicate-pad, depthwise transposed conv with the filter (times ratio: the zeros inserted), crop."""
    k, c = filt.shape[-1], x.shape[1]
    pad = k // ratio - 1
    left = pad * ratio + (k - ratio) // 2
    right = pad * ratio + (k - ratio + 1) // 2
    x = F.pad(x, (pad, pad), mode="replicate")
    x = ratio * F.conv_transpose1d(x, filt.expand(c, -1, -1), stride=ratio, groups=c)
    return x[..., left:-right]


def downsample(x: torch.Tensor, filt: torch.Tensor, ratio: int = RATIO) -> torch.Tensor:
    """/ ratio: replicate-pad (one less on the left for an even filter), depthwise strided low-pass."""
    k, c = filt.shape[-1], x.shape[1]
    x = F.pad(x, (k // 2 - int(k % 2 == 0), k // 2), mode="replicate")
    return F.conv1d(x, filt.expand(c, -1, -1), stride=ratio, groups=c)


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """x + sin(e^alpha x)^2 / e^beta, per channel; alpha and beta stored in log space as [C]."""
    a, b = torch.exp(alpha)[None, :, None], torch.exp(beta)[None, :, None]
    return x + (b + 1e-9).reciprocal() * torch.sin(a * x).pow(2)


def activation(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    """Activation1d(SnakeBeta): upsample, SnakeBeta at the doubled rate (less aliasing), low-pass back down."""
    x = upsample(x, w[f"{name}.upsample.filter"])
    x = snake_beta(x, w[f"{name}.act.alpha"], w[f"{name}.act.beta"])
    return downsample(x, w[f"{name}.downsample.lowpass.filter"])


# --- the network -----------------------------------------------------------------------------------------

def conv(x: torch.Tensor, w: dict, name: str, dilation: int = 1) -> torch.Tensor:
    """Same-length 1-D conv (odd kernels), bias when the file has one (conv_post has none)."""
    weight = w[f"{name}.weight"]
    k = weight.shape[-1]
    return F.conv1d(x, weight, w.get(f"{name}.bias"), dilation=dilation, padding=(k * dilation - dilation) // 2)


def amp_block(x: torch.Tensor, w: dict, name: str, dilations: tuple[int, ...]) -> torch.Tensor:
    """AMPBlock1: per dilation, act -> dilated conv -> act -> conv, added to the running x."""
    for i, d in enumerate(dilations):
        r = conv(activation(x, w, f"{name}.activations.{2 * i}"), w, f"{name}.convs1.{i}", d)
        x = x + conv(activation(r, w, f"{name}.activations.{2 * i + 1}"), w, f"{name}.convs2.{i}")
    return x


@dataclass(frozen=True)
class BigVGANShape:
    """Sizes: channels from the file; rates and dilations are not in it (the family supplies them)."""
    in_channels: int
    channels: tuple[int, ...]  # conv_pre's output, then after each upsampler
    rates: tuple[int, ...]
    kernels: tuple[int, ...]  # of the transposed convs
    resblock_kernels: tuple[int, ...]
    dilations: tuple[tuple[int, ...], ...]  # per resblock kernel
    out_channels: int = 1  # conv_post's: 1 (H3), 2 (LTX's stereo vocoder)

    @property
    def hop(self) -> int:
        return math.prod(self.rates)


def forward(x: torch.Tensor, w: dict, shape: BigVGANShape, check: Callable[[], None] | None = None,
            clamp: bool = True) -> torch.Tensor:
    """[N, in_channels, T] -> waveform [N, out channels, T * hop], clamped to [-1, 1] unless clamp is False (LTX's
    bandwidth extender, whose output is a residual); check() after each upsampling stage."""
    x = conv(x, w, "conv_pre")
    n = len(shape.resblock_kernels)
    for i, rate in enumerate(shape.rates):
        weight = w[f"ups.{i}.0.weight"]
        x = F.conv_transpose1d(x, weight, w[f"ups.{i}.0.bias"], stride=rate, padding=(weight.shape[-1] - rate) // 2)
        # The resblocks of a stage run in parallel on the same input and are averaged (multi-receptive-field fusion).
        acc = None
        for j, dil in enumerate(shape.dilations):
            y = amp_block(x, w, f"resblocks.{i * n + j}", dil)
            acc = y if acc is None else acc + y
        x = acc / n
        if check is not None:
            check()
    x = conv(activation(x, w, "activation_post"), w, "conv_post")
    return torch.clamp(x, -1.0, 1.0) if clamp else x


# --- reading ---------------------------------------------------------------------------------------------

def conv_shape(ckpt: Checkpoint, name: str) -> tuple[int, ...] | None:
    """A conv's weight shape whether stored folded (`.weight`) or weight-normed (`.weight_v`), else None."""
    for suffix in (".weight", ".weight_v"):
        if name + suffix in ckpt:
            return ckpt.shape(name + suffix)
    return None


def read_conv(ckpt: Checkpoint, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The conv weight in f32; weight norm (torch.nn.utils.weight_norm, dim 0: the norm over all but the first
    axis) folded once here, as diffusers' pre-forward hook computes it on every call."""
    if name + ".weight" in ckpt:
        return read_tensor(ckpt, name + ".weight", shape)
    v = read_tensor(ckpt, name + ".weight_v", shape)
    g = read_tensor(ckpt, name + ".weight_g", (shape[0],) + (1,) * (len(shape) - 1))
    return v * (g / v.flatten(1).norm(dim=1).view_as(g))


def expected(shape: BigVGANShape) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward reads (folded names), with its shape; filters listed separately (optional)."""
    t, ch = {}, shape.channels

    def conv_(name, cin, cout, k, bias=True):
        t[f"{name}.weight"] = (cout, cin, k)
        if bias:
            t[f"{name}.bias"] = (cout,)

    def act(name, c):
        t[f"{name}.act.alpha"], t[f"{name}.act.beta"] = (c,), (c,)

    conv_("conv_pre", shape.in_channels, ch[0], 7)
    for i, k in enumerate(shape.kernels):
        t[f"ups.{i}.0.weight"], t[f"ups.{i}.0.bias"] = (ch[i], ch[i + 1], k), (ch[i + 1],)  # transposed: [in, out]
        for j, (rk, dil) in enumerate(zip(shape.resblock_kernels, shape.dilations)):
            name = f"resblocks.{i * len(shape.resblock_kernels) + j}"
            for d in range(len(dil)):
                conv_(f"{name}.convs1.{d}", ch[i + 1], ch[i + 1], rk)
                conv_(f"{name}.convs2.{d}", ch[i + 1], ch[i + 1], rk)
                act(f"{name}.activations.{2 * d}", ch[i + 1])
                act(f"{name}.activations.{2 * d + 1}", ch[i + 1])
    act("activation_post", ch[-1])
    conv_("conv_post", ch[-1], shape.out_channels, 7, bias=False)
    return t


def read_shape(ckpt: Checkpoint, part: str, rates: tuple[int, ...], dilations: tuple[tuple[int, ...], ...],
               error: Callable[[str], WeightsError]) -> BigVGANShape:
    """Channels, kernels and the resblock layout from the tensor shapes under `part` ('decoder.'); rates and
    dilations (not in the file) checked against the stage and conv counts the file has."""
    pre = conv_shape(ckpt, part + "conv_pre")
    if pre is None:
        raise error(f"no '{part}conv_pre.weight' (or weight_v) tensor")
    stages = 0
    while conv_shape(ckpt, f"{part}ups.{stages}.0") is not None:
        stages += 1
    if stages != len(rates):
        raise error(f"{stages} upsampling stages ({part}ups.N.0) but {len(rates)} rates {rates}")
    ups = [conv_shape(ckpt, f"{part}ups.{i}.0") for i in range(stages)]
    channels = (pre[0], *(u[1] for u in ups))
    if any(u[0] != c for u, c in zip(ups, channels)) or any(u[-1] < r for u, r in zip(ups, rates)):
        raise error(f"upsampler shapes {ups} do not chain from {pre[0]} channels with rates {rates}")
    blocks = 0
    while conv_shape(ckpt, f"{part}resblocks.{blocks}.convs1.0") is not None:
        blocks += 1
    if stages == 0 or blocks % stages or blocks // stages != len(dilations):
        raise error(f"{blocks} resblocks over {stages} stages; expected {len(dilations)} per stage")
    kernels = tuple(conv_shape(ckpt, f"{part}resblocks.{j}.convs1.0")[-1] for j in range(len(dilations)))
    for j, dil in enumerate(dilations):
        if conv_shape(ckpt, f"{part}resblocks.{j}.convs1.{len(dil) - 1}") is None or \
                conv_shape(ckpt, f"{part}resblocks.{j}.convs1.{len(dil)}") is not None:
            raise error(f"resblock {j} does not hold {len(dil)} dilated convs (dilations {dil})")
    post = conv_shape(ckpt, part + "conv_post")
    return BigVGANShape(pre[1], channels, tuple(rates), tuple(u[-1] for u in ups), kernels,
                        tuple(tuple(d) for d in dilations), post[0] if post is not None else 1)


def read_weights(ckpt: Checkpoint, part: str, shape: BigVGANShape,
                 error: Callable[[str], WeightsError]) -> dict[str, torch.Tensor]:
    """The tensors under `part` as f32, named without it, weight norm folded, shapes checked. The activations'
    filters are persistent buffers: the file's win (as in ComfyUI and diffusers), else computed."""
    w = {}
    for name, s in expected(shape).items():
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        if stem is not None and conv_shape(ckpt, part + stem) is not None:
            w[name] = read_conv(ckpt, part + stem, s)
        elif part + name in ckpt:
            w[name] = read_tensor(ckpt, part + name, s)
        else:
            raise error(f"tensor '{part}{name}' is missing")
    filt = activation_filter()
    for name in [n[: -len(".act.alpha")] for n in w if n.endswith(".act.alpha")]:
        for key in (f"{name}.upsample.filter", f"{name}.downsample.lowpass.filter"):
            w[key] = read_tensor(ckpt, part + key, (1, 1, TAPS)) if part + key in ckpt else filt
    return w
