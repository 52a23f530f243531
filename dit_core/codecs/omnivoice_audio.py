"""OmniVoice's audio around the codec, as the omnivoice 0.2.1 package does it (omnivoice/utils/audio.py and
OmniVoice.create_voice_clone_prompt / _post_process_audio): the reference prepared for encoding, and the decoded
speech trimmed of silence, matched in loudness to the reference, faded and padded, long-text chunks joined.

The package finds silence with pydub on 16-bit PCM: the wave is rounded toward zero to int16 (and comes back
quantized), windows are whole milliseconds (ms x rate / 1000 frames, truncated), a window is silent when its
integer RMS (audioop's: the square root of the mean square, truncated) is at most -50 dBFS, and cutting
`segment[a:]` keeps round(1000 x frames / rate) ms, so an end can gain or lose a fraction of a millisecond.
Each step below keeps those rules so the result equals the package's sample for sample. Mono only (the
package takes the mean of the channels before any of this)."""
from __future__ import annotations

import itertools
import math

import torch

from .higgs_audio import resample

SILENCE_DB = -50.0   # pydub's silence threshold the package uses everywhere (dBFS)
SEEK_MS = 10         # step of the silence search, and the chunk of the edge search
FULL_SCALE = 32768   # 16-bit PCM


# --- pydub's silence rules on int16 samples ------------------------------------------------------------

def to_pcm16(wave: torch.Tensor) -> torch.Tensor:
    """[S] float -> int16 as the package converts: x 32768, clipped, truncated toward zero."""
    return (wave.float() * 32768.0).clamp(-32768, 32767).to(torch.int16)


def from_pcm16(pcm: torch.Tensor) -> torch.Tensor:
    return pcm.float() / 32768.0


def _ms_length(pcm: torch.Tensor, rate: int) -> int:
    return round(1000 * (pcm.numel() / rate))


def _cut(pcm: torch.Tensor, rate: int, start_ms: int, end_ms: int | None = None) -> torch.Tensor:
    """pydub's segment[start:end] in ms: both ends clipped to the length in ms, frames truncated, frames past the
    data filled with zeros (at most a fraction of a millisecond)."""
    length = _ms_length(pcm, rate)
    end_ms = length if end_ms is None else min(end_ms, length)
    a, b = int(min(start_ms, length) * (rate / 1000.0)), int(end_ms * (rate / 1000.0))
    part = pcm[a:b]
    missing = (b - a) - part.numel()
    return torch.cat([part, pcm.new_zeros(missing)]) if missing > 0 else part


def _window_rms(pcm: torch.Tensor, rate: int, starts_ms: list[int], width_ms: int, length_ms: int) -> list[int]:
    """audioop.rms of pydub's window [s, min(s + width, length)] ms for each start: exact integer sums of squares
    (int64), the square root of their mean truncated; every window at once (the frame bounds and the mean in f64,
    as Python's floats give them)."""
    squares = torch.cat([pcm.new_zeros(1, dtype=torch.int64), pcm.long().pow(2).cumsum(0)])
    n = pcm.numel()
    starts = torch.tensor(starts_ms, dtype=torch.float64)
    a = (starts.clamp(max=length_ms) * (rate / 1000.0)).long()
    b = ((starts + width_ms).clamp(max=length_ms) * (rate / 1000.0)).long()
    total = squares[b.clamp(max=n)] - squares[a.clamp(max=n)]  # frames past the data are zeros
    rms = torch.sqrt(total.double() / (b - a).clamp(min=1).double()).long()
    return torch.where(b > a, rms, 0).tolist()


def _threshold(db: float) -> float:
    return 10 ** (db / 20) * FULL_SCALE


def silent_ranges(pcm: torch.Tensor, rate: int, min_ms: int, db: float = SILENCE_DB,
                  step_ms: int = SEEK_MS) -> list[list[int]]:
    """pydub's detect_silence: [start, end] ms of runs of silent windows of min_ms, tried every step_ms."""
    length = _ms_length(pcm, rate)
    if length < min_ms:
        return []
    last = length - min_ms
    starts = list(range(0, last + 1, step_ms)) + ([last] if last % step_ms else [])
    limit = _threshold(db)
    silent = [s for s, r in zip(starts, _window_rms(pcm, rate, starts, min_ms, length)) if r <= limit]
    if not silent:
        return []
    ranges, begin, prev = [], silent[0], silent[0]
    for s in silent[1:]:
        # a new range only where the windows neither follow on nor overlap
        if s != prev + step_ms and s > prev + min_ms:
            ranges.append([begin, prev + min_ms])
            begin = s
        prev = s
    ranges.append([begin, prev + min_ms])
    return ranges


def nonsilent_ranges(pcm: torch.Tensor, rate: int, min_ms: int, db: float = SILENCE_DB,
                     step_ms: int = SEEK_MS) -> list[list[int]]:
    """pydub's detect_nonsilent: the gaps between silent_ranges, [start, end] ms."""
    silences = silent_ranges(pcm, rate, min_ms, db, step_ms)
    length = _ms_length(pcm, rate)
    if not silences:
        return [[0, length]]
    if silences[0] == [0, length]:
        return []
    ranges, prev_end = [], 0
    for start, end in silences:
        ranges.append([prev_end, start])
        prev_end = end
    if silences[-1][1] != length:
        ranges.append([prev_end, length])
    return ranges[1:] if ranges[0] == [0, 0] else ranges


def _leading_silence_ms(pcm: torch.Tensor, rate: int, db: float = SILENCE_DB, chunk_ms: int = SEEK_MS) -> int:
    """pydub's detect_leading_silence: ms until the first chunk_ms chunk above db (strictly below is silent)."""
    length = _ms_length(pcm, rate)
    starts = list(range(0, length, chunk_ms))
    for s, r in zip(starts, _window_rms(pcm, rate, starts, chunk_ms, length)):
        # pydub's dBFS, log(x, 10) as it computes it (log10 may round otherwise); an RMS of 0 is -inf
        if r != 0 and 20 * math.log(r / FULL_SCALE, 10) >= db:  # noqa: FURB163
            return s
    return length


def _trim_edges(pcm: torch.Tensor, rate: int, lead_ms: int, trail_ms: int) -> torch.Tensor:
    """The package's remove_silence_edges: cut leading silence keeping lead_ms of it, then the same reversed."""
    pcm = _cut(pcm, rate, max(0, _leading_silence_ms(pcm, rate) - lead_ms))
    pcm = pcm.flip(0)
    pcm = _cut(pcm, rate, max(0, _leading_silence_ms(pcm, rate) - trail_ms))
    return pcm.flip(0)


def remove_silence(wave: torch.Tensor, rate: int, mid_ms: int, lead_ms: int, trail_ms: int) -> torch.Tensor:
    """The package's remove_silence on a mono [1, S] wave: inner silences longer than mid_ms shortened to mid_ms
    (split_on_silence keeping mid_ms on each side, halves where two keeps overlap), edges trimmed to lead_ms /
    trail_ms; the result is 16-bit-quantized, as the package's."""
    pcm = to_pcm16(wave.reshape(-1))
    if mid_ms > 0:
        length = _ms_length(pcm, rate)
        keep = [[s - mid_ms, e + mid_ms] for s, e in nonsilent_ranges(pcm, rate, mid_ms)]
        for left, right in itertools.pairwise(keep):
            if right[0] < left[1]:
                left[1] = right[0] = (left[1] + right[0]) // 2
        parts = [_cut(pcm, rate, max(s, 0), min(e, length)) for s, e in keep]
        pcm = torch.cat(parts) if parts else pcm[:0]
    return from_pcm16(_trim_edges(pcm, rate, lead_ms, trail_ms))[None]


def trim_long(wave: torch.Tensor, rate: int, max_s: float = 15.0, min_s: float = 3.0,
              over_s: float = 20.0) -> torch.Tensor:
    """The package's trim_long_audio: audio over over_s seconds cut at the latest start of speech (100 ms of
    -40 dBFS silence before it) within max_s, or at max_s when that start falls before min_s."""
    if wave.shape[-1] / rate <= over_s:
        return wave
    pcm = to_pcm16(wave.reshape(-1))
    speech = nonsilent_ranges(pcm, rate, 100, -40.0)
    if not speech:
        return wave
    max_ms, min_ms, split = int(max_s * 1000), int(min_s * 1000), 0
    for start, end in speech:
        if split < start <= max_ms:
            split = start
        if end > max_ms:
            break
    if split < min_ms:
        split = min(max_ms, _ms_length(pcm, rate))
    return from_pcm16(_cut(pcm, rate, 0, split))[None]


# --- loudness, fades, chunks ---------------------------------------------------------------------------

def rms(wave: torch.Tensor) -> float:
    """Root mean square (the package's ref_rms; here summed in f64, within f32 rounding of numpy's f32 mean)."""
    return math.sqrt(wave.double().pow(2).mean().item())


def _ramp(start: float, stop: float, n: int) -> torch.Tensor:
    """numpy.linspace(start, stop, n, dtype=float32): evaluated in f64 (i x step + start, the end exact), then
    rounded, so it is numpy's ramp bit for bit."""
    if n == 1:
        return torch.tensor([start], dtype=torch.float32)
    ramp = torch.arange(n, dtype=torch.float64) * ((stop - start) / (n - 1)) + start
    ramp[-1] = stop
    return ramp.float()


def fade_and_pad(wave: torch.Tensor, rate: int, pad_s: float = 0.1, fade_s: float = 0.1) -> torch.Tensor:
    """[C, S] -> [C, S + 2 pad]: linear fade in and out over fade_s (at most half the wave), pad_s of zeros on
    each side (the package's fade_and_pad_audio)."""
    if wave.shape[-1] == 0:
        return wave
    fade, pad = int(fade_s * rate), int(pad_s * rate)
    out = wave.clone()
    k = min(fade, out.shape[-1] // 2)
    if fade > 0 and k > 0:
        out[..., :k] *= _ramp(0, 1, k)
        out[..., -k:] *= _ramp(1, 0, k)
    if pad > 0:
        zeros = out.new_zeros(out.shape[0], pad)
        out = torch.cat([zeros, out, zeros], dim=-1)
    return out


def join_chunks(chunks: list[torch.Tensor], rate: int, gap_s: float = 0.3) -> torch.Tensor:
    """The package's cross_fade_chunks: [C, S_i] chunks in order, each boundary a fade out over a third of gap_s,
    a third of gap_s of silence, and a fade in over a third of gap_s."""
    third = int(gap_s * rate) // 3
    merged = chunks[0].clone()
    for chunk in chunks[1:]:
        k = min(third, merged.shape[-1])
        if k > 0:
            merged[..., -k:] *= _ramp(1, 0, k)
        faded = chunk.clone()
        k = min(third, faded.shape[-1])
        if k > 0:
            faded[..., :k] *= _ramp(0, 1, k)
        merged = torch.cat([merged, merged.new_zeros(chunks[0].shape[0], third), faded], dim=-1)
    return merged


def match_loudness(wave: torch.Tensor, ref_rms: float | None) -> torch.Tensor:
    """Quiet references (RMS under 0.1, which the encoder saw raised to 0.1) scale the speech back down by
    ref_rms / 0.1; without a reference the peak goes to 0.5 (the package's _post_process_audio)."""
    if ref_rms is not None:
        return wave * ref_rms / 0.1 if ref_rms < 0.1 else wave
    peak = wave.abs().max()
    return wave / peak * 0.5 if peak > 1e-6 else wave


def finish_speech(wave: torch.Tensor | list[torch.Tensor], rate: int, ref_rms: float | None, trim: bool = True,
                  pad_s: float = 0.1, fade_s: float = 0.1) -> torch.Tensor:
    """Decoded speech [1, S] (or a long text's decoded chunks, joined first) -> the package's output [1, S']:
    inner silences over 500 ms shortened and edges trimmed to 100 ms (trim, its postprocess_output), loudness
    matched to the reference, faded and padded."""
    if isinstance(wave, list):
        wave = join_chunks(wave, rate)
    if trim:
        wave = remove_silence(wave, rate, 500, 100, 100)
    return fade_and_pad(match_loudness(wave, ref_rms), rate, pad_s, fade_s)


def prepare_reference(wave: torch.Tensor, rate: int, codec_rate: int, hop: int, preprocess: bool = True,
                      transcribed: bool = True) -> tuple[torch.Tensor, float]:
    """A reference recording [C, S] (or [S]) at rate -> (mono [1, S'] at codec_rate, whole hops, ready to encode;
    its RMS before any change): channels averaged, resampled, raised to RMS 0.1 when quieter, and with
    preprocess, cut to 15 s when over 20 s (only without a transcript) and silences trimmed (inner over 200 ms,
    100 ms kept before and 200 ms after), as the package's create_voice_clone_prompt."""
    wave = wave.float()
    wave = wave[None] if wave.dim() == 1 else wave.mean(dim=0, keepdim=True)
    wave = resample(wave, rate, codec_rate)
    ref_rms = rms(wave)
    if 0 < ref_rms < 0.1:
        wave = wave * 0.1 / ref_rms
    if preprocess:
        if not transcribed:
            wave = trim_long(wave, codec_rate)
        wave = remove_silence(wave, codec_rate, 200, 100, 200)
        if wave.shape[-1] == 0:
            raise ValueError("reference audio: nothing is left after silence removal; turn preprocessing off")
    return wave[:, : wave.shape[-1] - wave.shape[-1] % hop], ref_rms
