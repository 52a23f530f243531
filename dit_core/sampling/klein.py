"""FLUX.3 Klein's own loop: Euler on the raw velocity, the flow map's sigma_next, the step cache and reference
slots (seed 001's Flux.sample, the design engine's Klein loop; reference/families/flux3_klein.md section 7,
sampling)."""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from .ksampler import StepPace, before_step, noise_scaling, prepare_noise

def flux_noise(seed: int, height: int, width: int, batch: int = 1, channels: int = 128) -> torch.Tensor:
    """seed 001's fluxNoise: ComfyUI's draw for EmptyFlux2LatentImage's zeros [batch, 128, H/16, W/16] f32
    (prepare_noise; the Flux2 latent format's process_in is the identity). height, width in pixels."""
    if height % 16 or width % 16 or height < 16 or width < 16:
        raise ValueError(f"flux_noise: width and height must be positive multiples of 16, got "
                         f"{width}x{height}")
    return prepare_noise(torch.zeros(batch, channels, height // 16, width // 16), seed)


def sample_klein(model, noise: torch.Tensor, sigmas: torch.Tensor, text_rows: torch.Tensor,
                 references: Sequence[torch.Tensor] = (), cache=None, refresh: int = 0,
                 negative: torch.Tensor | None = None, cfg: float = 1.0, callback=None,
                 should_stop=None, latent: torch.Tensor | None = None, step=None) -> torch.Tensor:
    """One image's latent [128, h, w] at sigma 0 from noise [128, h, w] (seed 001 Flux.sample;
    reference/families/flux3_klein.md section 7, sampling): step i runs model.output(x, sigma_i, sigma_{i+1})
    (the flow map embeds sigma_{i+1}, 0 after the last step), then Euler on the raw velocity,
    x' = x + (sigma_{i+1} - sigma_i) v. cfg != 1 (the base model, 3.5) also runs `negative` text rows:
    v = v_neg + cfg (v_pos - v_neg).
    cache: a StepCache (step_cache.py) for the positive pass, its counts the report (`skipped`); the
    negative pass keeps a fresh one of the same limit. refresh > 0 (edits) records the references' keys and
    values on steps 0, refresh, 2 refresh, ... and reuses them between. callback(i + 1, total, x, x0) after
    each step; should_stop() is asked before each step and after each block, raising
    SamplingCancelled. latent: the image latent to start from (image to image, with klein_sigmas' denoise):
    x = sigma_0 noise + (1 - sigma_0) latent, ComfyUI's CONST noise_scaling (the Flux2 latent format's process_in
    is the identity); None: an empty latent. step: model.output or its twin (model.graphed()). No sigmas to walk:
    the latent (or the noise) as it is."""
    from .step_cache import RefSlots, StepCache  # the speed features, imported where used

    if not math.isclose(cfg, 1.0) and negative is None:
        raise ValueError(f"sample_klein: cfg {cfg} needs negative text rows (or set cfg to 1.0)")
    total = len(sigmas) - 1
    branches = [(text_rows, cache, RefSlots(refresh) if refresh else None)]
    if not math.isclose(cfg, 1.0):
        neg_cache = cache.fresh() if isinstance(cache, StepCache) else None
        branches.append((negative, neg_cache, RefSlots(refresh) if refresh else None))
    if len(sigmas) < 2:  # denoise 0: CFGGuider.sample returns the latent untouched
        return noise if latent is None else latent
    x = sigmas[0].to(noise.dtype) * noise  # noise_scaling on an empty latent (1 * noise at sigma 1)
    if latent is not None:
        x = noise_scaling(sigmas[0].to(noise.dtype), noise, latent.to(noise.dtype))
    pace = StepPace(x.device)
    for i in range(total):
        before_step(i, total, should_stop)
        check = lambda i=i: before_step(i, total, should_stop)
        sigma, sigma_next = float(sigmas[i]), float(sigmas[i + 1])
        vs = []
        for rows, step_cache, slots in branches:
            if slots is not None:
                slots.begin(i)
            vs.append((step or model.output)(x, sigma, sigma_next, rows, references, check, step_cache, slots))
        v = vs[0] if len(vs) == 1 else vs[1] + cfg * (vs[0] - vs[1])
        x0 = x - sigmas[i].to(x.dtype) * v
        x = x + (sigmas[i + 1] - sigmas[i]).to(x.dtype) * v
        pace.queued()
        if callback is not None:
            callback(i + 1, total, x, x0)
    if isinstance(cache, StepCache) and cache.limit > 0:
        logging.getLogger(__name__).info("FLUX.3 step cache %.3g: %d of %d steps skipped", cache.limit,
                                         cache.skipped, cache.steps)
    return x
