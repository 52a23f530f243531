"""LTX-2.5's sampling as ComfyUI's templates video_ltx2_5_t2v, _i2v and _flf2v run it (reference/families/ltx25.md
sections 7 and 9): the AV latent packed as ComfyUI packs a nested latent, ancestral Euler on a flow model
(euler_ancestral on CONST), the dual CFG guider (LTXVDualCFGGuider), ManualSigmas, and the two stages: half size
from noise, the x2 latent upsampler, then the upsampled latent re-noised to stage 2's first sigma with its own seed.
Frames given as images (newer ComfyUI's comfy_extras/nodes_lt.py): LTXVImgToVideoInplace's encoded image in place of
the first latent frame under a noise mask of 1 - strength, LTXVAddGuide's guide frames appended after the generated
ones (and LTXVCropGuides' crop); the sampler keeps masked values as ComfyUI's KSamplerX0Inpaint does and gives each
video row the time sigma x mask (LTXAV.process_timestep).

The state is ComfyUI's: every part flattened per sample and joined, [B, 1, N] (comfy.utils.pack_latents), video part
first. The model sees it as LTX25.forward's rows: video [C, F, H, W] -> [F H W, C] (frame-major, then y, x), audio
[8, L, 16] -> [L, 8 x 16] (channels, then mel bins, as ComfyUI's audio patchifier)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..families.ltx25 import LTX25
from ..families.ltx25_positions import VIDEO_SCALE, Grid, Guide, keyframe_rows
from .ksampler import (
    Denoiser,
    StepPace,
    before_step,
    cfg_denoiser,
    inverse_noise_scaling,
    noise_scaling,
    prepare_noise_parts,
)

# The template's values (reference/templates.md, video_ltx2_5_t2v): ManualSigmas as typed, the stage-2 RandomNoise,
# the negative prompt of its LTXVConditioning.
STAGE_1_SIGMAS = "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0"
STAGE_2_SIGMAS = "0.85, 0.7250, 0.4219, 0.0"
TEMPLATE_SEED = 558811532553686
STAGE_2_SEED = 42
NEGATIVE_PROMPT = "pc game, console game, video game, cartoon, childish, ugly"

# model(x, sigma, prompt) -> x0, all on the packed state [B, 1, N]
PackedModel = Callable[[torch.Tensor, torch.Tensor, "Prompt"], torch.Tensor]


@dataclass(frozen=True)
class Prompt:
    """One conditioning as the transformer reads it: the connectors' rows for each stream and the rows to attend."""
    video: torch.Tensor              # [L, D]
    audio: torch.Tensor              # [L, D_audio]
    mask: torch.Tensor | None = None  # [L], 1 on rows to attend (None: all)


@dataclass(frozen=True)
class Stage:
    """One SamplerCustomAdvanced of the template: its sigmas, its RandomNoise seed (also the ancestral steps' seed,
    as SamplerCustomAdvanced passes noise.seed to the sampler) and its LTXVDualCFGGuider scales."""
    sigmas: torch.Tensor
    seed: int
    video_cfg: float = 1.0
    audio_cfg: float = 1.0


def manual_sigmas(text: str) -> torch.Tensor:
    """ComfyUI's ManualSigmas: every number the pattern [-+]?(\\d*\\.*\\d+) finds in text, as float32."""
    return torch.FloatTensor([float(s) for s in re.findall(r"[-+]?(?:\d*\.*\d+)", text)])


def template_stages(seed: int = TEMPLATE_SEED, video_cfg: float = 1.0, audio_cfg: float = 1.0) -> tuple[Stage, Stage]:
    """The template's two stages: stage 1 on the user's seed, stage 2 on its fixed 42; both guiders at the same
    scales (the template's 1, 1)."""
    return (Stage(manual_sigmas(STAGE_1_SIGMAS), seed, video_cfg, audio_cfg),
            Stage(manual_sigmas(STAGE_2_SIGMAS), STAGE_2_SEED, video_cfg, audio_cfg))


# --- the packed state ------------------------------------------------------------------------------------------

def pack(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """comfy.utils.pack_latents: each part [B, ...] as [B, 1, -1], joined on the last axis in order."""
    return torch.cat([p.reshape(p.shape[0], 1, -1) for p in parts], dim=-1)


def unpack(x: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """comfy.utils.unpack_latents: the parts of a packed state back in their shapes."""
    sizes = [math.prod(s[1:]) for s in shapes]
    return [p.reshape(x.shape[0], *s[1:]) for p, s in zip(torch.split(x, sizes, dim=-1), shapes)]


# --- sampler and guider ----------------------------------------------------------------------------------------

def sample_euler_ancestral_rf(denoiser: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, seed: int,
                              eta: float = 1.0, s_noise: float = 1.0, callback=None,
                              should_stop=None) -> torch.Tensor:
    """ComfyUI's euler_ancestral on a CONST (flow) model, k-diffusion sample_euler_ancestral_RF: per step
    sigma_down = sigma' (1 + (sigma'/sigma - 1) eta), x <- (sigma_down/sigma) x + (1 - sigma_down/sigma) x0, then
    x <- ((1 - sigma')/(1 - sigma_down)) x + n s_noise sqrt(sigma'^2 - sigma_down^2 (1 - sigma')^2/(1 - sigma_down)^2)
    with n a fresh randn of x's shape; a step to sigma 0 returns x0. The noise comes as default_noise_sampler draws
    it: one torch.Generator on x's device seeded with `seed`, one draw of the whole state per noised step. Sigmas
    stay 0-d float32 tensors in the arithmetic, as ComfyUI keeps them. callback(i + 1, total, x, x0) after each step;
    should_stop as ksampler's samplers."""
    sigmas, host, pace = sigmas.to(x.device), sigmas.cpu(), StepPace(x.device)
    generator = torch.Generator(device=x.device)
    generator.manual_seed(seed)
    total = len(sigmas) - 1
    for i in range(total):
        before_step(i, total, should_stop)
        x0 = denoiser(x, host[i])
        if host[i + 1] == 0:
            x = x0
        else:
            sigma_down = sigmas[i + 1] * (1 + (sigmas[i + 1] / sigmas[i] - 1) * eta)
            alpha_next, alpha_down = 1 - sigmas[i + 1], 1 - sigma_down
            renoise = (sigmas[i + 1] ** 2 - sigma_down ** 2 * alpha_next ** 2 / alpha_down ** 2) ** 0.5
            ratio = sigma_down / sigmas[i]
            x = ratio * x + (1 - ratio) * x0
            if eta > 0:
                n = torch.randn(x.size(), dtype=x.dtype, layout=x.layout, device=x.device, generator=generator)
                x = (alpha_next / alpha_down) * x + n * s_noise * renoise
        pace.queued()
        if callback is not None:
            callback(i + 1, total, x, x0)
    return x


def dual_cfg_denoiser(model: PackedModel, video_cfg: float, audio_cfg: float, video_size: int, positive: Prompt,
                      negative: Prompt | None = None) -> Denoiser:
    """LTXVDualCFGGuider (ComfyUI's Guider_LTXAVDualCFG) as denoiser(x, sigma) on the packed state; video_size: the
    video part's values per sample. Equal scales (math.isclose): ComfyUI's plain CFG at that scale (ksampler's
    cfg_denoiser: one positive pass at 1, else x0 = u + (c - u) cfg). Unequal: both passes always, combined in noise
    space as its sampler_cfg_function does, e = (x - u) + ((x - c) - (x - u)) cfg with video_cfg on the video values
    and audio_cfg on the rest, x0 = x - e."""
    if math.isclose(video_cfg, audio_cfg):
        return cfg_denoiser(model, video_cfg, positive, negative)
    if negative is None:
        raise ValueError(f"video_cfg {video_cfg} and audio_cfg {audio_cfg} need a negative prompt")

    def denoise(x, sigma):
        cond, uncond = x - model(x, sigma, positive), x - model(x, sigma, negative)
        e = uncond + (cond - uncond) * video_cfg
        e[..., video_size:] = uncond[..., video_size:] + (cond[..., video_size:] - uncond[..., video_size:]) * audio_cfg
        return x - e
    return denoise


def inpaint_denoiser(denoiser: Denoiser, latent: torch.Tensor, mask: torch.Tensor) -> Denoiser:
    """ComfyUI's KSamplerX0Inpaint for LTX-AV (its scale_latent_inpaint gives the clean latent): the model reads
    x m + latent (1 - m) and its x0 is kept where m = 1, the latent where m = 0. mask: the packed state's shape."""
    keep = 1.0 - mask

    def denoise(x, sigma):
        return denoiser(x * mask + latent * keep, sigma) * mask + latent * keep
    return denoise


# --- the transformer on the packed state -----------------------------------------------------------------------

def video_rows(video: torch.Tensor) -> torch.Tensor:
    """[C, F, H, W] -> [F H W, C]."""
    return video.flatten(1).T


def audio_rows(audio: torch.Tensor) -> torch.Tensor:
    """[C, L, M] -> [L, C M] (ComfyUI's audio patchifier, b c t f -> b t (c f))."""
    return audio.transpose(0, 1).flatten(1)


def packed_model(model: LTX25, shapes: Sequence[torch.Size], fps: float, video_mask: torch.Tensor | None = None,
                 guides: tuple[Guide, ...] = (), step: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
                 **forward) -> PackedModel:
    """model(x, sigma, prompt) -> x0 on the packed state of one sample (video [1, C, F, H, W], audio [1, C_a, L, M]):
    LTX25.forward on its rows at sigma for both streams, x0 = x - sigma v (CONST). video_mask: the video part of the
    denoise mask, [F] a latent frame or [F, H, W] (either broadcast; 1 generated, 0 clean; None: all generated),
    each row's time sigma m (ComfyUI's process_timestep). guides: the Guides of the video's last len(guides) frames
    (add_guide). The keyframe marker goes on keyframe_rows, as ComfyUI's LTX model puts it. step: model.forward
    (the default) or its graphed twin (model.graphed()); forward: further LTX25.forward arguments (av_times,
    rope_dtype, keyframes, check)."""
    video_shape, audio_shape = shapes
    if video_shape[0] != 1 or audio_shape[0] != 1:
        raise ValueError(f"LTX-2.5 sampling runs one sample at a time, got video {tuple(video_shape)} and audio "
                         f"{tuple(audio_shape)}")
    _, _, frames, height, width = video_shape
    if len(guides) >= frames:
        raise ValueError(f"{len(guides)} guide frames leave none of the video's {frames} latent frames to generate")
    grid = Grid(frames - len(guides), height, width, fps, tuple(guides))
    conditioned = None
    if video_mask is not None:
        mask = video_mask.float()
        mask = mask[:, None, None] if mask.dim() == 1 else mask
        conditioned = (1 - mask).expand(frames, height, width).reshape(-1)
    forward.setdefault("keyframes", keyframe_rows(grid))
    step = step or model.forward

    def x0(x: torch.Tensor, sigma: torch.Tensor, prompt: Prompt) -> torch.Tensor:
        video, audio = unpack(x, shapes)
        s = float(sigma)
        v, a = step(video_rows(video[0]), audio_rows(audio[0]), prompt.video, prompt.audio, grid, s, s, conditioned,
                    prompt.mask, **forward)
        v = v.T.reshape(video_shape)
        a = a.reshape(audio_shape[2], audio_shape[1], audio_shape[3]).transpose(0, 1)[None]
        return x - pack([v, a]).to(x.dtype) * sigma
    return x0


# --- a stage and the two-stage run --------------------------------------------------------------------------

def sample_stage(model: PackedModel, video: torch.Tensor, audio: torch.Tensor, stage: Stage, positive: Prompt,
                 negative: Prompt | None = None,
                 denoise_mask: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                 eta: float = 1.0, s_noise: float = 1.0, callback=None,
                 should_stop=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One SamplerCustomAdvanced over the AV latent (video [1, C, F, H, W], audio [1, C_a, L, M], normalized; all
    zeros for an empty latent): noise drawn as RandomNoise draws it (prepare_noise on the nested latent: video,
    then audio, one CPU generator), x = sigma_0 noise + (1 - sigma_0) latent (an empty latent is not shifted,
    LTX-AV's latent format is the identity anyway), euler_ancestral with the stage's seed under the dual CFG
    guider, x/(1 - sigma_last). denoise_mask: (video, audio) masks broadcast to the parts' shapes (ComfyUI's
    noise_mask, e.g. video [1, 1, F, 1, 1]; an audio mask None: all generated, as LTXVConcatAVLatent's ones; None:
    all generated). Returns (video, audio) f32."""
    shapes = [video.shape, audio.shape]
    noise = pack(prepare_noise_parts([video.float(), audio.float()], stage.seed)).to(video.device)
    latent = pack([video.float(), audio.float()])
    sigmas = stage.sigmas.float()
    denoiser = dual_cfg_denoiser(model, stage.video_cfg, stage.audio_cfg, video[0].numel(), positive, negative)
    if denoise_mask is not None:
        masks = [torch.ones(s, device=video.device) if m is None else m.float().to(video.device).expand(s)
                 for m, s in zip(denoise_mask, shapes)]
        denoiser = inpaint_denoiser(denoiser, latent, pack(masks))
    x = noise_scaling(sigmas[0], noise, latent)
    x = sample_euler_ancestral_rf(denoiser, x, sigmas, stage.seed, eta, s_noise, callback, should_stop)
    video_out, audio_out = unpack(inverse_noise_scaling(sigmas[-1], x), shapes)
    return video_out, audio_out


def sample_two_stage(model: LTX25, upsample: Callable[[torch.Tensor], torch.Tensor], video: torch.Tensor,
                     audio: torch.Tensor, fps: float, positive: Prompt, negative: Prompt | None = None,
                     stages: tuple[Stage, Stage] | None = None, first_frame: FirstFrame | None = None,
                     callback=None, should_stop=None, **forward) -> tuple[torch.Tensor, torch.Tensor]:
    """The templates' sampling: stage 1 on the empty half-size AV latent (video [1, C, F, H, W], audio [1, C_a, L,
    M]), the video upsampled (upsample: normalized [1, C, F, H, W] -> [1, C, F, 2H, 2W], e.g. a LatentUpsampler's
    upsample with the video VAE's statistics, as LTXVLatentUpsampler), the audio carried, then stage 2 from that
    latent. stages: template_stages() by default. first_frame: image to video (video_ltx2_5_i2v), its image put in
    before each stage under that stage's noise mask (image_to_video). callback(stage, i, total, x, x0); forward: as
    packed_model's. Returns the final (video, audio) latents, normalized."""
    stages = template_stages() if stages is None else stages
    for k, stage in enumerate(stages):
        if k == 1:
            video = upsample(video)  # LTXVLatentUpsampler drops the noise mask
        mask = None
        if first_frame is not None:
            video, mask = image_to_video(video, None, first_frame.encode(*video.shape[3:]), first_frame.strengths[k])
        step = None if callback is None else (lambda i, n, x, x0, k=k: callback(k + 1, i, n, x, x0))
        net = packed_model(model, [video.shape, audio.shape], fps, video_mask=None if mask is None else mask[0, 0],
                           **forward)
        video, audio = sample_stage(net, video, audio, stage, positive, negative,
                                    denoise_mask=None if mask is None else (mask, None), callback=step,
                                    should_stop=should_stop)
    return video, audio


# --- frames given as images (LTXVImgToVideoInplace, LTXVAddGuide, LTXVCropGuides) ------------------------------

PIXEL_FRAMES = VIDEO_SCALE[0]  # pixel frames a latent frame stands for after the first


@dataclass(frozen=True)
class FirstFrame:
    """video_ltx2_5_i2v's LTXVImgToVideoInplace before each stage: encode(height, width) -> the image's normalized
    latent [1, C, 1, height, width] at a stage's latent size (the caller resizes and encodes the image, as the node
    does), and each stage's strength (the template's 0.7, then 1.0)."""
    encode: Callable[[int, int], torch.Tensor]
    strengths: tuple[float, float] = (0.7, 1.0)


def frame_mask(video: torch.Tensor) -> torch.Tensor:
    """ComfyUI's get_noise_mask of a latent without one: ones [B, 1, F, 1, 1] (every frame generated)."""
    return torch.ones(video.shape[0], 1, video.shape[2], 1, 1)


def image_to_video(video: torch.Tensor, mask: torch.Tensor | None, encoded: torch.Tensor,
                   strength: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LTXVImgToVideoInplace on a video latent [B, C, F, H, W] and its noise mask (None: frame_mask): the encoded
    frames [1, C, t, H, W] in place of the first t latent frames, their mask 1 - strength (strength 1: kept as
    given). Returns new (video, mask)."""
    t = encoded.shape[2]
    video = video.clone()
    video[:, :, :t] = encoded.to(video)
    mask = frame_mask(video) if mask is None else mask.clone()
    mask[:, :, :t] = 1.0 - strength
    return video, mask


def guide_frame(frame_idx: int, frames: int, pixel_frames: int) -> tuple[int, int]:
    """LTXVAddGuide's placement (get_latent_index) of a guide of pixel_frames frames on a video of `frames` latent
    frames (the generated ones, guides not counted): frame_idx a pixel frame, negative counted back from the last
    (-1: the last); a guide of several frames starts on a frame 8k + 1 (rounded down). Returns (pixel frame, latent
    frame)."""
    frame = frame_idx if frame_idx >= 0 else max((frames - 1) * PIXEL_FRAMES + 1 + frame_idx, 0)
    if pixel_frames > 1 and frame != 0:
        frame = (frame - 1) // PIXEL_FRAMES * PIXEL_FRAMES + 1
    return frame, (frame + PIXEL_FRAMES - 1) // PIXEL_FRAMES


def add_guide(video: torch.Tensor, mask: torch.Tensor | None, guides: tuple[Guide, ...], encoded: torch.Tensor,
              frame: int, strength: float, causal: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor, tuple[Guide, ...]]:
    """LTXVAddGuide's append_keyframe: the encoded guide frames [1, C, n, H, W] after the video latent's frames, their
    noise mask max(0, 1 - strength) (mask None: frame_mask first), and their Guides at pixel frame `frame`: latent
    frame j of the guide spans [max(8j - 7, 0), 8j + 1) when causal (it starts at frame 0 or is one image), else
    [8j, 8j + 8), moved by frame (ComfyUI's keyframe_idxs). Returns new (video, mask, guides)."""
    n = encoded.shape[2]
    mask = frame_mask(video) if mask is None else mask
    added = torch.full((mask.shape[0], 1, n, *mask.shape[3:]), max(0.0, 1.0 - strength), dtype=mask.dtype)
    offset = 1 - PIXEL_FRAMES if causal else 0
    spans = [(max(j * PIXEL_FRAMES + offset, 0), (j + 1) * PIXEL_FRAMES + offset) for j in range(n)]
    return (torch.cat([video, encoded.to(video).expand(video.shape[0], -1, -1, -1, -1)], dim=2),
            torch.cat([mask, added], dim=2),
            guides + tuple(Guide(frame + start, frame + end, strength) for start, end in spans))


def crop_guides(video: torch.Tensor, mask: torch.Tensor | None, guides: tuple[Guide, ...]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """LTXVCropGuides: the video latent and its noise mask (None: frame_mask) without the guide frames."""
    mask = frame_mask(video) if mask is None else mask
    if not guides:
        return video, mask
    return video[:, :, :-len(guides)], mask[:, :, :-len(guides)]
