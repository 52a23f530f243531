"""LTX-2.5's vocoder with bandwidth extension (the `vocoder.*` of ltx-2.5-audio-vae) in f32: the audio VAE's stereo
log-mel [B, 2, T, 64] -> 48 kHz stereo waveforms (reference/families/ltx25.md section 8).

Math as diffusers 0.42.1 pipelines/ltx2/vocoder.py (LTX2VocoderWithBWE): a BigVGAN (codecs/bigvgan.py) to 16 kHz,
the causal log-mel of that (the file's STFT and mel bases), a second BigVGAN on it (the bandwidth extender, no
final clamp) added to the 16 kHz waveform resampled x3 (Hann-windowed sinc), clamped. Names as ComfyUI's
VocoderWithBWE holds them (`vocoder.vocoder.*`, `vocoder.bwe_generator.*` with `ups.N`, `resblocks.M.acts1.D` /
`acts2.D`, `act_post`; `vocoder.mel_stft.{mel_basis, stft_fn.forward_basis}`), renamed once at load to bigvgan's.
Rates, dilations and sample rates are not in the tensors: the file's metadata config (`vocoder` -> `vocoder` /
`bwe`, as ComfyUI reads it), else LTX-2.3/2.5's published values."""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, TensorSource, WeightsError, read_tensor
from . import bigvgan

# LTX-2.3/2.5's vocoder config (the checkpoints' embedded `vocoder` section; diffusers' LTX2VocoderWithBWE defaults).
STAGE_CONFIG = {"upsample_rates": [5, 2, 2, 2, 2, 2], "resblock_dilation_sizes": [[1, 3, 5]] * 3,
                "use_tanh_at_final": False}
BWE_CONFIG = {"upsample_rates": [6, 5, 2, 2, 2], "resblock_dilation_sizes": [[1, 3, 5]] * 3,
              "input_sampling_rate": 16000, "output_sampling_rate": 48000, "hop_length": 80}
# UpSample1d(window_type="hann"): torchaudio-style sinc, rolloff 0.99, 6 zero crossings a side.
ROLLOFF, ZERO_CROSSINGS = 0.99, 6
MEL_FLOOR = 1e-5
EXPECTED = ("an LTX-2.3/2.5 audio VAE file's vocoder (vocoder.vocoder.*, vocoder.bwe_generator.*, "
            "vocoder.mel_stft.mel_basis, vocoder.mel_stft.stft_fn.forward_basis)")


@dataclass(frozen=True)
class VocoderShape:
    stage: bigvgan.BigVGANShape  # mel -> input_rate waveform
    bwe: bigvgan.BigVGANShape  # mel of that -> the residual at output_rate
    stage_clamp: bool  # ComfyUI clamps the first stage (apply_final_activation); diffusers' default does not
    hop: int  # of the extender's mel
    input_rate: int
    output_rate: int

    @property
    def ratio(self) -> int:
        return self.output_rate // self.input_rate


class Vocoder:
    """Stereo log-mel [B, 2, T, mels] (the audio VAE's output) -> waveform [B, 2, T * hop * 3] at 48 kHz."""

    def __init__(self, shape: VocoderShape, weights: dict[str, torch.Tensor]):
        self.shape = shape
        self.w = weights  # 'stage.*' and 'bwe.*' in bigvgan's names; 'mel_basis', 'forward_basis'

    @classmethod
    def load(cls, source: str | os.PathLike | Checkpoint, prefix: str = "vocoder.",
             stage_clamp: bool | None = None) -> Vocoder:
        """The vocoder of `source`. stage_clamp None: as the file's config says (apply_final_activation, default
        on, as ComfyUI builds it); False gives diffusers' LTX2VocoderWithBWE default (final_act_fn None)."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)

        def error(why: str) -> WeightsError:
            return WeightsError(f"{ckpt.path.name}: {why}; expected {EXPECTED}")

        if f"{prefix}mel_stft.mel_basis" not in ckpt:
            raise error(f"no '{prefix}mel_stft.mel_basis' tensor")
        config = json.loads(ckpt.metadata.get("config", "{}")).get("vocoder") or {}
        stage_cfg = {**STAGE_CONFIG, **config.get("vocoder", {})}
        bwe_cfg = {**BWE_CONFIG, **config.get("bwe", {})}
        if stage_cfg["use_tanh_at_final"]:
            raise error("its config asks for a tanh after the first stage (LTX-2.0's vocoder), not LTX-2.3/2.5's")
        # The vocoder's tensors as stored, renamed once into bigvgan's names.
        renamed = TensorSource({_bigvgan_name(k[len(prefix):]): ckpt.get(k) for k in ckpt.keys()  # noqa: SIM118
                                if k.startswith(prefix)}, ckpt.path.name)
        parts = {}
        for part, cfg in (("stage", stage_cfg), ("bwe", bwe_cfg)):
            dilations = tuple(tuple(d) for d in cfg["resblock_dilation_sizes"])
            parts[part] = bigvgan.read_shape(renamed, f"{part}.", tuple(cfg["upsample_rates"]), dilations, error)
        w = {f"{part}.{k}": v for part, s in parts.items()
             for k, v in bigvgan.read_weights(renamed, f"{part}.", s, error).items()}
        w["mel_basis"] = read_tensor(renamed, "mel_stft.mel_basis")
        w["forward_basis"] = read_tensor(renamed, "mel_stft.stft_fn.forward_basis")
        clamp = stage_cfg.get("apply_final_activation", True) if stage_clamp is None else stage_clamp
        shape = VocoderShape(parts["stage"], parts["bwe"], clamp, bwe_cfg["hop_length"],
                             bwe_cfg["input_sampling_rate"], bwe_cfg["output_sampling_rate"])
        if shape.bwe.hop != shape.ratio * shape.hop:
            raise error(f"the extender upsamples x{shape.bwe.hop}, not x{shape.ratio} x hop {shape.hop}")
        return cls(shape, w)

    @property
    def sample_rate(self) -> int:
        return self.shape.output_rate

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> Vocoder:
        """Weights on device in dtype (keep f32: ComfyUI runs this vocoder in f32 whatever the weights are)."""
        return type(self)(self.shape, {k: v.to(device, dtype) for k, v in self.w.items()})

    @torch.no_grad()
    def forward(self, mel: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
        """Log-mel [B, C, T, mels] -> waveform [B, C, T * stage hop * ratio] in [-1, 1]."""
        s, w = self.shape, self.w
        stage = {k[6:]: v for k, v in w.items() if k.startswith("stage.")}
        bwe = {k[4:]: v for k, v in w.items() if k.startswith("bwe.")}
        x = mel.to(w["mel_basis"]).transpose(2, 3).flatten(1, 2)  # [B, C * mels, T]: channel-major
        x = bigvgan.forward(x, stage, s.stage, check, clamp=s.stage_clamp)
        samples = x.shape[-1]
        x = F.pad(x, (0, (-samples) % s.hop))
        residual = bigvgan.forward(self._log_mel(x), bwe, s.bwe, check, clamp=False)
        out = (residual + _resample(x, s.ratio)).clamp(-1.0, 1.0)
        return out[..., :samples * s.ratio]

    decode = forward

    def audio(self, mel: torch.Tensor, check: Callable[[], None] | None = None) -> dict:
        """Stereo log-mel [B, 2, T, mels] -> ComfyUI AUDIO {"waveform": [B, 2, S] f32 on the CPU, "sample_rate"}."""
        return {"waveform": self.forward(mel, check).float().cpu(), "sample_rate": self.sample_rate}

    def _log_mel(self, x: torch.Tensor) -> torch.Tensor:
        """Causal log-mel of each channel [B, C, S] -> [B, C * mels, S / hop]: left-padded by n_fft - hop, the
        STFT as a strided conv with the file's windowed DFT bases (real rows, then imaginary), magnitude, mel
        basis, log of at least 1e-5."""
        b, c, _ = x.shape
        basis = self.w["forward_basis"]
        y = F.pad(x.reshape(b * c, 1, -1), (basis.shape[-1] - self.shape.hop, 0))
        spec = F.conv1d(y, basis, stride=self.shape.hop)
        real, imag = spec.chunk(2, dim=1)
        mel = torch.matmul(self.w["mel_basis"], torch.sqrt(real ** 2 + imag ** 2))
        return torch.log(mel.clamp_min(MEL_FLOOR)).reshape(b, -1, mel.shape[-1])


def _bigvgan_name(name: str) -> str:
    """ComfyUI's VocoderWithBWE names -> bigvgan.py's: the stage as 'stage.', the extender as 'bwe.', the
    transposed convs `ups.N` as `ups.N.0`, `acts1.D` / `acts2.D` as `activations.2D` / `.2D+1`, `act_post` as
    `activation_post`."""
    name = re.sub(r"^vocoder\.", "stage.", name)
    name = re.sub(r"^bwe_generator\.", "bwe.", name)
    name = re.sub(r"\.ups\.(\d+)\.", r".ups.\1.0.", name)
    name = re.sub(r"\.acts([12])\.(\d+)\.", lambda m: f".activations.{2 * int(m[2]) + int(m[1]) - 1}.", name)
    return name.replace(".act_post.", ".activation_post.")


def _resample(x: torch.Tensor, ratio: int) -> torch.Tensor:
    """x ratio by a Hann-windowed sinc (diffusers' / ComfyUI's UpSample1d(window_type="hann")): replicate-pad
    `width` samples a side, depthwise transposed conv, crop."""
    width = math.ceil(ZERO_CROSSINGS / ROLLOFF)
    k = 2 * width * ratio + 1
    t = (torch.arange(k, dtype=torch.float32) / ratio - width) * ROLLOFF
    window = torch.cos(t.clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS) * math.pi / ZERO_CROSSINGS / 2) ** 2
    filt = (torch.sinc(t) * window * ROLLOFF / ratio).to(x).view(1, 1, -1)
    c = x.shape[1]
    y = ratio * F.conv_transpose1d(F.pad(x, (width, width), mode="replicate"), filt.expand(c, -1, -1),
                                   stride=ratio, groups=c)
    return y[..., 2 * width * ratio:-(k - ratio)]
