"""FLUX.3 Klein's sampler: ComfyUI's noise, Euler with the flow map's sigma_next, step cache, refresh."""

from dataclasses import replace

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import FLUX3_TINY, flux3_bfl_layout, random_flux3

from dit_core.families.flux3_klein import Flux3Klein
from dit_core.sampling.ksampler import SamplingCancelled, sample_euler
from dit_core.sampling.klein import flux_noise, sample_klein
from dit_core.sampling.schedules import klein_sigmas
from dit_core.sampling.step_cache import StepCache, relative_change

C = FLUX3_TINY["in_channels"]
TEXT = FLUX3_TINY["joint_attention_dim"]
SLOW = 64  # sinusoid frequencies kept by the tiny time embedders (see `model`)


def smooth_time_embedders(tiny):
    """tiny (diffusers' model) with both time embedders reading only the slow half of their sinusoids."""
    with torch.no_grad():
        for te in (tiny.timestep_embedder, tiny.target_timestep_embedder):
            te.linear_1.weight[:, :SLOW] = 0
            te.linear_1.weight[:, 128:128 + SLOW] = 0
    return tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny flow-map model with time embedders that read only the slow half of the sinusoids (a trained
    embedder is smooth in sigma; a random one swings its modulation by ~100% between steps 0.004 apart, so
    that the first block's residual moves ~0.6-1.0 a step and no limit below 1 ever skips)."""
    tiny = smooth_time_embedders(random_flux3(seed=11))
    path = tmp_path_factory.mktemp("flux3_sampling") / "flux3.safetensors"
    save_file(flux3_bfl_layout(tiny.state_dict()), path)
    return Flux3Klein.load(path)


@pytest.fixture(scope="module")
def job():
    torch.manual_seed(3)
    return {"noise": flux_noise(7, 64, 96, channels=C)[0], "sigmas": klein_sigmas(16),
            "text_rows": torch.randn(9, TEXT), "references": [torch.randn(C, 4, 4)]}


def test_noise_is_comfyui_draw(comfy):
    import comfy.sample
    latent = torch.zeros(2, 128, 1024 // 16, 768 // 16)  # EmptyFlux2LatentImage, batch 2
    seed = 605452029419059  # the distilled t2i template's seed
    assert torch.equal(flux_noise(seed, 1024, 768, batch=2), comfy.sample.prepare_noise(latent, seed))
    with pytest.raises(ValueError, match="multiples of 16"):
        flux_noise(0, 1000, 768)


def test_euler_on_velocity_matches_denoiser_form(model, job):
    """Euler on the raw velocity equals k_diffusion's Euler on x0 = x - sigma v (to rounding)."""
    ours = sample_klein(model, job["noise"], job["sigmas"], job["text_rows"])
    sigmas = job["sigmas"]

    def denoiser(x, sigma):
        i = int((sigmas == sigma).nonzero()[0])
        return model.denoised(x, float(sigma), float(sigmas[i + 1]), job["text_rows"][None])

    reference = sample_euler(denoiser, job["noise"][None], sigmas)[0]
    assert rel_err(ours, reference) <= 1e-5


def test_image_to_image_starts_as_comfyui(comfy, model, job):
    """denoise 0.5: the last 17 sigmas of the 32-step schedule (KSampler.set_steps), Euler from ComfyUI's CONST
    noise_scaling of the latent; denoise 0 leaves the latent as it is."""
    import comfy.model_sampling
    sigmas = klein_sigmas(16, 16.0, denoise=0.5)
    assert torch.equal(sigmas, klein_sigmas(32, 16.0)[-17:]) and 0 < sigmas[0] < 1
    latent = torch.randn(job["noise"].shape, generator=torch.Generator().manual_seed(5))
    ours = sample_klein(model, job["noise"], sigmas, job["text_rows"], latent=latent)

    def denoiser(x, sigma):
        i = int((sigmas == sigma).nonzero()[0])
        return model.denoised(x, float(sigma), float(sigmas[i + 1]), job["text_rows"][None])

    start = comfy.model_sampling.CONST().noise_scaling(sigmas[0], job["noise"][None], latent[None])
    assert rel_err(ours, sample_euler(denoiser, start, sigmas)[0]) <= 1e-5
    assert not torch.allclose(ours, sample_klein(model, job["noise"], sigmas, job["text_rows"]))  # latent used
    assert sample_klein(model, job["noise"], klein_sigmas(16, 16.0, denoise=0.0), job["text_rows"],
                        latent=latent) is latent
    with pytest.raises(ValueError, match=r"denoise must be in \[0, 1\]"):
        klein_sigmas(16, 16.0, denoise=1.5)


def test_cache_zero_is_uncached_sampler(model, job):
    full = sample_klein(model, **job)
    cache = StepCache(0.0)
    assert torch.equal(sample_klein(model, **job, cache=cache), full)
    assert (cache.steps, cache.skipped, cache.ran) == (16, 0, 16)
    assert torch.equal(sample_klein(model, **job, step=model.graphed()), full)  # on the CPU: output() itself


@pytest.mark.parametrize("limit,max_err", [(0.1, 3e-3), (0.3, 2e-2)])
def test_cache_skips_steps_and_stays_close(model, job, limit, max_err):
    """Tiny model, 16 steps at shift 16, against every block run: 0.1 skips 6 of 16 steps (relative error of
    the latent 5.9e-4), 0.3 skips 10 (4.7e-3)."""
    full = sample_klein(model, **job)
    cache = StepCache(limit)
    cached = sample_klein(model, **job, cache=cache)
    assert 0 < cache.skipped < cache.steps == 16
    assert cache.changes[0] is None and all(c is not None for c in cache.changes[1:])
    assert 1e-5 < rel_err(cached, full) <= max_err


def test_cache_start_and_checks(model, job):
    cache = StepCache(0.3, start=16)  # every step before 16: none skips
    assert torch.equal(sample_klein(model, **job, cache=cache), sample_klein(model, **job))
    assert cache.skipped == 0
    for bad, message in (({"limit": -0.1}, "limit must be"), ({"limit": float("nan")}, "limit must be"),
                         ({"start": -1}, "start must be")):
        with pytest.raises(ValueError, match=message):
            StepCache(**bad)
    a = torch.tensor([1.0, -2.0])
    assert relative_change(a + torch.tensor([0.3, 0.0]), a) == pytest.approx(0.3 / 3)


def test_refresh_keeps_reference_keys_and_values(model, job):
    """refresh 1 records every step (equal to no refresh); refresh 4 reuses keys and values 3 steps in 4
    (tiny model: relative error 1.1e-2; refresh 2 with cache 0.1: 7.3e-3)."""
    full = sample_klein(model, **job)
    assert torch.equal(sample_klein(model, **job, refresh=1), full)
    refreshed = sample_klein(model, **job, refresh=4)
    assert 1e-6 < rel_err(refreshed, full) <= 2e-2
    both = sample_klein(model, **job, refresh=2, cache=StepCache(0.1))
    assert rel_err(both, full) <= 2e-2


def test_cfg_runs_negative_with_its_own_cache(model, job):
    negative = torch.zeros(4, TEXT)
    seen = []

    class Spy:
        def output(self, x, sigma, sigma_next, rows, refs, check, cache, slots):
            seen.append(cache)
            return model.output(x, sigma, sigma_next, rows, refs, check, cache, slots)

    cache = StepCache(0.1)
    sigmas = job["sigmas"][:3]
    out = sample_klein(Spy(), job["noise"], sigmas, job["text_rows"], negative=negative, cfg=3.5, cache=cache)
    assert seen[0] is cache and seen[1] is not cache and seen[1].limit == 0.1 and cache.steps == 2
    v = [model.output(job["noise"], 1.0, float(sigmas[1]), rows) for rows in (job["text_rows"], negative)]
    x1 = job["noise"] + (sigmas[1] - sigmas[0]) * (v[1] + 3.5 * (v[0] - v[1]))
    one = sample_klein(model, job["noise"], sigmas[:2], job["text_rows"], negative=negative, cfg=3.5)
    assert rel_err(one, x1) <= 1e-6
    assert out.shape == job["noise"].shape
    with pytest.raises(ValueError, match="negative"):
        sample_klein(model, job["noise"], sigmas, job["text_rows"], cfg=3.5)


def test_cancel_between_steps(model, job):
    done = []
    with pytest.raises(SamplingCancelled) as err:
        sample_klein(model, **job, cache=StepCache(0.3), callback=lambda i, n, x, x0: done.append(i),
                     should_stop=lambda: len(done) >= 3)
    assert (err.value.steps_done, err.value.total, done) == (3, 16, [1, 2, 3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_sampler_equals_eager_on_gpu(tmp_path):
    """Flux3Klein.graphed on the GPU, placed as the nodes place it (StreamedBlocks, all resident): two graphs a
    step (embedders through the first joint block; the other joint blocks) with the step cache's host decision
    between them give the eager sampler's latent bit for bit, with the same changes and skips, at cache 0 and
    0.3, without and with a reference (INT8 ConvRot linears: 256 wide)."""
    tiny = smooth_time_embedders(random_flux3(seed=11, attention_head_dim=64, num_attention_heads=4,
                                              axes_dims_rope=(16, 16, 16, 16)))
    save_file(flux3_bfl_layout(tiny.state_dict()), tmp_path / "klein.safetensors")
    gpu = Flux3Klein.load(tmp_path / "klein.safetensors", linears="int8").to("cuda", budget_bytes=10 ** 12)
    step = gpu.graphed()
    g = torch.Generator().manual_seed(3)
    noise, text = flux_noise(7, 64, 96, channels=C)[0].cuda(), torch.randn(9, TEXT, generator=g).cuda()
    reference = torch.randn(C, 4, 4, generator=g).cuda()
    skipped = 0
    for limit in (0.0, 0.3):
        for references in ([], [reference]):
            eager_cache, graph_cache = StepCache(limit), StepCache(limit)
            eager = sample_klein(gpu, noise, klein_sigmas(16), text, references, eager_cache)
            graphed = sample_klein(gpu, noise, klein_sigmas(16), text, references, graph_cache, step=step)
            assert torch.equal(graphed, eager), (limit, len(references))
            assert (graph_cache.changes, graph_cache.skipped) == (eager_cache.changes, eager_cache.skipped)
            skipped += graph_cache.skipped
    assert skipped > 0  # the skip path (x1 + R_full, then the eager final layer) ran too
    assert all(g.graphs and None not in g.graphs.values() for g in step.graphs)  # captured, none fell back


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_concurrent_mode_blocks_on_gpu(tmp_path):
    """Options.concurrent_modes (Klein's default): the text's and the reference's mode blocks on side streams, eager
    and graphed, give the latents of the one-stream sampler bit for bit."""
    tiny = smooth_time_embedders(random_flux3(seed=12, attention_head_dim=64, num_attention_heads=4,
                                              axes_dims_rope=(16, 16, 16, 16)))
    save_file(flux3_bfl_layout(tiny.state_dict()), tmp_path / "klein.safetensors")
    gpu = Flux3Klein.load(tmp_path / "klein.safetensors", linears="int8").to("cuda", budget_bytes=10 ** 12)
    g = torch.Generator().manual_seed(4)
    noise, text = flux_noise(8, 64, 96, channels=C)[0].cuda(), torch.randn(9, TEXT, generator=g).cuda()
    reference = torch.randn(C, 4, 4, generator=g).cuda()
    serial = replace(gpu, options=replace(gpu.options, concurrent_modes=False))
    assert gpu.options.concurrent_modes
    for references in ([], [reference]):
        one_stream = sample_klein(serial, noise, klein_sigmas(8), text, references, StepCache(0.0))
        eager = sample_klein(gpu, noise, klein_sigmas(8), text, references, StepCache(0.0))
        graphed = sample_klein(gpu, noise, klein_sigmas(8), text, references, StepCache(0.0), step=gpu.graphed())
        assert torch.equal(eager, one_stream) and torch.equal(graphed, one_stream), len(references)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernels_built_beside_the_load_leave_the_sampler_none(tmp_path, fresh_kernel_caches):
    """builds.built_beside as the loader node runs it (a stand-in of the file's first joint and single blocks, its
    dry pass at 256x256 and 77 text rows), then the sampler's first steps as the sampler node runs them (graphed,
    the step cache at 0.3, another size and prompt length) under build_ahead: nothing left to build, on Hopper (a
    cold graph on an H100 still built on its first prompt: 4.45 s against 1.22 after a restart)."""
    from dit_core.gpu.builds import build_ahead, built_beside
    from dit_core.weights import FirstBlocks
    tiny = smooth_time_embedders(random_flux3(seed=13, attention_head_dim=64, num_attention_heads=4,
                                              axes_dims_rope=(16, 16, 16, 16)))
    path, cuda = tmp_path / "klein.safetensors", torch.device("cuda")
    save_file(flux3_bfl_layout(tiny.state_dict()), path)
    beside = built_beside(lambda: Flux3Klein.load(FirstBlocks(path), linears="int8", compute_on=cuda).to(cuda),
                          lambda model: model.dry_pass(pixels=256), cuda)
    beside.join()
    assert beside.built.kernels, "the stand-in built nothing: the test would show nothing"
    gpu = Flux3Klein.load(path, linears="int8", compute_on=cuda).to("cuda", budget_bytes=10 ** 12)
    g = torch.Generator().manual_seed(5)
    noise, text = flux_noise(9, 64, 96, channels=C)[0].cuda(), torch.randn(80, TEXT, generator=g).cuda()
    after = build_ahead(lambda: sample_klein(gpu, noise, klein_sigmas(4), text, [], StepCache(0.3),
                                             step=gpu.graphed()), cuda)
    # (what the stand-in built of each kernel the sampler still built: their specializations differ)
    assert after.kernels == 0 and after.stopped is None, (after, [s for s in beside.built.specialized
                                                                  if s.split("(")[0] in after.names])
