"""Flow sampling as ComfyUI v0.3.75's KSampler runs it: seeded noise, Euler, res_multistep, CFG, and the model as a
sampler node runs it (the sigma schedules: schedules.py; FLUX.3 Klein's own loop: klein.py)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .schedules import SCHEDULERS, ksampler_sigmas

# denoiser(x, sigma) -> x0, sigma a 0-dim tensor on the host (the samplers read their sigmas there)
Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class SamplingCancelled(Exception):
    """Raised between steps when `should_stop()` says so; `steps_done` of `total` steps had finished."""

    def __init__(self, steps_done: int, total: int):
        super().__init__(f"sampling cancelled after {steps_done} of {total} steps")
        self.steps_done = steps_done
        self.total = total


# --- noise --------------------------------------------------------------------------------------------------

def prepare_noise(latent: torch.Tensor, seed: int,
                  batch_index: Sequence[int] | None = None) -> torch.Tensor:
    """The noise ComfyUI draws for `latent` (comfy/sample.py prepare_noise): randn of the latent's shape and
    dtype on the CPU from a generator seeded with `seed`. With `batch_index`, one [1, ...] draw per index
    0..max(index) in order, row j taking draw batch_index[j]. A local generator: the same stream as
    torch.manual_seed, and the global RNG is left untouched."""
    return _draws(latent, _generator(seed), batch_index)


def prepare_noise_parts(parts: Sequence[torch.Tensor], seed: int,
                        batch_index: Sequence[int] | None = None) -> list[torch.Tensor]:
    """The noise ComfyUI draws for a latent of several parts (a NestedTensor, e.g. video then audio): each part's
    draws, as prepare_noise's, one part after another from one generator seeded with `seed`, in the parts' order."""
    gen = _generator(seed)
    return [_draws(part, gen, batch_index) for part in parts]


def _generator(seed: int) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def _draws(latent: torch.Tensor, gen: torch.Generator, batch_index: Sequence[int] | None) -> torch.Tensor:
    if batch_index is None:
        return torch.randn(latent.shape, dtype=latent.dtype, generator=gen, device="cpu")
    inds = [int(i) for i in batch_index]
    if not inds or min(inds) < 0:
        raise ValueError(f"prepare_noise: batch_index must be indices >= 0, got {list(batch_index)}")
    if len(inds) != latent.shape[0]:
        raise ValueError(f"prepare_noise: batch_index has {len(inds)} entries for a latent batch of "
                         f"{latent.shape[0]}")
    # Draws for unused indices are made and dropped, so that each index keeps its place in the stream.
    draws = [torch.randn([1, *latent.shape[1:]], dtype=latent.dtype, generator=gen, device="cpu")
             for _ in range(max(inds) + 1)]
    return torch.cat([draws[i] for i in inds], dim=0)


# --- latent format and the CONST (rectified flow) model sampling --------------------------------------------

def process_in(z: torch.Tensor, shift, scale) -> torch.Tensor:
    """Raw VAE latent -> the normalized latent the model sees (ComfyUI latent_formats' process_in), with the
    family's latent shift and scale (its VAE's: e.g. codecs/flux1_vae.py SHIFT, SCALING; per-channel tensors are
    moved to z's device)."""
    return (z - _on(shift, z)) * _on(scale, z)


def process_out(x: torch.Tensor, shift, scale) -> torch.Tensor:
    """Normalized latent -> raw VAE latent (ComfyUI latent_formats' process_out)."""
    return (x / _on(scale, x)) + _on(shift, x)


def _on(value, x: torch.Tensor):
    """A latent format's number as is, or its per-channel tensor on x's device."""
    return value.to(x.device) if isinstance(value, torch.Tensor) else value


def noise_scaling(sigma: torch.Tensor, noise: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
    """Start of sampling, x = sigma*noise + (1 - sigma)*latent (ComfyUI model_sampling.CONST.noise_scaling).
    CONST ignores max_denoise: a flow model starts the same whether or not sigma_0 is the table's maximum."""
    return sigma * noise + (1.0 - sigma) * latent


def inverse_noise_scaling(sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """End of sampling, x/(1 - sigma_last) (ComfyUI CONST.inverse_noise_scaling; identity at sigma_last 0)."""
    return x / (1.0 - sigma)


# --- samplers: denoiser(x, sigma) -> x0, sigma a 0-d tensor -------------------------------------------------

def before_step(i: int, total: int, should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise SamplingCancelled(i, total)


class StepPace:
    """Lets the host queue a step while the GPU runs the one before, and no further: after queuing step i it waits
    for step i - 1's end (an event). The samplers read their sigmas on the host (one copy before the first step),
    so nothing else waits for the GPU between steps; a step read back each step (a device sigma compared or passed
    as a float) left the GPU idle while the host began the next step's launches. One step queued ahead keeps the
    progress bar and a cancel within a step of the GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.ended: list = []

    def queued(self) -> None:
        if self.cuda:
            self.ended.append(torch.cuda.Event())
            self.ended[-1].record()
            if len(self.ended) > 1:
                self.ended.pop(0).synchronize()


def sample_euler(denoiser: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, callback=None,
                 should_stop=None) -> torch.Tensor:
    """Euler on the ODE dx/dsigma = (x - x0)/sigma (k_diffusion sample_euler, s_churn 0)."""
    sigmas, host, pace = sigmas.to(x.device), sigmas.cpu(), StepPace(x.device)
    total = len(sigmas) - 1
    for i in range(total):
        before_step(i, total, should_stop)
        x0 = denoiser(x, host[i])
        d = (x - x0) / sigmas[i]
        x = x + d * (sigmas[i + 1] - sigmas[i])
        pace.queued()
        if callback is not None:
            callback(i + 1, total, x, x0)
    return x


def sample_res_multistep(denoiser: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, callback=None,
                         should_stop=None) -> torch.Tensor:
    """Second-order multistep exponential integrator (arXiv 2308.02157), ComfyUI k_diffusion res_multistep
    at eta 0: Euler on the first step and on any step to sigma 0, else with lambda = -log(sigma), h its step,
    c2 = (lambda_prev - lambda)/h, phi1(z) = expm1(z)/z, phi2(z) = (phi1 - 1)/z at z = -h:
    x' = e^-h x + h*((phi1 - phi2/c2) x0 + (phi2/c2) x0_prev). At eta 0 ComfyUI adds noise times 0, which
    we skip."""
    sigmas, host, pace = sigmas.to(x.device), sigmas.cpu(), StepPace(x.device)
    total = len(sigmas) - 1
    x0_prev = None
    for i in range(total):
        before_step(i, total, should_stop)
        x0 = denoiser(x, host[i])
        if host[i + 1] == 0 or x0_prev is None:
            d = (x - x0) / sigmas[i]
            x = x + d * (sigmas[i + 1] - sigmas[i])
        else:
            lam, lam_next, lam_prev = (s.log().neg() for s in (sigmas[i], sigmas[i + 1], sigmas[i - 1]))
            h = lam_next - lam
            c2 = (lam_prev - lam) / h
            z = h.neg()
            phi1 = torch.expm1(z) / z
            phi2 = (phi1 - 1.0) / z
            b1 = torch.nan_to_num(phi1 - phi2 / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2 / c2, nan=0.0)
            x = h.neg().exp() * x + h * (b1 * x0 + b2 * x0_prev)
        x0_prev = x0
        pace.queued()
        if callback is not None:
            callback(i + 1, total, x, x0)
    return x


SAMPLERS = {"euler": sample_euler, "res_multistep": sample_res_multistep}


def cfg_denoiser(model: Callable, cfg: float, positive, negative=None) -> Denoiser:
    """denoiser(x, sigma) from model(x, sigma, cond) -> x0 with classifier-free guidance on x0, as ComfyUI's
    sampling_function/cfg_function: at cfg ~ 1 (math.isclose) one positive pass, uncond taken as 0, so
    x0 = x0_pos*cfg; else x0 = x0_neg + (x0_pos - x0_neg)*cfg."""
    if math.isclose(cfg, 1.0):
        return lambda x, sigma: model(x, sigma, positive) * cfg
    if negative is None:
        raise ValueError(f"cfg {cfg} needs a negative conditioning (or set cfg to 1.0)")

    def denoise(x, sigma):
        x0_pos = model(x, sigma, positive)
        x0_neg = model(x, sigma, negative)
        return x0_neg + (x0_pos - x0_neg) * cfg
    return denoise


def run_copy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """t's copy on device for one sampler run, made outside inference mode: a graphed step's KeptRows
    (dit_core/gpu/step_graph.py) knows it and its views by their base and version counter. An inference tensor (what
    every ComfyUI node makes) has neither, so KeptRows compares its values each step, which reads the GPU back: the
    step queued ahead (StepPace) waited for the one before (the Z-Image server's sampler, 104 of 146 samples)."""
    with torch.inference_mode(False):
        return t.to(device, copy=True)


def model_on_device(denoised: Callable, device: torch.device, check: Callable[[], None] | None = None,
                    step: Callable | None = None) -> Callable:
    """ksample's model(x, sigma, cond) as a sampler node runs it (the node path, which the benchmarks time too):
    denoised(x, sigma, cond, check, step) on `device`, x0 back where x is (the nodes sample on the model's device,
    so nothing moves a step). Each conditioning tensor is copied there once a sampler run (run_copy): the same device
    tensor every step lets a graphed step keep the rows it makes from it (step_graph.KeptRows)."""
    copies = {}  # id -> (conditioning, its copy on the device); the conditioning is held so its id stays its own

    def model(x: torch.Tensor, sigma, cond: torch.Tensor) -> torch.Tensor:
        if id(cond) not in copies:
            copies[id(cond)] = (cond, run_copy(cond, device))
        return denoised(x.to(device), float(sigma), copies[id(cond)][1], check, step).to(x.device)

    return model


def ksample(model: Callable, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
            latent_image: torch.Tensor, positive=None, negative=None, denoise: float = 1.0,
            shift: float | None = None, multiplier: float = 1.0, batch_index: Sequence[int] | None = None,
            callback=None, should_stop=None, *, latent_shift, latent_scale, latent_channels: int | None = None,
            sigma_table: torch.Tensor | None = None) -> torch.Tensor:
    """ComfyUI's KSampler node on a flow model (ModelSamplingAuraFlow at multiplier 1.0, SD3 at 1000; sigma_table:
    another model sampling's table, ModelSamplingFlux's for Krea 2, schedules.flux_sigma_table): raw latent in, raw
    latent out (latent_shift and latent_scale, the family's latent format: numbers, or per-channel tensors that
    broadcast over it; shift: the flow shift of ModelSamplingAuraFlow's table, when no sigma_table is given). `model` is
    model(x, sigma, cond) -> x0 when `positive` is given, else a denoiser(x, sigma) -> x0 (then cfg must be 1). An
    all-zero latent with other than `latent_channels` channels is widened to them (comfy/sample.py
    fix_empty_latent_channels: a stock 4-channel Empty Latent Image on a 16-channel model). Raises SamplingCancelled
    when should_stop() turns true between steps."""
    if sampler_name not in SAMPLERS:
        raise ValueError(f"unknown sampler_name {sampler_name!r}; supported: {', '.join(SAMPLERS)}")
    if shift is None and sigma_table is None:
        raise ValueError("ksample: a flow shift or a sigma_table is needed (the family's model sampling)")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; supported: {', '.join(SCHEDULERS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not math.isfinite(cfg):
        raise ValueError(f"cfg must be a finite number, got {cfg}")
    if not 0.0 <= denoise <= 1.0:
        raise ValueError(f"denoise must be in [0, 1], got {denoise}")
    if not (isinstance(latent_image, torch.Tensor) and latent_image.is_floating_point()
            and latent_image.ndim >= 3):
        raise ValueError("latent_image must be a floating-point tensor [B, C, ...]")
    if positive is None:
        if not math.isclose(cfg, 1.0):
            raise ValueError(f"cfg {cfg} needs positive and negative conditioning; "
                             "a bare denoiser runs at cfg 1")
        denoiser = model
    else:
        denoiser = cfg_denoiser(model, cfg, positive, negative)

    if latent_channels is not None and latent_image.shape[1] != latent_channels \
            and torch.count_nonzero(latent_image) == 0:
        b, _, *rest = latent_image.shape
        latent_image = latent_image.new_zeros([b, latent_channels, *rest])
    sigmas = ksampler_sigmas(scheduler, steps, denoise, shift, multiplier, sigma_table)
    if len(sigmas) == 0:  # CFGGuider.sample returns the latent untouched when there is nothing to do
        return latent_image
    noise = prepare_noise(latent_image, seed, batch_index).to(latent_image.device)
    # CFGGuider.inner_sample: an all-zero (empty) latent is not shifted into the model's space.
    latent = latent_image
    if torch.count_nonzero(latent) > 0:
        latent = process_in(latent, latent_shift, latent_scale)
    x = noise_scaling(sigmas[0], noise, latent)
    x = SAMPLERS[sampler_name](denoiser, x, sigmas, callback=callback, should_stop=should_stop)
    x = inverse_noise_scaling(sigmas[-1], x)
    return process_out(x.to(torch.float32), latent_shift, latent_scale)
