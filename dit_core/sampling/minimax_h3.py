"""MiniMax H3's own sampling (reference/families/minimax_h3.md sections 6 and 11): two shifted linspace schedules,
video and audio, as diffusers' MiniMaxH3Scheduler builds them; ComfyUI's closed-form audio clock on the video grid;
the data-ward Euler step (eta 0, f32) and a loop that steps each stream on its own grid over explicit row tensors;
and ComfyUI's way, one sampler of ksampler.py on the video sigmas over video rows and the audio carried on that grid;
and the whole run of a prompt (sample_t2va: ComfyUI's noise, keyframes, the family's denoised).

H3's convention is kept here (section 11 item 4): t = 1 - sigma, 1 = clean, the velocity points data-ward,
x0 = x + sigma v. Step counts are forwards, as ComfyUI and our nodes count them (section 11 item 1): `steps` forwards
walk a grid of steps + 1 points ending in 0 (diffusers' num_inference_steps is that point count)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..families.minimax_h3 import (KEYFRAME_TIME, PATCH, MiniMaxH3, Reference, audio_to_rows, packed_layout,
                                   patchify, rows_to_audio, unpatchify)
from .ksampler import SAMPLERS, before_step, prepare_noise_parts
from .schedules import calculate_sigmas

VIDEO_SHIFT = 12.0  # H3's released shifts (diffusers flow_shift / audio_flow_shift, ComfyUI shift / audio_shift)
AUDIO_SHIFT = 3.0
# FastH3's template: ComfyUI's MiniMaxH3SigmaShift(shift_video 10, shift_audio 3), 8 steps of res_multistep on the
# simple scheduler. The node sets ModelSamplingAV's shifts (the video grid's, and audio_scale = video / audio for the
# carried audio) and hands both to the model's audio clock: sample_t2va(video_shift=, audio_shift=) of these.
FASTH3_SHIFTS = (10.0, 3.0)

# denoised(x_video, x_audio, sigma_video, sigma_audio) -> (x0_video, x0_audio), all rows in and out
Denoised = Callable[[torch.Tensor, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]


def h3_sigmas(steps: int, shift: float) -> torch.Tensor:
    """The grid of MiniMaxH3Scheduler.set_timesteps(steps + 1): shift*b/(1 + (shift - 1)*b) on b = linspace(1, 0,
    steps + 1) f32, consecutive repeats dropped (in diffusers' order of operations, so bit for bit). steps + 1
    points ending in exactly 0; fewer only if f32 merges points next to 1 (not before ~10^5 steps at shift 12)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not shift > 0:
        raise ValueError(f"h3_sigmas: shift must be > 0, got {shift}")
    b = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float32)
    return torch.unique_consecutive(shift * b / (1 + (shift - 1) * b))


def audio_sigma_of_video(sigma_video, video_shift: float, audio_shift: float):
    """ComfyUI's closed-form audio clock (its MiniMaxH3 model derives t_a = 1 - this from sigma_v): undo the video
    shift, b = s/(video_shift + s*(1 - video_shift)), then apply the audio shift, audio_shift*b/(1 + (audio_shift -
    1)*b). On h3_sigmas(steps, video_shift) it gives h3_sigmas(steps, audio_shift) point for point up to f32
    rounding (both are shifts of the same linspace point). sigma_video: a float or a tensor (computed in its
    dtype)."""
    b = sigma_video / (video_shift + sigma_video * (1 - video_shift))
    return audio_shift * b / (1 + (audio_shift - 1) * b)


def data_ward_x0(x: torch.Tensor, v: torch.Tensor, sigma) -> torch.Tensor:
    """x0 = x + sigma v with sigma read back from the model time, 1 - (1 - sigma) in f32, as diffusers' step does
    (it keeps the time's sigma for x0 and the grid's for the ratio; below 0.5 the two differ in the last bit).
    The family's denoised uses the grid's sigma: equal up to that bit."""
    t = 1 - torch.as_tensor(sigma, dtype=torch.float32)
    return x + (1 - t.to(device=x.device, dtype=x.dtype)) * v


def euler_step(x: torch.Tensor, x0: torch.Tensor, sigma, sigma_next) -> torch.Tensor:
    """One Euler step (eta 0) written as diffusers' blend, x' = r x + (1 - r) x0, r = sigma_next/sigma, in f32 (f64
    stays f64) and back to x's dtype. sigma, sigma_next: grid values (floats or 0-d tensors)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    s = torch.as_tensor(sigma, dtype=torch.float32).to(device=x.device, dtype=dtype)
    s_next = torch.as_tensor(sigma_next, dtype=torch.float32).to(device=x.device, dtype=dtype)
    r = s_next / s
    return (r * x.to(dtype) + (1.0 - r) * x0.to(dtype)).to(x.dtype)


def sample_h3(denoised: Denoised, video: torch.Tensor, audio: torch.Tensor, sigmas_video: torch.Tensor,
              sigmas_audio: torch.Tensor, video_conditions: int = 0, audio_conditions: int = 0, callback=None,
              should_stop=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Both streams from their start rows to sigma 0, as diffusers' modular denoise loop steps them: step i calls
    denoised(video, audio, sigma_video_i, sigma_audio_i) once (one forward; H3 is guidance-distilled) and takes
    euler_step on each stream on its own grid. The first video_conditions video rows and audio_conditions audio rows
    are conditions: passed to denoised, never stepped. video [rows, ...], audio [rows, ...]: the start (noise at
    sigma 1 on the target rows), not changed; the callback sees the loop's own tensors (copy to keep them).
    sigmas_audio: h3_sigmas(steps, AUDIO_SHIFT) for diffusers' two grids, or audio_sigma_of_video(sigmas_video,
    ...) for ComfyUI's clock (the same values up to f32 rounding).
    callback(i + 1, total, (video, audio), (x0_video, x0_audio)) after each step; should_stop() is asked before
    each step, raising SamplingCancelled (a cancel within a step belongs to denoised)."""
    if len(sigmas_video) != len(sigmas_audio):
        # diffusers zips the two grids (the shorter one wins, leaving the other stream short of 0): refuse instead
        raise ValueError(f"sample_h3: {len(sigmas_video)} video sigmas and {len(sigmas_audio)} audio sigmas; the "
                         "streams take the same number of steps")
    if not 0 <= video_conditions <= video.shape[0] or not 0 <= audio_conditions <= audio.shape[0]:
        raise ValueError(f"sample_h3: {video_conditions} video and {audio_conditions} audio condition rows for "
                         f"{video.shape[0]} and {audio.shape[0]} rows")
    sigmas_video, sigmas_audio = sigmas_video.float().cpu(), sigmas_audio.float().cpu()
    total = len(sigmas_video) - 1
    video, audio = video.clone(), audio.clone()  # one copy, stepped in place (H3's video rows are large)
    kv, ka = video_conditions, audio_conditions
    for i in range(total):
        before_step(i, total, should_stop)
        x0_video, x0_audio = denoised(video, audio, float(sigmas_video[i]), float(sigmas_audio[i]))
        video[kv:] = euler_step(video[kv:], x0_video[kv:], sigmas_video[i], sigmas_video[i + 1])
        audio[ka:] = euler_step(audio[ka:], x0_audio[ka:], sigmas_audio[i], sigmas_audio[i + 1])
        if callback is not None:
            callback(i + 1, total, (video, audio), (x0_video, x0_audio))
    return video, audio


def comfy_h3_sigmas(scheduler: str, steps: int, video_shift: float = VIDEO_SHIFT) -> torch.Tensor:
    """The video grid ComfyUI samples H3 on: `scheduler` over ModelSamplingAV's discrete flow table (shift
    video_shift, multiplier 1000). `simple` gives h3_sigmas(steps, video_shift) up to f32 rounding."""
    return calculate_sigmas(scheduler, steps, video_shift, 1000.0)


def sample_h3_comfy(denoised: Denoised, video: torch.Tensor, audio: torch.Tensor, sigmas: torch.Tensor,
                    sampler_name: str, video_shift: float = VIDEO_SHIFT, audio_shift: float = AUDIO_SHIFT,
                    callback=None, should_stop=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Both streams as ComfyUI samples H3 (ModelSamplingAV): one sampler of ksampler.SAMPLERS on the video sigmas
    over [video rows | carried audio rows]. The audio is carried as y = x_a sigma_v/sigma_a, sigma_a the closed-form
    audio clock of sigma_v; with k = video_shift/audio_shift, y = sigma_v (n - k x0) + k x0 is linear in sigma_v, so
    the carried stream's x0 is k x0_a and every flow sampler steps it as it steps the video. At sigma 1 the
    carry is 1, at 0 it is k: the result's audio is y/k.
    video [rows, ...], audio [rows, ...]: the noise (not changed), scaled by sigmas[0] as ComfyUI's noise scaling
    does on an empty latent; returns the clean rows. Euler here equals sample_h3's per-stream Euler up to f32
    rounding. callback(i + 1, total, (video, audio) carried,
    (x0_video, x0_audio)); should_stop as sample_h3's."""
    if sampler_name not in SAMPLERS:
        raise ValueError(f"unknown sampler_name {sampler_name!r}; supported: {', '.join(SAMPLERS)}")
    if len(sigmas) < 2 or float(sigmas[-1]) != 0.0 or not 0 < float(sigmas[0]) <= 1:
        raise ValueError(f"sample_h3_comfy: sigmas must run from (0, 1] down to 0, got {sigmas.tolist()}")
    k = video_shift / audio_shift
    split = video.numel()
    shapes = video.shape, audio.shape

    def parts(state):
        return state[:split].view(shapes[0]), state[split:].view(shapes[1])

    def carried_x0(state, sigma_video):
        v, y = parts(state)
        sv = float(sigma_video)
        sa = float(audio_sigma_of_video(sigma_video.float(), video_shift, audio_shift))
        x0_video, x0_audio = denoised(v, y * (sa / sv), sv, sa)
        return torch.cat((x0_video.reshape(-1).to(state.dtype), (k * x0_audio).reshape(-1).to(state.dtype)))

    def step_seen(i, total, state, x0):
        if callback is not None:
            callback(i, total, parts(state), parts(x0))

    state = torch.cat((video.reshape(-1), audio.reshape(-1))).float() * sigmas[0].float()
    state = SAMPLERS[sampler_name](carried_x0, state, sigmas.float(), callback=step_seen, should_stop=should_stop)
    video_out, carried = parts(state)
    return video_out.to(video.dtype), (carried / k).to(audio.dtype)


def condition_rows(latents: list[torch.Tensor], seed: int | None, row_width: int) -> torch.Tensor:
    """Video condition rows [sum of F x h/2 x w/2, 4C] as ComfyUI's H3 model forms them (_cond_video_rows): each
    normalized latent [1, C, F, h, w] (a keyframe, or a reference's own size) patchified and augmented
    0.999 z + 0.001 n, n from a fresh CPU generator seeded with `seed` for every latent (each restarts the same
    stream), f32. No latents: [0, row_width]."""
    rows = []
    for z in latents:
        r = patchify(z[0].float().cpu())
        noise = torch.randn(r.shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
        rows.append(KEYFRAME_TIME * r + (1.0 - KEYFRAME_TIME) * noise)
    return torch.cat(rows) if rows else torch.empty(0, row_width)


def keyframe_rows(latents: list[torch.Tensor], height: int, width: int, seed: int | None,
                  row_width: int) -> torch.Tensor:
    """condition_rows of keyframe latents, each [1, C, 1, LH, LW] (one frame of the target's size)."""
    for z in latents:
        if z.dim() != 5 or z.shape[0] != 1 or z.shape[2] != 1 or tuple(z.shape[3:]) != (height, width):
            raise ValueError(f"MiniMaxH3: a keyframe latent is [1, C, 1, {height}, {width}], got {tuple(z.shape)}")
    return condition_rows(latents, seed, row_width)


def t2va_noise(model: MiniMaxH3, frames: int, height: int, width: int, audio_latents: int,
               seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The start noise ComfyUI draws for H3's AV latent (section 6, Noise): prepare_noise over its parts in order,
    video [1, C, F, LH, LW] then audio [1, C_audio, 2, Na], f32 on the CPU from one generator seeded with seed.
    (diffusers draws the audio straight in row layout: equal seeds do not give equal noise across the two.)"""
    parts = (torch.empty(1, model.arch.latents, frames, height, width),
             torch.empty(1, model.audio_in.in_features, 2, audio_latents))
    video, audio = prepare_noise_parts(parts, seed)
    return video, audio


def sample_t2va(model: MiniMaxH3, text: torch.Tensor, frames: int, height: int, width: int, audio_latents: int,
                steps: int, seed: int | None = None, noise: tuple[torch.Tensor, torch.Tensor] | None = None,
                video_shift: float = VIDEO_SHIFT, audio_shift: float = AUDIO_SHIFT, sampler: str | None = None,
                scheduler: str = "simple", keyframes: tuple[tuple[str, torch.Tensor], ...] = (),
                text_tags: torch.Tensor | None = None, references: tuple[Reference, ...] = (), callback=None,
                should_stop=None, check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Text to video + audio, on the host: (clean video latent [1, C, F, LH, LW], clean audio latent [1, C_audio,
    2, Na] in ComfyUI's AV shape). text: the text encoder's features [Nt, text_dim] or [1, Nt, text_dim]; frames,
    height, width: the video latent's F, LH, LW (odd sides padded for each forward, as ComfyUI pads them);
    audio_latents: Na per stereo channel; steps: forwards.
    The start is t2va_noise(seed) (ComfyUI's draw) or noise = (video, audio) in those two shapes; exactly one.
    sampler None: both streams walk diffusers' two grids with its Euler (h3_sigmas at video_shift and audio_shift);
    a ksampler sampler name ("euler", "res_multistep"): ComfyUI's way, that sampler on the `scheduler` grid of the
    video shift with the audio carried on it (sample_h3_comfy). One forward a step (guidance-distilled: no CFG).
    keyframes: ("first" | "last", normalized latent [1, C, 1, LH, LW]) condition frames in packed order (i2v, first
    and last frame), as ComfyUI's model adds them (keyframe_rows, with `seed`); passed to every forward, never
    stepped (ComfyUI's way only). references: ref2va's blocks in request order (ComfyUI's minimax_refs): their video
    latents become condition rows after the keyframes' (condition_rows, with `seed`), their audio latents audio
    condition rows as they are (ComfyUI's audio augmentation 1.0 adds no noise); passed to every forward, never
    stepped (ComfyUI's way only). text_tags: the text rows' modality tags where the prompt holds pictures (vision
    rows tag VIDEO); None: all TEXT. callback and should_stop go to the loop unchanged (its callback sees row
    tensors); check() runs after each block of every forward (it raises: ComfyUI's Cancel within a step)."""
    if (seed is None) == (noise is None):
        raise ValueError("sample_t2va: give a seed or the initial noise, not both or neither")
    if text.dim() == 3:
        if text.shape[0] != 1:
            raise ValueError(f"sample_t2va: one prompt at a time, got text features {tuple(text.shape)}")
        text = text[0]
    shapes = ((1, model.arch.latents, frames, height, width), (1, model.audio_in.in_features, 2, audio_latents))
    if noise is None:
        noise = t2va_noise(model, frames, height, width, audio_latents, seed)
    elif tuple(noise[0].shape) != shapes[0] or tuple(noise[1].shape) != shapes[1]:
        raise ValueError(f"sample_t2va: initial noise {tuple(noise[0].shape)}, {tuple(noise[1].shape)}; expected "
                         f"{shapes[0]}, {shapes[1]}")
    if (keyframes or references) and (sampler is None or seed is None):
        raise ValueError("sample_t2va: keyframes and references are added as ComfyUI adds them: give a sampler name "
                         "and the seed")
    if text_tags is not None and tuple(text_tags.shape) != (text.shape[0],):
        raise ValueError(f"sample_t2va: {tuple(text_tags.shape)} text tags for {text.shape[0]} text rows")
    # An odd latent side (a text-to-image size such as 728 / 16 = 45.5 -> 46 x 81) is padded circularly to the
    # patch grid for each forward and the output cropped, as ComfyUI's pad_to_patch_size does.
    pad_h, pad_w = height % PATCH[1], width % PATCH[2]
    if (keyframes or references) and (pad_h or pad_w):
        raise ValueError(f"sample_t2va: keyframes and references need even latent sides, got {height}x{width}")
    layout = packed_layout(text.shape[0] if text_tags is None else text_tags, frames, height + pad_h,
                           width + pad_w, audio_latents, keyframes=tuple(anchor for anchor, _ in keyframes),
                           references=references)
    dev = model.device  # the rows and the sampler's arithmetic where the model runs
    conditions = torch.cat((keyframe_rows([latent for _, latent in keyframes], height, width, seed,
                                          4 * model.arch.latents),
                            condition_rows([r.video for r in references if r.video is not None], seed,
                                           4 * model.arch.latents))).to(dev)
    audio_conditions = torch.cat([audio_to_rows(r.audio.float().cpu()) for r in references if r.audio is not None]
                                 or [torch.empty(0, model.audio_in.in_features)]).to(dev)
    txt = model.text_rows(text.float())  # refined once: the text rows do not change between steps
    video = noise[0][0].float().to(dev)  # [C, F, H, W]; sigma 1: the start is the noise itself
    audio = audio_to_rows(noise[1].float()).to(dev)

    def denoised(v, a, sigma_video, sigma_audio):
        rows = patchify(F.pad(v[None], (0, pad_w, 0, pad_h, 0, 0), mode="circular")[0] if pad_h or pad_w else v)
        x0_video, x0_audio = model.denoised(torch.cat((conditions.to(rows), rows)),
                                            torch.cat((audio_conditions.to(a), a)), txt, layout, sigma_video,
                                            sigma_audio, check)
        x0_video = unpatchify(x0_video[conditions.shape[0]:], frames, height + pad_h, width + pad_w)
        return x0_video[:, :, :height, :width], x0_audio[audio_conditions.shape[0]:]

    if sampler is None:
        video, audio = sample_h3(denoised, video, audio, h3_sigmas(steps, video_shift),
                                 h3_sigmas(steps, audio_shift), callback=callback, should_stop=should_stop)
    else:
        video, audio = sample_h3_comfy(denoised, video, audio, comfy_h3_sigmas(scheduler, steps, video_shift),
                                       sampler, video_shift, audio_shift, callback=callback, should_stop=should_stop)
    return video[None].cpu(), rows_to_audio(audio).cpu()
