"""dit_core/sampling/minimax_h3.py vs diffusers 0.42.1 MiniMaxH3Scheduler: the two grids, ComfyUI's closed-form audio
clock, the Euler step and the two-stream loop (reference/families/minimax_h3.md sections 6 and 11)."""
import math

import pytest
import torch

from dit_core.sampling.ksampler import SamplingCancelled
from dit_core.sampling.minimax_h3 import (
    AUDIO_SHIFT,
    VIDEO_SHIFT,
    audio_sigma_of_video,
    comfy_h3_sigmas,
    data_ward_x0,
    euler_step,
    h3_sigmas,
    sample_h3,
    sample_h3_comfy,
)

pytest.importorskip("diffusers")
# The scheduler module imports without the MiniMaxH3LoraLoaderMixin stub (it needs no loaders).
from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler

EPS = torch.finfo(torch.float32).eps
STEPS = [1, 2, 6, 8, 20, 30, 50, 100, 1000]


def scheduler(shift, steps):
    """diffusers counts grid points (terminal 0 included): steps forwards are num_inference_steps = steps + 1."""
    s = MiniMaxH3Scheduler(shift=shift)
    s.set_timesteps(steps + 1)
    return s


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("shift", [VIDEO_SHIFT, AUDIO_SHIFT, 10.0, 1.0])
def test_grid_matches_scheduler(steps, shift):
    ref = scheduler(shift, steps)
    ours = h3_sigmas(steps, shift)
    assert ours.dtype == torch.float32 and len(ours) == steps + 1 and ours[-1] == 0
    assert torch.equal(ours, ref.sigmas)  # bit for bit
    assert torch.equal(1 - ours[:-1], ref.timesteps)  # the model times it exposes, t = 1 - sigma
    assert ref.num_inference_steps == steps  # its count of forwards


def test_reference_values_n7():
    """Section 6's N = 7 grids (6 forwards), to the six places printed there."""
    video = [1, .983607, .96, .923077, .857143, .705882, 0]
    audio = [1, .9375, .857143, .75, .6, .375, 0]
    assert torch.allclose(h3_sigmas(6, VIDEO_SHIFT), torch.tensor(video), rtol=0, atol=5e-7)
    assert torch.allclose(h3_sigmas(6, AUDIO_SHIFT), torch.tensor(audio), rtol=0, atol=5e-7)


@pytest.mark.parametrize("steps", STEPS)
def test_closed_form_clock_is_the_audio_grid(steps):
    """ComfyUI's audio clock on the video grid gives diffusers' audio grid point for point, up to f32 rounding:
    measured within 3.4 eps relative up to 100 steps, 4.9 eps at 1000; exact at 0 and 1. Both sides round: the
    f32 video points (their error grows up to 4x through the clock near 1, d sigma_a/d sigma_v = 12 * 1/3 at 1) and
    the audio grid's own linspace and shift."""
    video = scheduler(VIDEO_SHIFT, steps).sigmas
    audio = scheduler(AUDIO_SHIFT, steps).sigmas
    clock = audio_sigma_of_video(video, VIDEO_SHIFT, AUDIO_SHIFT)
    assert clock.dtype == torch.float32 and clock.shape == audio.shape
    assert clock[0] == 1 and clock[-1] == 0
    assert ((clock - audio).abs() <= 6 * EPS * audio).all()
    # as a float per step (how ComfyUI's model receives sigma_v) too
    for v, a in zip(video.tolist(), audio.tolist()):
        assert abs(audio_sigma_of_video(v, VIDEO_SHIFT, AUDIO_SHIFT) - a) <= 6 * EPS * a


def test_closed_form_clock_general_shifts():
    """General in the two shifts (FastH3's MiniMaxH3SigmaShift(10, 3)); equal shifts give the identity."""
    steps = 8
    clock = audio_sigma_of_video(h3_sigmas(steps, 10.0), 10.0, AUDIO_SHIFT)
    assert ((clock - h3_sigmas(steps, AUDIO_SHIFT)).abs() <= 6 * EPS).all()
    v = h3_sigmas(steps, VIDEO_SHIFT)
    assert ((audio_sigma_of_video(v, VIDEO_SHIFT, VIDEO_SHIFT) - v).abs() <= 2 * EPS).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_euler_step_matches_scheduler_step(dtype):
    """One step of each stream, every step of a 6-step grid, vs scheduler.step() on the same velocity: bit for bit
    with x0 as diffusers forms it (data_ward_x0); half-precision samples blended in f32 as it does."""
    gen = torch.Generator().manual_seed(0)
    for shift, shape in ((VIDEO_SHIFT, (12, 16)), (AUDIO_SHIFT, (10, 8))):
        ref = scheduler(shift, 6)
        sigmas = h3_sigmas(6, shift)
        for i, t in enumerate(ref.timesteps):
            x = torch.randn(shape, generator=gen).to(dtype)
            v = torch.randn(shape, generator=gen)
            want = ref.step(v, t, x, return_dict=False)[0]
            got = euler_step(x, data_ward_x0(x, v, sigmas[i]), sigmas[i], sigmas[i + 1])
            assert got.dtype == dtype
            assert torch.equal(got, want), (shift, i)


def test_data_ward_x0_vs_grid_sigma():
    """x0 from the grid's sigma (the family's denoised) differs from diffusers' time-read sigma only in the last
    bit of sigma."""
    x, v = torch.randn(64), torch.randn(64)
    for s in h3_sigmas(20, AUDIO_SHIFT)[:-1]:
        assert (data_ward_x0(x, v, s) - (x + float(s) * v)).abs().max() <= 4 * EPS * (x.abs() + v.abs()).max()


class StandIn:
    """A fixed nonlinear data-ward velocity per stream, v(x, t) with t = 1 - sigma, each stream reading the other
    (as the joint transformer does)."""

    def __init__(self, cv, ca, seed=1):
        gen = torch.Generator().manual_seed(seed)
        self.wv = torch.randn(cv, cv, generator=gen) / cv ** 0.5
        self.wa = torch.randn(ca, ca, generator=gen) / ca ** 0.5
        self.calls = []

    def velocity(self, video, audio, t_video, t_audio):
        self.calls.append((float(t_video), float(t_audio)))
        v = torch.tanh(video @ self.wv + t_video) + 0.1 * audio.mean()
        a = torch.tanh(audio @ self.wa - t_audio) + 0.1 * video.mean()
        return v, a


def diffusers_loop(model, video, audio, steps, kv, ka):
    """diffusers' modular denoise loop (MiniMaxH3DenoiseStep): two schedulers zipped, one forward a step, each
    stream's target rows stepped by its own scheduler, condition rows untouched."""
    sv, sa = scheduler(VIDEO_SHIFT, steps), scheduler(AUDIO_SHIFT, steps)
    video, audio = video.clone(), audio.clone()
    for i, t in enumerate(sv.timesteps):
        v, a = model.velocity(video, audio, t, sa.timesteps[i])
        video[kv:] = sv.step(v[kv:].float(), t, video[kv:], return_dict=False)[0]
        audio[ka:] = sa.step(a[ka:].float(), sa.timesteps[i], audio[ka:], return_dict=False)[0]
    return video, audio


def our_denoised(model, x0=data_ward_x0):
    def denoised(video, audio, sigma_v, sigma_a):
        # the model times as the family's row_times forms them: 1 - sigma in f32
        t_v, t_a = 1 - torch.tensor(sigma_v), 1 - torch.tensor(sigma_a)
        v, a = model.velocity(video, audio, t_v, t_a)
        return x0(video, v, sigma_v), x0(audio, a, sigma_a)
    return denoised


def start(kv=3, ka=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(kv + 20, 16, generator=gen), torch.randn(ka + 10, 8, generator=gen)


@pytest.mark.parametrize("steps", [1, 6, 20])
def test_loop_matches_diffusers_loop(steps):
    kv, ka = 3, 2
    video, audio = start(kv, ka)
    ref_model, model = StandIn(16, 8), StandIn(16, 8)
    want = diffusers_loop(ref_model, video, audio, steps, kv, ka)
    seen = []
    got = sample_h3(our_denoised(model), video, audio, h3_sigmas(steps, VIDEO_SHIFT), h3_sigmas(steps, AUDIO_SHIFT),
                    kv, ka, callback=lambda i, n, x, x0: seen.append((i, n)))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # bit for bit
    assert model.calls == ref_model.calls  # the same model times, step by step
    assert seen == [(i + 1, steps) for i in range(steps)]
    assert torch.equal(got[0][:kv], video[:kv]) and torch.equal(got[1][:ka], audio[:ka])  # conditions kept
    assert not torch.equal(got[0][kv:], video[kv:])
    # x0 from the grid's sigma (as the family's denoised forms it): within f32 rounding of diffusers (measured
    # 2.4e-7 at 20 steps, 0 below)
    plain = sample_h3(our_denoised(StandIn(16, 8), lambda x, v, s: x + s * v), video, audio,
                      h3_sigmas(steps, VIDEO_SHIFT), h3_sigmas(steps, AUDIO_SHIFT), kv, ka)
    for p, w in zip(plain, want):
        assert (p - w).abs().max() <= 1e-6


def test_loop_on_comfy_clock():
    """The audio grid from ComfyUI's closed-form clock: the same walk up to f32 rounding (measured 8.3e-7 at 8
    steps, 1.4e-6 at 20)."""
    steps, kv, ka = 8, 3, 2
    video, audio = start(kv, ka)
    want = diffusers_loop(StandIn(16, 8), video, audio, steps, kv, ka)
    sv = h3_sigmas(steps, VIDEO_SHIFT)
    got = sample_h3(our_denoised(StandIn(16, 8)), video, audio, sv,
                    audio_sigma_of_video(sv, VIDEO_SHIFT, AUDIO_SHIFT), kv, ka)
    for g, w in zip(got, want):
        assert (g - w).abs().max() <= 5e-6


def test_loop_stops_and_refuses():
    video, audio = start()
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(SamplingCancelled) as err:
        sample_h3(our_denoised(StandIn(16, 8)), video, audio, h3_sigmas(6, VIDEO_SHIFT), h3_sigmas(6, AUDIO_SHIFT),
                  should_stop=should_stop)
    assert (err.value.steps_done, err.value.total) == (2, 6)
    with pytest.raises(ValueError, match="same number of steps"):
        sample_h3(our_denoised(StandIn(16, 8)), video, audio, h3_sigmas(6, VIDEO_SHIFT), h3_sigmas(5, AUDIO_SHIFT))
    with pytest.raises(ValueError, match="steps must be"):
        h3_sigmas(0, VIDEO_SHIFT)


# --- ComfyUI's way: one sampler on the video grid, the audio carried on it (ModelSamplingAV) ----------------------

def comfy_av_model(model, video_shape, audio_shape, k):
    """The model as ComfyUI's sampler calls it on H3's packed state (reference section 6, comfy/ldm/minimax/model.py
    forward and ModelSamplingAV's CONST denoised): the carried audio y turned back into x_a = y sigma_a/sigma_v,
    noise-ward outputs (-v), the audio output turned into the carried variable's derivative (1 - k) x_a +
    (1 + (k - 1) sigma_a) out_a, then denoised = x - sigma_v out."""
    split = math.prod(video_shape)

    def call(x, sigma, **extra):
        sv = sigma.flatten()[0].float().clamp(min=1e-6)
        sa = audio_sigma_of_video(sv, VIDEO_SHIFT, AUDIO_SHIFT)
        video, y = x[:split].view(video_shape), x[split:].view(audio_shape)
        x_a = y * (sa / sv)
        v, a = model.velocity(video, x_a, 1 - sv, 1 - sa)
        out_a = (1 - k) * x_a + (1 + (k - 1) * sa) * -a
        return x - sv * torch.cat((-v.reshape(-1), out_a.reshape(-1)))
    return call


@pytest.mark.parametrize("name", ["euler", "res_multistep"])
@pytest.mark.parametrize("scheduler,steps", [("simple", 1), ("simple", 4), ("simple", 20), ("ddim_uniform", 6),
                                             ("beta", 6)])
def test_comfy_way_equals_comfy_samplers(comfy, name, scheduler, steps):
    """sample_h3_comfy against ComfyUI v0.3.75's own k-diffusion sampler run on the carried state with the model
    conversion written as ComfyUI's H3 model does it (measured <= 3.8e-7 relative apart at 20 steps: the carried x0
    is formed as k x0_a here, through the derivative there)."""
    video, audio = start(0, 0)
    k = VIDEO_SHIFT / AUDIO_SHIFT
    sigmas = comfy_h3_sigmas(scheduler, steps)
    x = torch.cat((video.reshape(-1), audio.reshape(-1))) * sigmas[0]  # CONST noise scaling, empty latent
    sampler = getattr(comfy.k_diffusion.sampling, f"sample_{name}")
    want = sampler(comfy_av_model(StandIn(16, 8), video.shape, audio.shape, k), x, sigmas, extra_args={},
                   disable=True)
    want_video, want_audio = want[:video.numel()].view(video.shape), want[video.numel():].view(audio.shape) / k
    seen = []
    got = sample_h3_comfy(our_denoised(StandIn(16, 8), lambda x, v, s: x + s * v), video, audio, sigmas, name,
                          callback=lambda i, n, x, x0: seen.append((i, n)))
    total = len(sigmas) - 1  # ddim_uniform's grid can hold a step more than asked, as ComfyUI's does
    assert seen == [(i + 1, total) for i in range(total)]
    for g, w in zip(got, (want_video, want_audio)):
        assert (g - w).abs().max() <= 2e-6 * w.abs().max()


def test_comfy_grid_and_euler_are_diffusers_walk():
    """ComfyUI's simple grid is h3_sigmas up to f32 rounding, and Euler on the carried audio is diffusers' Euler on
    the audio's own grid (the carried stream is linear in sigma_v for a fixed x0): measured 1 eps apart on the grid,
    9.5e-7 on the result."""
    for steps in (1, 8, 20, 50):
        assert (comfy_h3_sigmas("simple", steps) - h3_sigmas(steps, VIDEO_SHIFT)).abs().max() <= EPS
    steps = 8
    video, audio = start(0, 0)
    want = diffusers_loop(StandIn(16, 8), video, audio, steps, 0, 0)
    got = sample_h3_comfy(our_denoised(StandIn(16, 8)), video, audio, comfy_h3_sigmas("simple", steps), "euler")
    for g, w in zip(got, want):
        assert (g - w).abs().max() <= 5e-6


def test_comfy_way_refuses():
    video, audio = start(0, 0)
    with pytest.raises(ValueError, match="unknown sampler_name 'dpmpp_2m'"):
        sample_h3_comfy(our_denoised(StandIn(16, 8)), video, audio, comfy_h3_sigmas("simple", 4), "dpmpp_2m")
    with pytest.raises(ValueError, match="down to 0"):
        sample_h3_comfy(our_denoised(StandIn(16, 8)), video, audio, comfy_h3_sigmas("simple", 4)[:-1], "euler")
