"""What the clip benchmarks (bench_ltx25_clip.py, bench_h3_clip.py) share: the clock, the phases' table and the
fidelity line of an INT8 clip against BF16 of the same weights."""
from __future__ import annotations

import time

import torch
from bench_video_decode import psnr
from bench_z_image_step import rel


def now(device: torch.device) -> float:
    """The host's clock once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def timed(fn, device: torch.device) -> tuple[float, object]:
    start = now(device)
    out = fn()
    return now(device) - start, out


def print_phases(phases: tuple[tuple[str, str], ...], theirs: dict, first: dict, warm: dict) -> None:
    """One row a (key, label) phase, seconds: diffusers', ours first and warm, and the whole clip last."""
    print("| phase | diffusers s | ours first s | ours warm s | ours warm vs diffusers |")
    print("|---|---|---|---|---|")
    for key, label in (*phases, (None, "whole clip")):
        t, f, w = (sum(r.values()) if key is None else r[key] for r in (theirs, first, warm))
        print(f"| {label} | {t:.2f} | {f:.2f} | {w:.2f} | {t / w:.2f}x |", flush=True)


def fidelity_line(int8: tuple, bf16: tuple, tiny: bool) -> str:
    """The INT8 clip's (frames, waveform in -1..1, final video latent) against the BF16 clip's."""
    (frames, sound, latent), (frames_bf16, sound_bf16, latent_bf16) = int8, bf16
    return (f"ours INT8 against ours BF16 of the same weights: frames PSNR {psnr(frames, frames_bf16):.1f} dB, audio "
            f"PSNR {psnr(sound, sound_bf16, peak=2.0):.1f} dB (the waveform's range -1..1); the final video latent "
            f"{rel(latent, latent_bf16):.4f} relative" + " (tiny: random latents decoded)" * tiny)
