"""dit_core/sampling/ksampler.py and schedules.py against ComfyUI v0.3.75 in-process: noise, sigmas, samplers, CFG,
KSampler."""
import math

import pytest
import torch
from conftest import rel_err

from dit_core.codecs.flux1_vae import SCALING, SHIFT
from dit_core.sampling import ksampler as sampling
from dit_core.sampling import schedules

SCHEDULERS = list(schedules.SCHEDULERS)


def comfy_flow_sampling(comfy, shift=3.0, multiplier=1.0):
    """ComfyUI's model sampling of ModelSamplingAuraFlow (multiplier 1.0) / ModelSamplingSD3 (1000)."""
    class Config:
        sampling_settings = {"shift": shift, "multiplier": multiplier}

    class FlowSampling(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass
    return FlowSampling(Config())


class StubPatcher:
    """The one thing KSampler.__init__ asks of a model: its model_sampling object."""

    def __init__(self, ms):
        self.ms = ms

    def get_model_object(self, name):
        return {"model_sampling": self.ms}[name]


class TinyFlowNet(torch.nn.Module):
    """A small fixed nonlinear velocity net v(x, sigma, context), row-independent so that ComfyUI may batch
    cond and uncond together."""

    def __init__(self, channels=4, ctx_dim=8, device=None, operations=None, **kwargs):
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.conv1 = torch.nn.Conv2d(channels, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, channels, 3, padding=1)
        self.ctx = torch.nn.Linear(ctx_dim, 16)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3
        self.dtype = torch.float32

    def forward(self, x, timesteps, context=None, **kwargs):
        t = timesteps.reshape(-1, 1, 1, 1).float()
        h = self.conv1(x) * (1.0 + t)
        if context is not None:
            h = h + self.ctx(context.mean(dim=1))[:, :, None, None]
        return self.conv2(torch.nn.functional.silu(h)) + torch.sin(3.0 * t) * x


def flow_x0(net):
    """model(x, sigma, cond) -> x0 of a CONST flow model, x0 = x - v*sigma (CONST.calculate_denoised)."""
    def model(x, sigma, cond):
        s = torch.as_tensor(sigma, dtype=torch.float32).reshape(())
        ctx = None if cond is None else cond.expand(x.shape[0], -1, -1)
        return x - net(x, s.expand(x.shape[0]), context=ctx) * s
    return model


# --- noise --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 + 7, 0xFFFFFFFFFFFFFFFF])
@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (3, 4, 5, 7), (2, 16, 1, 6, 6)])
def test_noise_equals_comfy(comfy, seed, shape):
    latent = torch.zeros(shape)
    state = torch.get_rng_state()
    ours = sampling.prepare_noise(latent, seed)
    assert torch.equal(torch.get_rng_state(), state), "prepare_noise must leave the global RNG alone"
    assert torch.equal(ours, comfy.sample.prepare_noise(latent, seed))


@pytest.mark.parametrize("batch_index", [[0, 1, 2], [2, 0, 5], [3], [1, 1, 4, 0]])
def test_noise_batch_index_equals_comfy(comfy, batch_index):
    latent = torch.zeros(len(batch_index), 16, 6, 5)
    ours = sampling.prepare_noise(latent, 123, batch_index)
    assert torch.equal(ours, comfy.sample.prepare_noise(latent, 123, batch_index))


@pytest.mark.parametrize("batch_index", [None, [1, 0]])
def test_noise_of_a_latent_in_parts_equals_comfy(comfy, batch_index):
    """A latent in parts (ComfyUI's NestedTensor: video, then audio): each part drawn in order from one generator."""
    from comfy.nested_tensor import NestedTensor
    video, audio = torch.zeros(2, 16, 3, 4, 6), torch.zeros(2, 8, 5, 16)
    ours = sampling.prepare_noise_parts([video, audio], 99, batch_index)
    theirs = comfy.sample.prepare_noise(NestedTensor([video, audio]), 99, batch_index).tensors
    assert len(ours) == 2 and all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert torch.equal(ours[0], sampling.prepare_noise(video, 99, batch_index))  # the video part comes first


def test_noise_bad_batch_index():
    with pytest.raises(ValueError, match="batch_index"):
        sampling.prepare_noise(torch.zeros(2, 4, 4, 4), 0, [0, -1])
    with pytest.raises(ValueError, match="batch_index"):
        sampling.prepare_noise(torch.zeros(2, 4, 4, 4), 0, [0])


# --- sigmas -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shift,multiplier", [(3.0, 1.0), (1.0, 1.0), (6.0, 1.0), (3.0, 1000), (1.73, 1000)])
def test_flow_table_equals_comfy(comfy, shift, multiplier):
    theirs = comfy_flow_sampling(comfy, shift, multiplier).sigmas
    assert torch.equal(schedules.flow_sigma_table(shift, multiplier), theirs)


@pytest.mark.parametrize("mu", [1.15, 0.5])
def test_flux_table_equals_comfy(comfy, mu):
    """ModelSamplingFlux's table (Krea 2: mu 1.15) bit for bit, and its schedulers on it."""
    ms = comfy.model_sampling.ModelSamplingFlux()
    ms.set_parameters(shift=mu)
    table = schedules.flux_sigma_table(mu)
    assert torch.equal(table, ms.sigmas)
    for scheduler in ("simple", "beta", "karras", "exponential", "ddim_uniform", "linear_quadratic", "kl_optimal"):
        ours = schedules.ksampler_sigmas(scheduler, 8, table=table)
        assert torch.equal(ours, comfy.samplers.calculate_sigmas(ms, scheduler, 8)), scheduler


def test_flux_table_gives_the_krea2_grid():
    """reference/families/krea2.md section 4: simple at 8 steps on mu 1.15 is diffusers' Turbo grid; normal and
    sgm_uniform read the discrete flow's sigma(t), so they refuse another table."""
    ours = schedules.calculate_sigmas("simple", 8, table=schedules.flux_sigma_table(1.15))
    expected = torch.tensor([1, .9567, .9045, .8403, .7595, .6546, .5128, .3109, 0])
    assert torch.allclose(ours, expected, atol=6e-5)
    with pytest.raises(ValueError, match="not supported on this model's sigma table"):
        schedules.calculate_sigmas("normal", 8, table=schedules.flux_sigma_table(1.15))


def test_simple_8_steps_shift3(comfy):
    ours = schedules.calculate_sigmas("simple", 8, shift=3.0)
    assert torch.equal(ours, comfy.samplers.calculate_sigmas(comfy_flow_sampling(comfy), "simple", 8))
    # reference/families/z_image.md section 7: the diffusers grid [1, .9545, .9, .8333, .75, .6429, .5, .3, 0]
    expected = torch.tensor([1, 21 / 22, 0.9, 5 / 6, 0.75, 9 / 14, 0.5, 0.3, 0])
    assert torch.allclose(ours, expected, atol=1e-6)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("steps", [1, 2, 7, 8, 25, 30])
@pytest.mark.parametrize("shift,multiplier", [(3.0, 1.0), (3.0, 1000)])
def test_schedulers_equal_comfy(comfy, scheduler, steps, shift, multiplier):
    ms = comfy_flow_sampling(comfy, shift, multiplier)
    if scheduler == "kl_optimal" and steps == 1:
        with pytest.raises(ValueError, match="kl_optimal"):
            schedules.calculate_sigmas(scheduler, steps, shift, multiplier)
        return
    ours = schedules.calculate_sigmas(scheduler, steps, shift, multiplier)
    theirs = comfy.samplers.calculate_sigmas(ms, scheduler, steps)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (ours, theirs)


def test_scheduler_names_cover_comfy(comfy):
    assert set(schedules.SCHEDULERS) == set(comfy.samplers.SCHEDULER_NAMES)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("steps,denoise",
                         [(8, 1.0), (8, 0.5), (8, 0.75), (5, 0.33), (20, 0.6), (4, 0.0), (4, -1.0)])
def test_denoise_sigmas_equal_comfy_ksampler(comfy, scheduler, steps, denoise):
    ms = comfy_flow_sampling(comfy)
    ks = comfy.samplers.KSampler(StubPatcher(ms), steps=steps, device="cpu", sampler="euler",
                                 scheduler=scheduler, denoise=denoise)
    ours = schedules.ksampler_sigmas(scheduler, steps, denoise, shift=3.0)
    assert torch.equal(ours, ks.sigmas)


def test_calculate_sigmas_errors():
    with pytest.raises(ValueError, match="unknown scheduler 'nope'.*simple"):
        schedules.calculate_sigmas("nope", 8)
    with pytest.raises(ValueError, match="steps"):
        schedules.calculate_sigmas("simple", 0)
    with pytest.raises(ValueError, match="shift"):
        schedules.calculate_sigmas("simple", 8, shift=0.0)


# --- samplers -----------------------------------------------------------------------------------------------

def k_model(denoiser):
    """Our denoiser(x, sigma) as k-diffusion calls a model: model(x, sigma_batch, **extra_args)."""
    return lambda x, sigma, **extra: denoiser(x, sigma[0])


@pytest.mark.parametrize("name,comfy_fn",
                         [("euler", "sample_euler"), ("res_multistep", "sample_res_multistep")])
@pytest.mark.parametrize("scheduler,steps", [("simple", 8), ("beta", 9), ("karras", 6), ("ddim_uniform", 7)])
def test_sampler_equals_comfy(comfy, name, comfy_fn, scheduler, steps):
    net = TinyFlowNet()
    cond = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(5))
    denoiser = sampling.cfg_denoiser(flow_x0(net), 1.0, cond)
    sigmas = schedules.calculate_sigmas(scheduler, steps)
    x = torch.randn(2, 4, 6, 5, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ours = sampling.SAMPLERS[name](denoiser, x, sigmas)
        comfy_sampler = getattr(comfy.k_diffusion.sampling, comfy_fn)
        theirs = comfy_sampler(k_model(denoiser), x, sigmas, extra_args={"seed": 3}, disable=True)
    # The same fp32 operations in the same order as k-diffusion: bitwise equal, stricter than the 1e-6 asked.
    assert torch.equal(ours, theirs), rel_err(ours, theirs)
    assert rel_err(ours, x) > 1e-2  # the run did something


@pytest.mark.parametrize("cfg", [1.0, 1.0000000001, 4.0, 0.5])
def test_cfg_equals_comfy_cfg_function(comfy, cfg):
    g = torch.Generator().manual_seed(0)
    x, pos, neg = (torch.randn(2, 4, 3, 3, generator=g) for _ in range(3))
    model = lambda x_, sigma, cond: x_ * 0.5 + cond
    ours = sampling.cfg_denoiser(model, cfg, pos, neg)(x, torch.tensor(0.7))
    x0_pos, x0_neg = model(x, 0.7, pos), model(x, 0.7, neg)
    if math.isclose(cfg, 1.0):
        x0_neg = torch.zeros_like(x)  # ComfyUI skips the uncond pass; calc_cond_batch leaves zeros for it
    assert torch.equal(ours, comfy.samplers.cfg_function(None, x0_pos, x0_neg, cfg, x, 0.7))


def test_cfg_one_is_a_single_pass():
    calls = []
    model = lambda x, sigma, cond: calls.append(cond) or x
    sampling.cfg_denoiser(model, 1.0, "pos", "neg")(torch.zeros(1), torch.tensor(1.0))
    assert calls == ["pos"]
    with pytest.raises(ValueError, match="negative"):
        sampling.cfg_denoiser(model, 3.0, "pos", None)


@pytest.mark.parametrize("name", list(sampling.SAMPLERS))
def test_cancel_stops_after_the_right_step(name):
    calls, seen = [], []
    denoiser = lambda x, sigma: calls.append(float(sigma)) or x * 0.5
    sigmas = schedules.calculate_sigmas("simple", 8)
    with pytest.raises(sampling.SamplingCancelled) as info:
        sampling.SAMPLERS[name](denoiser, torch.ones(1, 2, 2, 2), sigmas,
                                callback=lambda step, total, x, x0: seen.append((step, total)),
                                should_stop=lambda: len(seen) >= 3)
    assert info.value.steps_done == 3 and info.value.total == 8
    assert len(calls) == 3 and seen == [(1, 8), (2, 8), (3, 8)]


def test_callback_raising_stops_sampling():
    def callback(step, total, x, x0):
        if step == 2:
            raise sampling.SamplingCancelled(step, total)
    calls = []
    with pytest.raises(sampling.SamplingCancelled):
        sampling.sample_euler(lambda x, s: calls.append(s) or x, torch.ones(1, 1, 1, 1),
                              schedules.calculate_sigmas("simple", 8), callback=callback)
    assert len(calls) == 2


# --- start formula, latent format, KSampler -----------------------------------------------------------------

def test_noise_start_and_latent_format(comfy):
    g = torch.Generator().manual_seed(1)
    noise, latent = torch.randn(2, 16, 4, 4, generator=g), torch.randn(2, 16, 4, 4, generator=g)
    ms = comfy_flow_sampling(comfy)
    for sigma in (torch.tensor(1.0), torch.tensor(0.6429)):
        ours = sampling.noise_scaling(sigma, noise, latent)
        assert torch.equal(ours, ms.noise_scaling(sigma, noise, latent))
    assert torch.equal(sampling.noise_scaling(torch.tensor(1.0), noise, latent), noise)
    for sigma in (torch.tensor(0.0), torch.tensor(0.3)):
        ours = sampling.inverse_noise_scaling(sigma, latent)
        assert torch.equal(ours, ms.inverse_noise_scaling(sigma, latent))
    flux = comfy.latent_formats.Flux()
    assert torch.equal(sampling.process_in(latent, SHIFT, SCALING), flux.process_in(latent))
    assert torch.equal(sampling.process_out(latent, SHIFT, SCALING), flux.process_out(latent))


def comfy_tiny_model(comfy, net, shift=3.0):
    """A real ComfyUI ModelPatcher around a BaseModel (FLOW, Flux latent format, AuraFlow-style sampling)."""
    import comfy.latent_formats
    import comfy.model_base
    import comfy.model_patcher
    import comfy.ops
    import comfy.supported_models_base

    class TinyConfig(comfy.supported_models_base.BASE):
        unet_config = {}
        sampling_settings = {"shift": shift, "multiplier": 1.0}
        latent_format = comfy.latent_formats.Flux
        custom_operations = comfy.ops.disable_weight_init

    base = comfy.model_base.BaseModel(TinyConfig({}), model_type=comfy.model_base.ModelType.FLOW,
                                      device="cpu", unet_model=lambda **kw: net)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(base, load_device=cpu, offload_device=cpu)


@pytest.mark.parametrize("sampler_name,scheduler,steps,cfg,denoise,init", [
    ("res_multistep", "simple", 8, 1.0, 1.0, "empty"),
    ("euler", "simple", 6, 3.5, 1.0, "empty"),
    ("res_multistep", "beta", 7, 4.0, 0.6, "image"),
    ("euler", "normal", 5, 1.0, 0.8, "image"),
    # an empty latent is not process_in-shifted (which matters at denoise < 1 only)
    ("euler", "simple", 6, 2.0, 0.5, "empty"),
])
def test_ksample_equals_comfy_ksampler(comfy, sampler_name, scheduler, steps, cfg, denoise, init):
    net = TinyFlowNet()
    g = torch.Generator().manual_seed(11)
    pos, neg = torch.randn(1, 3, 8, generator=g), torch.randn(1, 3, 8, generator=g)
    latent = torch.zeros(2, 4, 6, 5) if init == "empty" else torch.randn(2, 4, 6, 5, generator=g)
    seed = 77
    with torch.no_grad():
        ours = sampling.ksample(flow_x0(net), seed, steps, cfg, sampler_name, scheduler, latent, positive=pos,
                                negative=neg, denoise=denoise, shift=3.0, latent_shift=SHIFT, latent_scale=SCALING)
        patcher = comfy_tiny_model(comfy, net)
        noise = comfy.sample.prepare_noise(latent, seed)
        theirs = comfy.sample.sample(patcher, noise, steps, cfg, sampler_name, scheduler, [[pos, {}]],
                                     [[neg, {}]], latent, denoise=denoise, disable_pbar=True, seed=seed)
    # f32 roundoff only: the same math in another order; 1e-6 held on one CPU and not on another (1.2e-6).
    assert rel_err(ours, theirs) <= 1e-5


def test_ksample_widens_an_empty_latent(comfy):
    class Stub:
        def get_model_object(self, name):
            return {"latent_format": comfy.latent_formats.Flux()}[name]
    empty4 = torch.zeros(2, 4, 3, 3)
    widened = comfy.sample.fix_empty_latent_channels(Stub(), empty4)
    denoiser = lambda x, s: x * 0.25
    flux = {"shift": 3.0, "latent_shift": SHIFT, "latent_scale": SCALING}
    ours = sampling.ksample(denoiser, 5, 3, 1.0, "euler", "simple", empty4, latent_channels=16, **flux)
    assert ours.shape == widened.shape == (2, 16, 3, 3)
    assert torch.equal(ours, sampling.ksample(denoiser, 5, 3, 1.0, "euler", "simple", widened, **flux))


def test_ksample_denoiser_and_zero_denoise():
    latent = torch.randn(1, 4, 3, 3)
    flux = {"shift": 3.0, "latent_shift": SHIFT, "latent_scale": SCALING}
    assert sampling.ksample(lambda x, s: x, 0, 4, 1.0, "euler", "simple", latent, denoise=0.0, **flux) is latent
    out = sampling.ksample(lambda x, s: torch.zeros_like(x), 0, 4, 1.0, "euler", "simple", latent, **flux)
    # x0 = 0 in the normalized space every step: Euler lands on 0, i.e. the raw latent shift
    assert torch.allclose(out, torch.full_like(out, SHIFT), atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    ({"sampler_name": "dpmpp_2m"}, "unknown sampler_name 'dpmpp_2m'; supported: euler, res_multistep"),
    ({"scheduler": "foo"}, "unknown scheduler 'foo'"),
    ({"steps": 0}, "steps must be an integer >= 1"),
    ({"steps": 2.5}, "steps must be an integer"),
    ({"denoise": 1.5}, "denoise must be in"),
    ({"cfg": float("nan")}, "cfg must be a finite"),
    ({"cfg": 4.0}, "cfg 4.0 needs positive and negative"),
    ({"latent_image": torch.zeros(4, 4)}, "latent_image"),
])
def test_ksample_errors(kwargs, match):
    args = {"model": lambda x, s: x, "seed": 0, "steps": 4, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "simple", "latent_image": torch.zeros(1, 4, 2, 2), "shift": 3.0, "latent_shift": SHIFT,
            "latent_scale": SCALING}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sampling.ksample(**args)


def test_latent_format_tensors_follow_the_latent_device():
    """Krea 2's per-channel shift and scale live on the host while the sampler's latent is on the card (meta stands
    for the card here): the latent format moves them, as a server run on the GPU needs."""
    x = torch.zeros(1, 16, 2, 2, device="meta")
    per_channel = torch.ones(1, 16, 1, 1)
    assert sampling.process_out(x, per_channel, per_channel).device == x.device
    assert sampling.process_in(x, per_channel, per_channel).device == x.device
