"""Sigma schedules of flow models as ComfyUI v0.3.75 makes them: the shifted flow table, its schedulers, KSampler's
denoise, and FLUX.3 Klein's schedule."""
from __future__ import annotations

import math

import torch


def time_shift(shift: float, t):
    """shift*t/(1 + (shift - 1)*t), ComfyUI model_sampling.time_snr_shift (t returned as is at shift 1)."""
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


def flow_sigma_table(shift: float = 3.0, multiplier: float = 1.0, timesteps: int = 1000) -> torch.Tensor:
    """ModelSamplingDiscreteFlow's fp32 table, sigma(i/timesteps) for i = 1..timesteps. multiplier 1.0 is
    ModelSamplingAuraFlow (Z-Image), 1000 ModelSamplingSD3; the round trip t*multiplier/multiplier is kept
    because in fp32 it can move the last bit (comfy/model_sampling.py set_parameters)."""
    if not shift > 0:
        raise ValueError(f"flow_sigma_table: shift must be > 0, got {shift}")
    if not multiplier > 0:
        raise ValueError(f"flow_sigma_table: multiplier must be > 0, got {multiplier}")
    ts = (torch.arange(1, timesteps + 1, 1) / timesteps) * multiplier
    return time_shift(shift, ts / multiplier)


def flux_sigma_table(mu: float = 1.15, timesteps: int = 10000) -> torch.Tensor:
    """ModelSamplingFlux's fp32 table (Krea 2: mu 1.15), e^mu / (e^mu + 1/t - 1) at t = i/timesteps, i = 1..timesteps,
    in ComfyUI's order of operations (comfy/model_sampling.py flux_time_shift): the table time_shift(e^mu, t) is in
    exact math, off in the last bit here and there."""
    t = torch.arange(1, timesteps + 1, 1) / timesteps
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)


def klein_sigmas(steps: int = 16, shift: float = 16.0, denoise: float = 1.0) -> torch.Tensor:
    """FLUX.3 Klein's schedule: shift_S(linspace(1, 1/steps, steps)) then 0, f32. S = 16 as BFL's code and
    ComfyUI's klein workflows sample; diffusers' default is 6.93 (reference/families/flux3_klein.md
    section 7, sampling). denoise < 1 (image to image): the last steps + 1 sigmas of the schedule of int(steps
    / denoise) steps, as KSampler.set_steps takes them (ksampler_sigmas); denoise 0: no sigmas, nothing to
    do."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not shift > 0:
        raise ValueError(f"klein_sigmas: shift must be > 0, got {shift}")
    if not 0.0 <= denoise <= 1.0:
        raise ValueError(f"denoise must be in [0, 1], got {denoise}")
    if denoise <= 0.0:
        return torch.zeros(0)
    if denoise <= 0.9999:
        return klein_sigmas(int(steps / denoise), shift)[-(steps + 1):]
    s = torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float64)
    return torch.cat([time_shift(shift, s), torch.zeros(1, dtype=torch.float64)]).float()


# --- schedulers: (table, steps, shift, multiplier) -> steps + 1 sigmas ending in 0 (fp32, CPU) --------------
# Each mirrors the ComfyUI v0.3.75 comfy/samplers.py function named in its docstring, on a flow table.

def _simple(table, steps, shift, multiplier):
    """simple_scheduler: every (len/steps)-th table entry from the top."""
    stride = len(table) / steps
    return torch.FloatTensor([float(table[-(1 + int(k * stride))]) for k in range(steps)] + [0.0])


def _ddim_uniform(table, steps, shift, multiplier):
    """ddim_scheduler: table[1], table[1 + s], ... reversed (s = len // steps); the count can differ from
    steps."""
    sigs = [0.0]
    if math.isclose(float(table[1]), 0, abs_tol=0.00001):
        steps, sigs = steps + 1, []
    stride = max(len(table) // steps, 1)
    sigs += [float(table[i]) for i in range(1, len(table), stride)]
    return torch.FloatTensor(sigs[::-1])


def _normal(table, steps, shift, multiplier, sgm=False):
    """normal_scheduler (sgm_uniform with sgm=True): timesteps spaced evenly between the table's ends."""
    start, end = table[-1] * multiplier, table[0] * multiplier
    append_zero = True
    if sgm:
        ts = torch.linspace(start, end, steps + 1)[:-1]
    else:
        if math.isclose(float(time_shift(shift, end / multiplier)), 0, abs_tol=0.00001):
            steps, append_zero = steps + 1, False
        ts = torch.linspace(start, end, steps)
    sigs = [float(time_shift(shift, t / multiplier)) for t in ts]
    return torch.FloatTensor(sigs + [0.0] if append_zero else sigs)


def _beta(table, steps, shift, multiplier, alpha=0.6, beta=0.6):
    """beta_scheduler (arXiv 2407.12173): table entries at the Beta(0.6, 0.6) quantiles, repeats dropped.
    Needs scipy, as ComfyUI does (imported here only, so the rest of dit_core runs without it)."""
    import numpy
    import scipy.stats

    total = len(table) - 1
    quantiles = 1 - numpy.linspace(0, 1, steps, endpoint=False)
    ts = numpy.rint(scipy.stats.beta.ppf(quantiles, alpha, beta) * total)
    sigs, last = [], -1
    for t in ts:
        if t != last:
            sigs.append(float(table[int(t)]))
        last = t
    return torch.FloatTensor(sigs + [0.0])


def _karras(table, steps, shift, multiplier, rho=7.0):
    """k_diffusion get_sigmas_karras(n, sigma_min, sigma_max) (Karras et al. 2022, rho 7)."""
    lo, hi = float(table[0]) ** (1 / rho), float(table[-1]) ** (1 / rho)
    sigmas = (hi + torch.linspace(0, 1, steps) * (lo - hi)) ** rho
    return torch.cat([sigmas, sigmas.new_zeros([1])])


def _exponential(table, steps, shift, multiplier):
    """k_diffusion get_sigmas_exponential: evenly spaced in log sigma."""
    sigmas = torch.linspace(math.log(float(table[-1])), math.log(float(table[0])), steps).exp()
    return torch.cat([sigmas, sigmas.new_zeros([1])])


def _linear_quadratic(table, steps, shift, multiplier, threshold_noise=0.025):
    """linear_quadratic_schedule (Mochi): linear to threshold_noise over steps//2, then quadratic; times
    sigma_max."""
    if steps == 1:
        sched = [1.0, 0.0]
    else:
        lin = steps // 2
        quad = steps - lin
        diff = lin - threshold_noise * steps
        q_coef = diff / (lin * quad ** 2)
        l_coef = threshold_noise / lin - 2 * diff / (quad ** 2)
        const = q_coef * (lin ** 2)
        sched = [i * threshold_noise / lin for i in range(lin)]
        sched += [q_coef * (i ** 2) + l_coef * i + const for i in range(lin, steps)] + [1.0]
        sched = [1.0 - s for s in sched]
    return torch.FloatTensor(sched) * table[-1]


def _kl_optimal(table, steps, shift, multiplier):
    """kl_optimal_scheduler (AUTOMATIC1111 PR 15608): tan of evenly spaced atan(sigma). ComfyUI divides by
    steps - 1 and returns NaN for one step; we refuse instead."""
    if steps < 2:
        raise ValueError("scheduler 'kl_optimal' needs at least 2 steps (ComfyUI yields NaN sigmas for 1)")
    adj = torch.arange(steps, dtype=torch.float).div_(steps - 1)
    sigmas = adj.new_zeros(steps + 1)
    sigmas[:-1] = (adj * math.atan(float(table[0])) + (1 - adj) * math.atan(float(table[-1]))).tan_()
    return sigmas


SCHEDULERS = {
    "simple": _simple,
    "sgm_uniform": lambda table, steps, shift, multiplier: _normal(table, steps, shift, multiplier, sgm=True),
    "karras": _karras,
    "exponential": _exponential,
    "ddim_uniform": _ddim_uniform,
    "beta": _beta,
    "normal": _normal,
    "linear_quadratic": _linear_quadratic,
    "kl_optimal": _kl_optimal,
}


# The schedulers that read only the table, so they run on another model sampling's (flux_sigma_table); normal and
# sgm_uniform read the discrete flow's sigma(t) too.
TABLE_SCHEDULERS = tuple(name for name in SCHEDULERS if name not in ("normal", "sgm_uniform"))


def calculate_sigmas(scheduler: str, steps: int, shift: float = 3.0, multiplier: float = 1.0,
                     table: torch.Tensor | None = None) -> torch.Tensor:
    """Sigmas of `scheduler` for `steps` steps on a flow model (ComfyUI samplers.calculate_sigmas): on the discrete
    flow table of shift and multiplier, or on `table` (flux_sigma_table)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; supported: {', '.join(SCHEDULERS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if table is None:
        table = flow_sigma_table(shift, multiplier)
    elif scheduler not in TABLE_SCHEDULERS:
        raise ValueError(f"scheduler {scheduler!r} is not supported on this model's sigma table; use "
                         f"{', '.join(TABLE_SCHEDULERS)}")
    return SCHEDULERS[scheduler](table, steps, shift, multiplier)


def ksampler_sigmas(scheduler: str, steps: int, denoise: float = 1.0, shift: float = 3.0,
                    multiplier: float = 1.0, table: torch.Tensor | None = None) -> torch.Tensor:
    """KSampler.set_steps: for denoise < 1 the schedule of int(steps/denoise) steps, last steps + 1 kept;
    denoise <= 0 gives no sigmas (nothing to do). table: as calculate_sigmas'."""
    if denoise is None or denoise > 0.9999:
        return calculate_sigmas(scheduler, steps, shift, multiplier, table)
    if denoise <= 0.0:
        return torch.FloatTensor([])
    return calculate_sigmas(scheduler, int(steps / denoise), shift, multiplier, table)[-(steps + 1):]
