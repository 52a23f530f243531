"""Higgs audio v2 tokenizer (OmniVoice's codec) in f32 on the host: codes [B, 8, T] -> 24 kHz waveforms (RVQ sum,
fc2, DAC decoder without its tanh) and waveforms -> codes (DAC acoustic encoder beside a HuBERT semantic branch at
16 kHz, fc, residual VQ); and the windowed-sinc resampler the semantic branch and reference audio go through.

Facts: reference/families/omnivoice.md section 6; transformers 5.24 modeling_higgs_audio_v2_tokenizer.py
(HiggsAudioV2TokenizerModel), modeling_dac.py (encoder/decoder blocks), modeling_hubert.py (HubertModel, post-norm
layers, `hidden_states` = the first layer's input then every layer's output); torchaudio 2.11
functional.resample (the Hann-windowed sinc both the codec and the package call).
File layout: the model folder's `audio_tokenizer/` (save_pretrained: config.json + model.safetensors) with
transformers' names: `quantizer.quantizers.N.{codebook.embed, project_in, project_out}`, `fc`, `fc2`,
`acoustic_decoder.{conv1, block.N.{snake1, conv_t1, res_unitK.*}, snake1, conv2}`, `acoustic_encoder.*`,
`encoder_semantic.*`, `semantic_model.*` (HuBERT). transformers' converter stores the DAC convs folded; weight norm
(`weight_g/weight_v` or `parametrizations.weight.original0/1`, HuBERT's positional conv) is folded at load."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, WeightsError, read_tensor
from .bigvgan import conv
from .h3_audio_vae import _snake as snake  # DAC's Snake: x + sin(alpha x)^2 / alpha, alpha [1, C, 1]

FOLDER = "audio_tokenizer"  # inside an OmniVoice model folder
WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"
DAC_DILATIONS = (1, 3, 9)  # the three residual units of every DAC stage (not in the file)
SEMANTIC_PAD = 160  # samples of 16 kHz audio added on each side before HuBERT (transformers' encode)
EXPECTED = (f"the Higgs audio v2 tokenizer folder of an OmniVoice model ({FOLDER}/: {CONFIG_FILE} and "
            f"{WEIGHTS_FILE} with transformers' HiggsAudioV2TokenizerModel names)")


def resample(wave: torch.Tensor, orig: int, new: int, zero_crossings: int = 6, rolloff: float = 0.99) -> torch.Tensor:
    """[..., S] at orig Hz -> [..., ceil(S new / orig)] at new Hz: band-limited interpolation by a Hann-windowed
    sinc cut at rolloff x the lower Nyquist, zero_crossings of it each side (torchaudio.functional.resample's
    sinc_interp_hann with its defaults, evaluated in the wave's dtype as it does). Each of the new / g output
    phases (g = gcd) is a conv with its own taps and stride orig / g."""
    if orig == new:
        return wave
    g = math.gcd(int(orig), int(new))
    orig, new = int(orig) // g, int(new) // g
    cutoff = min(orig, new) * rolloff
    half = math.ceil(zero_crossings * orig / cutoff)
    taps = torch.arange(-half, half + orig, dtype=wave.dtype, device=wave.device)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=wave.dtype, device=wave.device)[:, None, None] / new + taps) * cutoff
    t = t.clamp(-zero_crossings, zero_crossings)
    window = torch.cos(t * math.pi / zero_crossings / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.ones_like(t), t.sin() / t) * (window * (cutoff / orig))
    shape, length = wave.shape, wave.shape[-1]
    x = F.pad(wave.reshape(-1, 1, length), (half, half + orig))
    out = F.conv1d(x, kernels, stride=orig).transpose(1, 2).reshape(x.shape[0], -1)
    return out[:, : math.ceil(new * length / orig)].reshape(*shape[:-1], -1)


@dataclass(frozen=True)
class HiggsConfig:
    """What the file's shapes do not say (config.json; defaults as transformers' HiggsAudioV2TokenizerConfig)."""
    sample_rate: int = 24000
    semantic_sample_rate: int = 16000
    downsample_factor: int = 320         # HuBERT's hop at 16 kHz
    block_dilations: tuple[int, ...] = (1, 1)   # the semantic encoder's residual units
    semantic_strides: tuple[int, ...] = (1, 1)
    hubert_heads: int = 12
    hubert_strides: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    hubert_eps: float = 1e-5

    @classmethod
    def from_json(cls, cfg: dict, error: Callable[[str], WeightsError]) -> HiggsConfig:
        hub = cfg.get("semantic_model_config") or {}
        # The real tokenizer's HuBERT is the base model; the other HuBERT variants are refused, not guessed.
        for key, want in (("feat_extract_norm", "group"), ("do_stable_layer_norm", False),
                          ("conv_pos_batch_norm", False), ("hidden_act", "gelu"),
                          ("feat_extract_activation", "gelu"), ("feat_proj_layer_norm", True)):
            if hub.get(key, want) != want:
                raise error(f"its HuBERT has {key}={hub[key]!r}; only {want!r} (HuBERT base) is supported")
        d = cls()
        return cls(cfg.get("sample_rate", d.sample_rate), cfg.get("semantic_sample_rate", d.semantic_sample_rate),
                   cfg.get("downsample_factor", d.downsample_factor),
                   tuple(cfg.get("block_dilations", d.block_dilations)),
                   tuple(cfg.get("strides", d.semantic_strides)), hub.get("num_attention_heads", d.hubert_heads),
                   tuple(hub.get("conv_stride", d.hubert_strides)), hub.get("layer_norm_eps", d.hubert_eps))


class HiggsAudioCodec:
    """The codec's weights (f32, transformers' names, weight norm folded), its sizes, decode and encode."""

    def __init__(self, cfg: HiggsConfig, weights: dict[str, torch.Tensor], name: str = FOLDER):
        self.cfg, self.w, self.name = cfg, weights, name
        self.decoder_strides = _strides(weights, "acoustic_decoder.block.{}.conv_t1.weight")
        self.encoder_strides = _strides(weights, "acoustic_encoder.block.{}.conv1.weight")
        self.codebooks = _count(weights, "quantizer.quantizers.{}.codebook.embed")
        self.hubert_layers = _count(weights, "semantic_model.encoder.layers.{}.layer_norm.weight")

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: bool = True) -> HiggsAudioCodec:
        """The codec from an OmniVoice model folder, its audio_tokenizer/ folder, or that folder's safetensors file
        (config.json beside it). encoder=False reads only what decode needs (23 M of the released 201 M values)."""
        path = Path(path)
        if path.is_dir() and (path / FOLDER).is_dir():
            path = path / FOLDER
        file = path / WEIGHTS_FILE if path.is_dir() else path
        if not file.is_file():
            raise WeightsError(f"{path}: no {WEIGHTS_FILE}; expected {EXPECTED}")
        cfg_file = file.parent / CONFIG_FILE
        return cls.from_checkpoint(Checkpoint(file), json.loads(cfg_file.read_text()) if cfg_file.is_file() else {},
                                   encoder)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, config: dict, encoder: bool = True) -> HiggsAudioCodec:
        """The codec from its tensors and its config.json's contents (transformers' defaults for what is missing);
        every tensor the forwards read is checked here."""
        name = f"{ckpt.path.parent.name}/{ckpt.path.name}"

        def error(why: str) -> WeightsError:
            return WeightsError(f"{name}: {why}; expected {EXPECTED}")

        cfg = HiggsConfig.from_json(config, error)
        parts = ("quantizer.", "fc2.", "acoustic_decoder.")
        if encoder:
            parts += ("fc.", "acoustic_encoder.", "encoder_semantic.", "semantic_model.")
        if "quantizer.quantizers.0.codebook.embed" not in ckpt or "acoustic_decoder.conv1.weight" not in ckpt:
            raise error("no 'quantizer.quantizers.0.codebook.embed' or 'acoustic_decoder.conv1.weight'")
        w = _read_parts(ckpt, parts)
        if encoder and "semantic_model.encoder.pos_conv_embed.conv.weight" not in w:
            raise error("no HuBERT 'semantic_model.*' to encode with (load with encoder=False to decode only)")
        codec = cls(cfg, w, name)
        codec._check_shapes(encoder, error)
        return codec

    @property
    def hop(self) -> int:
        return math.prod(self.decoder_strides)

    @property
    def frame_rate(self) -> int:
        return math.ceil(self.cfg.sample_rate / self.hop)

    @property
    def can_encode(self) -> bool:
        return "fc.weight" in self.w

    def to(self, device: str | torch.device) -> HiggsAudioCodec:
        """The codec on device, in f32 (the package runs it in f32)."""
        return type(self)(self.cfg, {k: v.to(device, torch.float32) for k, v in self.w.items()}, self.name)

    # --- decode ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Codes [B, Q, T] (or [Q, T]) -> waveforms [B, 1, T x hop] at sample_rate, not clipped (the tanh is
        removed). check() after each upsampling stage."""
        w = self.w
        if codes.dim() == 2:
            codes = codes[None]
        if codes.dim() != 3 or codes.shape[1] != self.codebooks:
            raise ValueError(f"decode: expected codes [B, {self.codebooks}, T] or [{self.codebooks}, T], got "
                             f"{tuple(codes.shape)}")
        codes = codes.to(w["fc2.weight"].device, torch.long)
        x = 0.0
        for q in range(self.codebooks):  # sum of each codebook's vector, projected out, in codebook order
            p = f"quantizer.quantizers.{q}."
            x = x + F.linear(F.embedding(codes[:, q], w[p + "codebook.embed"]), w[p + "project_out.weight"],
                             w[p + "project_out.bias"])
        x = F.linear(x, w["fc2.weight"], w["fc2.bias"]).transpose(1, 2)
        x = conv(x, w, "acoustic_decoder.conv1")
        for i, stride in enumerate(self.decoder_strides):
            b = f"acoustic_decoder.block.{i}."
            # Higgs sets output_padding = stride % 2, so every stage multiplies the length by its stride exactly.
            x = F.conv_transpose1d(snake(x, w[b + "snake1.alpha"]), w[b + "conv_t1.weight"], w[b + "conv_t1.bias"],
                                   stride=stride, padding=math.ceil(stride / 2), output_padding=stride % 2)
            x = _dac_units(x, w, b)
            if check is not None:
                check()
        return conv(snake(x, w["acoustic_decoder.snake1.alpha"]), w, "acoustic_decoder.conv2")

    # --- encode ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, wave: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Mono waveforms [B, 1, S] at sample_rate -> codes [B, Q, T] (T = S / hop for whole hops, as the package
        cuts them): the acoustic and semantic features side by side, fc, then residual VQ over all codebooks."""
        if not self.can_encode:
            raise ValueError(f"{self.name}: loaded for decoding only; load with encoder=True to encode")
        if wave.dim() != 3 or wave.shape[1] != 1:
            raise ValueError(f"encode: expected mono waveforms [B, 1, samples], got {tuple(wave.shape)}")
        w = self.w
        wave = wave.to(w["fc.weight"].device, torch.float32)
        semantic = self._semantic(wave)
        if check is not None:
            check()
        # transformers pads the acoustic input by half a hop each side when the lengths would differ.
        if self._acoustic_length(wave.shape[-1]) != semantic.shape[-1]:
            wave = F.pad(wave, (self.hop // 2, self.hop // 2))
        x = torch.cat([self._acoustic(wave), semantic], dim=1)
        x = F.linear(x.transpose(1, 2), w["fc.weight"], w["fc.bias"]).transpose(1, 2)
        return self._quantize(x)

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        """[B, D, T] -> codes [B, Q, T]: each codebook takes the nearest (Euclidean) code of what the previous ones
        left, with transformers' distance expression (its argmax on near-ties)."""
        w, codes = self.w, []
        residual = x
        for q in range(self.codebooks):
            p = f"quantizer.quantizers.{q}."
            h = F.linear(residual.transpose(1, 2), w[p + "project_in.weight"], w[p + "project_in.bias"])
            flat, embed = h.reshape(-1, h.shape[-1]), w[p + "codebook.embed"].t()
            dist = -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ embed + embed.pow(2).sum(0, keepdim=True))
            idx = dist.max(dim=-1).indices.view(h.shape[:-1])
            quantized = F.linear(F.embedding(idx, w[p + "codebook.embed"]), w[p + "project_out.weight"],
                                 w[p + "project_out.bias"])
            residual = residual - quantized.transpose(1, 2)
            codes.append(idx)
        return torch.stack(codes, dim=1)

    def _acoustic_length(self, samples: int) -> int:
        for s in self.encoder_strides:  # conv of kernel 2s, stride s, padding ceil(s/2); the others keep length
            samples = (samples + 2 * math.ceil(s / 2) - 2 * s) // s + 1
        return samples

    def _acoustic(self, x: torch.Tensor) -> torch.Tensor:
        """DAC encoder: conv, stages of three residual units and a strided conv, Snake, conv."""
        w = self.w
        x = conv(x, w, "acoustic_encoder.conv1")
        for i, stride in enumerate(self.encoder_strides):
            b = f"acoustic_encoder.block.{i}."
            x = snake(_dac_units(x, w, b), w[b + "snake1.alpha"])
            x = F.conv1d(x, w[b + "conv1.weight"], w[b + "conv1.bias"], stride=stride, padding=math.ceil(stride / 2))
        return conv(snake(x, w["acoustic_encoder.snake1.alpha"]), w, "acoustic_encoder.conv2")

    def _semantic(self, wave: torch.Tensor) -> torch.Tensor:
        """[B, 1, S] -> [B, semantic width, frames]: 16 kHz, padded, HuBERT's hidden states averaged over its
        input and every layer, every n-th frame kept, then the semantic encoder (residual ELU convs)."""
        c, w = self.cfg, self.w
        x = resample(wave, c.sample_rate, c.semantic_sample_rate)[:, 0]
        h = self._hubert(F.pad(x, (SEMANTIC_PAD, SEMANTIC_PAD)))
        step = int(self.hop / (c.sample_rate / c.semantic_sample_rate) / c.downsample_factor)
        x = h[:, :: max(step, 1)].transpose(1, 2)
        x = conv(x, w, "encoder_semantic.conv")
        for i, stride in enumerate(c.semantic_strides):
            b = f"encoder_semantic.conv_blocks.{i}."
            for j, dilation in enumerate(c.block_dilations):
                r = f"{b}res_units.{j}."
                y = conv(F.elu(x), w, r + "conv1", dilation)
                x = x + conv(F.elu(y), w, r + "conv2")
            weight = w[b + "conv.weight"]
            x = F.conv1d(x, weight, w[b + "conv.bias"], stride=stride, padding=(weight.shape[-1] - 1) // 2)
        return x

    def _hubert(self, x: torch.Tensor) -> torch.Tensor:
        """HuBERT base on [B, samples] at 16 kHz -> the mean of its hidden states [B, frames, width]."""
        c, w = self.cfg, self.w
        p = "semantic_model."
        h = x[:, None]
        for i, stride in enumerate(c.hubert_strides):  # conv features; the first one group-normed per channel
            f = f"{p}feature_extractor.conv_layers.{i}."
            h = F.conv1d(h, w[f + "conv.weight"], w.get(f + "conv.bias"), stride=stride)
            if i == 0:
                h = F.group_norm(h, h.shape[1], w[f + "layer_norm.weight"], w[f + "layer_norm.bias"])
            h = F.gelu(h)
        h = _layer_norm(h.transpose(1, 2), w, p + "feature_projection.layer_norm", c.hubert_eps)
        h = F.linear(h, w[p + "feature_projection.projection.weight"], w[p + "feature_projection.projection.bias"])
        e = p + "encoder."
        pos = w[e + "pos_conv_embed.conv.weight"]
        k = pos.shape[-1]
        groups = h.shape[-1] // pos.shape[1]
        position = F.conv1d(h.transpose(1, 2), pos, w[e + "pos_conv_embed.conv.bias"], padding=k // 2, groups=groups)
        position = F.gelu(position[..., : h.shape[1]] if k % 2 == 0 else position).transpose(1, 2)
        h = _layer_norm(h + position, w, e + "layer_norm", c.hubert_eps)
        states = [h]
        heads = c.hubert_heads
        for i in range(self.hubert_layers):  # post-norm layers (HuBERT base)
            b = f"{e}layers.{i}."
            a = b + "attention."
            n, t, d = h.shape
            q, kk, v = (F.linear(h, w[f"{a}{s}_proj.weight"], w[f"{a}{s}_proj.bias"]).view(n, t, heads, -1)
                        .transpose(1, 2) for s in "qkv")
            o = F.scaled_dot_product_attention(q, kk, v).transpose(1, 2).reshape(n, t, d)
            h = _layer_norm(h + F.linear(o, w[a + "out_proj.weight"], w[a + "out_proj.bias"]), w, b + "layer_norm",
                            c.hubert_eps)
            m = F.gelu(F.linear(h, w[b + "feed_forward.intermediate_dense.weight"],
                                w[b + "feed_forward.intermediate_dense.bias"]))
            m = F.linear(m, w[b + "feed_forward.output_dense.weight"], w[b + "feed_forward.output_dense.bias"])
            h = _layer_norm(h + m, w, b + "final_layer_norm", c.hubert_eps)
            states.append(h)
        return torch.stack(states, dim=1).mean(dim=1)

    def _check_shapes(self, encoder: bool, error: Callable[[str], WeightsError]) -> None:
        """Every tensor the forwards read is there with a shape that chains: decode (and encode) two frames of
        meta tensors, so a wrong or partial file fails here, at load, rather than mid-graph."""
        meta = type(self)(self.cfg, {k: v.to("meta") for k, v in self.w.items()}, self.name)
        try:
            meta.decode(torch.zeros(1, self.codebooks, 2, dtype=torch.long, device="meta"))
            if encoder:
                meta.encode(torch.zeros(1, 1, 2 * self.hop, device="meta"))
        except (KeyError, RuntimeError, ValueError) as e:
            raise error(f"a tensor is missing or of another size ({type(e).__name__}: {e})") from e


def _dac_units(x: torch.Tensor, w: dict, b: str) -> torch.Tensor:
    """A DAC stage's three residual units (Snake, dilated conv 7, Snake, conv 1, added): lengths kept."""
    for u, dilation in enumerate(DAC_DILATIONS, 1):
        r = f"{b}res_unit{u}."
        y = conv(snake(x, w[r + "snake1.alpha"]), w, r + "conv1", dilation)
        x = x + conv(snake(y, w[r + "snake2.alpha"]), w, r + "conv2")
    return x


def _layer_norm(x: torch.Tensor, w: dict, name: str, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], eps)


def _strides(w: dict, pattern: str) -> tuple[int, ...]:
    """Stage strides from their strided convs' kernels (2 x stride, DAC)."""
    return tuple(w[pattern.format(i)].shape[-1] // 2 for i in range(_count(w, pattern)))


def _count(w: dict, pattern: str) -> int:
    n = 0
    while pattern.format(n) in w:
        n += 1
    return n


# Weight norm as stored: (magnitude, direction) suffix pairs -> the folded '.weight'.
WEIGHT_NORM = ((".weight_g", ".weight_v"),
               (".parametrizations.weight.original0", ".parametrizations.weight.original1"))


def _read_parts(ckpt: Checkpoint, parts: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every tensor under parts as f32, weight-normed pairs folded into '.weight' (the norm over the axes where
    the magnitude has size 1: dim 0 for the DAC's convs, dim 2 for HuBERT's positional conv), as torch's weight
    norm computes it: v * (g / |v|)."""
    w = {}
    for key in ckpt.keys():  # noqa: SIM118 (a Checkpoint, not a dict)
        if not key.startswith(parts) or key == "semantic_model.masked_spec_embed":
            continue  # masked_spec_embed: training only (transformers ignores it at load too)
        for g_suffix, v_suffix in WEIGHT_NORM:
            if key.endswith(v_suffix):
                break
            if key.endswith(g_suffix):
                stem = key[: -len(g_suffix)]
                g, v = read_tensor(ckpt, key), read_tensor(ckpt, stem + v_suffix)
                axes = [i for i, n in enumerate(g.shape) if n == 1]
                w[stem + ".weight"] = v * (g / v.norm(dim=axes, keepdim=True))
                break
        else:
            w[key] = read_tensor(ckpt, key)
    return w
