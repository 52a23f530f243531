"""dit_core/sampling/ltx25.py against ComfyUI v0.3.75 in-process (its nested-latent noise and packing, KSAMPLER with
the k-diffusion euler_ancestral on a CONST flow model, its cfg_function, KSamplerX0Inpaint under a denoise mask,
LTXV.process_timestep's per-token times, the LTX patchifier's pixel coordinates) and the newer LTX-2 nodes' rules
(LTXVDualCFGGuider's sampler_cfg_function, ManualSigmas, LTXVImgToVideoInplace / LTXVAddGuide / LTXVCropGuides'
latents and masks, the guide attention mask), the latent upsampler against diffusers 0.42.1, and tiny two-stage runs
through LTX25.forward, text and image to video (reference/families/ltx25.md sections 7 and 9)."""
import math

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import ltx25_comfy_layout, random_ltx2_upsampler, random_ltx25, save_ltx2_upsampler

from dit_core.codecs.ltx2_latent_upsampler import LatentUpsampler
from dit_core.families.ltx25 import LTX25
from dit_core.families.ltx25_positions import Grid, Guide, guide_attention_bias, keyframe_rows, video_midpoints
from dit_core.sampling.ksampler import SamplingCancelled
from dit_core.sampling.ltx25 import (
    STAGE_1_SIGMAS,
    STAGE_2_SEED,
    STAGE_2_SIGMAS,
    FirstFrame,
    Prompt,
    Stage,
    add_guide,
    audio_rows,
    crop_guides,
    dual_cfg_denoiser,
    guide_frame,
    image_to_video,
    manual_sigmas,
    pack,
    packed_model,
    sample_stage,
    sample_two_stage,
    template_stages,
    unpack,
    video_rows,
)
from dit_core.weights import WeightsError

VIDEO, AUDIO = (1, 8, 2, 2, 3), (1, 2, 5, 4)  # the tiny transformer's latents: 8 channels, audio 2 x 4 a row
VIDEO_SIZE = math.prod(VIDEO[1:])


def prompt(seed: int, rows: int = 4) -> Prompt:
    g = torch.Generator().manual_seed(seed)
    return Prompt(torch.randn(rows, 32, generator=g), torch.randn(rows, 16, generator=g))


POSITIVE, NEGATIVE = prompt(1), prompt(2)


class StandIn:
    """A fixed nonlinear x0 on the packed state, each value reading the whole state and the prompt."""

    def __init__(self, size: int, seed: int = 3):
        g = torch.Generator().manual_seed(seed)
        self.a, self.b = torch.randn(size, generator=g), torch.randn(size, generator=g)

    def __call__(self, x, sigma, p: Prompt):
        return torch.tanh(x * self.a + sigma * self.b + p.video.mean()) + 0.1 * x.mean() - 0.2 * p.audio.mean()


# --- ManualSigmas ----------------------------------------------------------------------------------------------

def test_manual_sigmas_of_the_template():
    diffusers_utils = pytest.importorskip("diffusers.pipelines.ltx2.utils")
    stage1 = manual_sigmas(STAGE_1_SIGMAS)
    assert stage1.dtype == torch.float32
    assert torch.equal(stage1, torch.FloatTensor(diffusers_utils.DISTILLED_SIGMA_VALUES + [0.0]))
    # section 9, item 8: the template's stage 2 as typed (rounded), not diffusers' 0.909375, 0.725, 0.421875
    assert torch.equal(manual_sigmas(STAGE_2_SIGMAS), torch.FloatTensor([0.85, 0.725, 0.4219, 0.0]))
    # ComfyUI's pattern: signs, a leading dot, text ignored
    assert torch.equal(manual_sigmas("1.0, 0.99375, -0.25, +.5, text"), torch.FloatTensor([1.0, 0.99375, -0.25, 0.5]))
    s1, s2 = template_stages(seed=7)
    assert (s1.seed, s2.seed) == (7, STAGE_2_SEED) and STAGE_2_SEED == 42
    assert (s1.video_cfg, s1.audio_cfg) == (1.0, 1.0)


# --- ComfyUI's stage: noise, packing, KSAMPLER(euler_ancestral), the guider --------------------------------------

def comfy_guider(comfy, model, video_cfg, audio_cfg, positive, negative, video_size):
    """Guider_LTXAVDualCFG's predict_noise as ComfyUI runs it: equal scales -> plain CFG (cfg1 optimisation: the
    uncond pass skipped, its prediction 0); else both passes and its sampler_cfg_function (its rule as
    comfy_extras/nodes_lt.py states it: noise space, the audio values from video_size on taking audio_cfg)."""
    def dual(args):
        cond, uncond = args["cond"], args["uncond"]
        out = uncond + (cond - uncond) * video_cfg
        v = video_size
        out[..., v:] = uncond[..., v:] + (cond[..., v:] - uncond[..., v:]) * audio_cfg
        return out

    def predict(x, sigma):
        c = model(x, sigma, positive)
        if math.isclose(video_cfg, audio_cfg):
            u = torch.zeros_like(x) if math.isclose(video_cfg, 1.0) else model(x, sigma, negative)
            return comfy.samplers.cfg_function(None, c, u, video_cfg, x, sigma)
        u = model(x, sigma, negative)
        return comfy.samplers.cfg_function(None, c, u, max(video_cfg, audio_cfg), x, sigma,
                                           model_options={"sampler_cfg_function": dual})
    return predict


def comfy_stage(comfy, predict, video, audio, sigmas, seed, eta=1.0, mask=None):
    """SamplerCustomAdvanced on the nested AV latent in ComfyUI v0.3.75: RandomNoise's prepare_noise, the guider's
    packing, process_latent_in (LTX's latent format: x 1.0) on a non-empty latent, KSAMPLER (noise scaling,
    KSamplerX0Inpaint with LTX-AV's scale_latent_inpaint, euler_ancestral dispatching to its RF form on CONST,
    inverse noise scaling), unpacked."""
    import comfy.k_diffusion.sampling
    import comfy.nested_tensor

    class Sampling(comfy.model_sampling.ModelSamplingFlux, comfy.model_sampling.CONST):
        pass

    class Base:  # model_wrap.inner_model: what KSAMPLER and KSamplerX0Inpaint ask of the model
        model_sampling = Sampling()

        def scale_latent_inpaint(self, sigma, noise, latent_image, **kwargs):
            return latent_image

    class Wrap:
        inner_model = Base()

        def __call__(self, x, sigma, model_options=None, seed=None):
            return predict(x, sigma[0])

    latent = comfy.nested_tensor.NestedTensor((video, audio))
    noise = comfy.sample.prepare_noise(latent, seed)
    latent_p, shapes = comfy.utils.pack_latents(latent.unbind())
    noise_p, _ = comfy.utils.pack_latents(noise.unbind())
    if torch.count_nonzero(latent_p) > 0:
        latent_p = latent_p * 1.0
    mask_p = None
    if mask is not None:
        mask_p = comfy.utils.pack_latents([m.expand(s.shape) for m, s in zip(mask, (video, audio))])[0]
    sampler = comfy.samplers.KSAMPLER(comfy.k_diffusion.sampling.sample_euler_ancestral, {"eta": eta})
    out = sampler.sample(Wrap(), sigmas, {"seed": seed, "model_options": {}}, None, noise_p, latent_p, mask_p, True)
    return comfy.utils.unpack_latents(out, shapes)


def latents(empty: bool, seed: int = 4):
    if empty:
        return torch.zeros(VIDEO), torch.zeros(AUDIO)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)


@pytest.mark.parametrize("cfgs", [(1.0, 1.0), (3.0, 3.0), (3.0, 7.0), (1.0, 4.0)])
def test_guider_matches_comfy(comfy, cfgs):
    model = StandIn(VIDEO_SIZE + math.prod(AUDIO[1:]))
    x = torch.randn(1, 1, model.a.numel(), generator=torch.Generator().manual_seed(8))
    sigma = torch.tensor(0.725)
    want = comfy_guider(comfy, model, *cfgs, POSITIVE, NEGATIVE, VIDEO_SIZE)(x, sigma)
    got = dual_cfg_denoiser(model, *cfgs, VIDEO_SIZE, POSITIVE, NEGATIVE)(x, sigma)
    assert torch.equal(got, want)  # bit for bit
    if cfgs[0] == 1.0:  # the video values at scale 1 are the positive's prediction (one pass at 1, 1)
        assert (got[..., :VIDEO_SIZE] - model(x, sigma, POSITIVE)[..., :VIDEO_SIZE]).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="negative prompt"):
        dual_cfg_denoiser(model, 3.0, 7.0, VIDEO_SIZE, POSITIVE)


@pytest.mark.parametrize("stage,empty,eta,cfgs", [
    (Stage(manual_sigmas(STAGE_1_SIGMAS), 558811532553686), True, 1.0, (1.0, 1.0)),
    (Stage(manual_sigmas(STAGE_2_SIGMAS), STAGE_2_SEED, 3.0, 7.0), False, 1.0, None),
    (Stage(manual_sigmas(STAGE_2_SIGMAS), 5, 2.0, 2.0), False, 0.5, None),
])
def test_stage_matches_comfy(comfy, stage, empty, eta, cfgs):
    """A whole stage on the packed AV state (the template's stage 1 from empty latents; stage 2 from a latent
    re-noised to 0.85 with its own seed; eta 0.5 as DFR) equals ComfyUI's bit for bit."""
    video, audio = latents(empty)
    model = StandIn(VIDEO_SIZE + math.prod(AUDIO[1:]))
    predict = comfy_guider(comfy, model, stage.video_cfg, stage.audio_cfg, POSITIVE, NEGATIVE, VIDEO_SIZE)
    want = comfy_stage(comfy, predict, video, audio, stage.sigmas, stage.seed, eta)
    seen = []
    got = sample_stage(model, video, audio, stage, POSITIVE, NEGATIVE, eta=eta,
                       callback=lambda i, n, x, x0: seen.append((i, n)))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    total = len(stage.sigmas) - 1
    assert seen == [(i + 1, total) for i in range(total)]


def conditioned_latent(kind: str):
    """(video, audio, video mask, guides) as the frame nodes leave them: i2v's first frame kept whole (strength 1,
    LTXVImgToVideoInplace's mask 0) or at the template's 0.7 (mask 0.3), or two guides appended at strength 0.7
    (first and last frame, LTXVAddGuide's mask 0.3 each)."""
    video, audio = latents(False)
    image = torch.randn(1, VIDEO[1], 1, *VIDEO[3:], generator=torch.Generator().manual_seed(9))
    if kind == "guides":
        video, mask, guides = add_guide(video, None, (), image, 0, 0.7)
        video, mask, guides = add_guide(video, mask, guides, image.flip(-1), guide_frame(-1, VIDEO[2], 1)[0], 0.7)
        return video, audio, mask, guides
    video, mask = image_to_video(video, None, image, 1.0 if kind == "i2v strength 1" else 0.7)
    return video, audio, mask, ()


@pytest.mark.parametrize("kind", ["i2v strength 1", "i2v strength 0.7", "guides"])
@pytest.mark.parametrize("audio_ones", [False, True])
def test_stage_with_denoise_mask_matches_comfy(comfy, kind, audio_ones):
    """A stage under the frame nodes' noise mask (the audio's None or LTXVConcatAVLatent's ones) equals ComfyUI's
    KSAMPLER with that denoise_mask bit for bit: KSamplerX0Inpaint's blend each step. A frame kept whole comes back
    as given; one at 0.7 moves."""
    video, audio, mask, guides = conditioned_latent(kind)
    masks = (mask, torch.ones(1, 1, 1, 1) if audio_ones else None)
    stage = Stage(manual_sigmas(STAGE_2_SIGMAS), 11)
    model = StandIn(video[0].numel() + math.prod(AUDIO[1:]))
    predict = comfy_guider(comfy, model, 1.0, 1.0, POSITIVE, NEGATIVE, video[0].numel())
    want = comfy_stage(comfy, predict, video, audio, stage.sigmas, stage.seed, mask=(mask, torch.ones(1, 1, 1, 1)))
    got = sample_stage(model, video, audio, stage, POSITIVE, denoise_mask=masks)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(got[0][:, :, 0], video[:, :, 0]) == (kind == "i2v strength 1")


def test_frame_latents_as_comfy_nodes_make_them():
    """LTXVImgToVideoInplace: the image's latent in place of the first frame, mask 1 - strength there; LTXVAddGuide:
    appended frames, mask max(0, 1 - strength), placed at -1 = the last pixel frame of the generated ones (8 (F - 1),
    guides not counted), a clip of frames on 8k + 1; LTXVCropGuides: back to the generated frames."""
    video, audio = latents(False)
    image = torch.ones(1, VIDEO[1], 1, *VIDEO[3:])
    got, mask = image_to_video(video, None, image, 0.7)
    assert torch.equal(got[:, :, 0], image[:, :, 0]) and torch.equal(got[:, :, 1:], video[:, :, 1:])
    assert mask.shape == (1, 1, VIDEO[2], 1, 1) and mask.flatten().tolist() == pytest.approx([0.3, 1.0])
    assert torch.equal(image_to_video(video, None, image, 1.0)[1].flatten(), torch.tensor([0.0, 1.0]))
    assert guide_frame(-1, 16, 1) == (120, 15) and guide_frame(0, 16, 1) == (0, 0) and guide_frame(-1, 2, 1) == (8, 1)
    assert guide_frame(20, 16, 9) == (17, 3) and guide_frame(-200, 16, 1) == (0, 0)
    first, mask, guides = add_guide(video, None, (), image, 0, 0.7)
    last, mask, guides = add_guide(first, mask, guides, 2 * image, 8, 1.5)
    assert last.shape[2] == VIDEO[2] + 2 and torch.equal(last[:, :, -1], 2 * image[:, :, 0])
    assert mask.flatten().tolist() == pytest.approx([1.0, 1.0, 0.3, 0.0])  # strength over 1: mask 0
    assert guides == (Guide(0, 1, 0.7), Guide(8, 9, 1.5))
    clip = torch.zeros(1, VIDEO[1], 2, *VIDEO[3:])
    assert add_guide(video, None, (), clip, 9, 1.0, causal=False)[2] == (Guide(9, 17), Guide(17, 25))
    assert add_guide(video, None, (), clip, 0, 1.0)[2] == (Guide(0, 1), Guide(1, 9))
    cropped, cropped_mask = crop_guides(last, mask, guides)
    assert torch.equal(cropped, video) and torch.equal(cropped_mask, torch.ones(1, 1, VIDEO[2], 1, 1))


def test_guide_spans_are_comfys_pixel_coordinates(comfy):
    """A guide's pixel frames are the LTX patchifier's coordinates of its latent frames through latent_to_pixel_coords
    (causal: the first latent frame one pixel frame), start and end, moved to the guide's frame (keyframe_idxs)."""
    from comfy.ldm.lightricks.symmetric_patchifier import SymmetricPatchifier, latent_to_pixel_coords
    coords = SymmetricPatchifier(1).get_latent_coords(3, 1, 1, 1, "cpu")
    clip = torch.zeros(1, 4, 3, 1, 1)
    for causal, frame in ((True, 0), (True, 40), (False, 17)):
        starts, ends = (latent_to_pixel_coords(c, (8, 32, 32), causal_fix=causal)[0, 0] + frame
                        for c in (coords, coords + 1))
        guides = add_guide(clip, None, (), clip, frame, 1.0, causal)[2]
        assert [(g.start, g.end) for g in guides] == list(zip(starts.tolist(), ends.tolist()))


def test_stage_stops():
    video, audio = latents(True)
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(SamplingCancelled) as err:
        sample_stage(StandIn(VIDEO_SIZE + math.prod(AUDIO[1:])), video, audio, template_stages()[0], POSITIVE,
                     should_stop=should_stop)
    assert (err.value.steps_done, err.value.total) == (3, 8)


# --- the transformer on the packed state -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    pytest.importorskip("diffusers")
    path = tmp_path_factory.mktemp("ltx25_sampling") / "tiny.safetensors"
    save_file(ltx25_comfy_layout(random_ltx25()), str(path))
    return LTX25.load(path)


def test_packed_model_is_forward_on_rows(transformer):
    """The packed state's parts as LTX25.forward's rows (video frame-major then y, x; audio channels then bins a
    row), x0 = x - sigma v; a denoise mask per frame gives those rows the time sigma m; the keyframe marker on the
    first frame's rows."""
    video, audio = latents(False)
    x = pack([video, audio])
    mask = torch.tensor([0.0, 1.0])
    sigma = torch.tensor(0.725)
    x0 = packed_model(transformer, [video.shape, audio.shape], 24.0, video_mask=mask)(x, sigma, POSITIVE)
    conditioned = torch.tensor([1.0] * 6 + [0.0] * 6)  # frame 0's 2 x 3 rows clean
    grid = Grid(2, 2, 3, 24.0)
    v, a = transformer.forward(video_rows(video[0]), audio_rows(audio[0]), POSITIVE.video, POSITIVE.audio,
                               grid, 0.725, 0.725, conditioned, keyframes=keyframe_rows(grid))
    want_video = video[0] - 0.725 * v.T.reshape(VIDEO[1:])
    want_audio = audio[0] - 0.725 * a.reshape(AUDIO[2], AUDIO[1], AUDIO[3]).transpose(0, 1)
    got_video, got_audio = unpack(x0, [video.shape, audio.shape])
    assert (got_video[0] - want_video).abs().max() <= 1e-6
    assert (got_audio[0] - want_audio).abs().max() <= 1e-6
    assert torch.equal(keyframe_rows(grid), torch.tensor([True] * 6 + [False] * 6))
    # the audio row layout: row n holds channel c's bins at c * 4 .. c * 4 + 3
    assert torch.equal(audio_rows(audio[0])[3, 4:8], audio[0, 1, 3])
    with pytest.raises(ValueError, match="one sample"):
        packed_model(transformer, [torch.Size((2, *VIDEO[1:])), audio.shape], 24.0)


class Recorder:
    """Stands in for LTX25: records forward's grid and per-row arguments, returns zero velocities."""
    keyframe = None

    def forward(self, video, audio, text_video, text_audio, grid, sigma_video, sigma_audio, conditioned=None,
                text_mask=None, **kw):
        self.grid, self.sigma, self.conditioned, self.keyframes = grid, sigma_video, conditioned, kw["keyframes"]
        return torch.zeros_like(video), torch.zeros_like(audio)


@pytest.mark.parametrize("kind", ["i2v strength 0.7", "guides"])
def test_per_row_times_are_comfys_process_timestep(comfy, kind):
    """Each video row's time is ComfyUI's LTXV.process_timestep of the denoise mask (mask x sigma, patchified frame
    major; the mask as the sampler prepares it, in the latent's shape); the guides' rows come last on the grid at
    their own pixel frames; the marker on the first generated frame only."""
    import comfy.model_base
    from comfy.ldm.lightricks.symmetric_patchifier import SymmetricPatchifier
    video, audio, mask, guides = conditioned_latent(kind)
    sigma = torch.tensor([0.725])

    class Model:
        diffusion_model = type("Inner", (), {"patchifier": SymmetricPatchifier(1)})()

    prepared = comfy.sampler_helpers.prepare_mask(mask, video.shape, "cpu")
    want = comfy.model_base.LTXV.process_timestep(Model(), sigma, video, prepared)[0, :, 0]
    recorder = Recorder()
    packed_model(recorder, [video.shape, audio.shape], 24.0, video_mask=mask[0, 0], guides=guides)(
        pack([video, audio]), sigma[0], POSITIVE)
    got = recorder.sigma * (1 - recorder.conditioned)
    assert got.shape == want.shape and (got - want).abs().max() <= 1e-7
    frames = VIDEO[2] + (0 if kind != "guides" else 2) - len(guides)
    assert recorder.grid == Grid(frames, VIDEO[3], VIDEO[4], 24.0, guides)
    assert recorder.keyframes.nonzero().flatten().tolist() == list(range(VIDEO[3] * VIDEO[4]))


def test_guide_rows_positions_and_attention_bias():
    """Guide rows: after the generated frames, at their pixel frames' midpoint in time over the grid's cells; the
    guide attention mask: log(strength) between generated and guide rows both ways, 0 within each group, float32's
    lowest at strength 0, none at strength 1 (ComfyUI's GuideAttentionMask)."""
    grid = Grid(2, 1, 2, 24.0, (Guide(0, 1, 0.5), Guide(16, 17, 0.0)))
    mid = video_midpoints(grid, torch.float64)
    assert grid.rows == 8 and mid.shape == (8, 3)
    assert mid[4:, 0].tolist() == [0.5 / 24] * 2 + [16.5 / 24] * 2
    assert torch.equal(mid[4:, 1:], mid[:2, 1:].repeat(2, 1))
    assert torch.equal(mid[:4], video_midpoints(Grid(2, 1, 2, 24.0), torch.float64))
    bias = guide_attention_bias(grid)
    low = torch.finfo(torch.float32).min
    expected = torch.zeros(8, 8)
    expected[:4, 4:6] = expected[4:6, :4] = math.log(0.5)
    expected[:4, 6:] = expected[6:, :4] = low
    assert torch.equal(bias, expected)
    assert guide_attention_bias(Grid(2, 1, 2, 24.0, (Guide(0, 1, 1.0),))) is None
    assert guide_attention_bias(Grid(2, 1, 2, 24.0)) is None
    # the block's attention adds a [rows, keys] bias to every head's scores (what LTX25's self-attention hands it)
    from dit_core.block import attention
    q, k, v = torch.randn(3, 8, 2, 4, generator=torch.Generator().manual_seed(2))
    scores = torch.einsum("qhd,khd->hqk", q, k) / 2 + bias
    want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(8, 8)
    assert (attention(q, k, v, 0, bias) - want).abs().max() <= 1e-6


@pytest.fixture(scope="module")
def upsampler(tmp_path_factory):
    pytest.importorskip("diffusers")
    path = tmp_path_factory.mktemp("ltx2_upsampler") / "up.safetensors"
    save_ltx2_upsampler(random_ltx2_upsampler(in_channels=8), path)
    return LatentUpsampler.load(path)


def test_two_stages_through_the_transformer(transformer, upsampler):
    """The template's flow at tiny size: stage 1 on the empty half-size latent (8 steps), the x2 upsampler with the
    VAE statistics, stage 2 from 0.85 (3 steps, seed 42): shapes, finite, the same for a seed, another for another,
    and a dual-CFG run with the negative prompt."""
    g = torch.Generator().manual_seed(6)
    mean, std = 0.1 * torch.randn(8, generator=g), 1 + 0.2 * torch.rand(8, generator=g)
    seen = []
    video, audio = latents(True)

    def run(seed, cfgs=(1.0, 1.0), callback=None):
        return sample_two_stage(transformer, lambda v: upsampler.upsample(v, mean, std), video, audio, 24.0,
                                POSITIVE, NEGATIVE, template_stages(seed, *cfgs), callback=callback)

    first = run(7, callback=lambda k, i, n, x, x0: seen.append((k, i, n)))
    assert first[0].shape == (1, 8, 2, 4, 6) and first[1].shape == AUDIO
    assert all(t.isfinite().all() for t in first)
    assert seen == [(1, i + 1, 8) for i in range(8)] + [(2, i + 1, 3) for i in range(3)]
    again = run(7)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = run(8)
    assert not torch.equal(first[0], other[0])
    dual = run(7, (3.0, 7.0))
    assert dual[0].shape == first[0].shape and all(t.isfinite().all() for t in dual)
    assert not torch.equal(dual[1], first[1])


def test_image_to_video_two_stages(transformer, upsampler):
    """video_ltx2_5_i2v's flow: the first frame put in before each stage (strength 0.7, then 1.0 at the upsampled
    size); the result keeps the image's latent as the first frame (stage 2 keeps it whole) and differs from text to
    video; flf2v's guides through the transformer: appended, sampled at strength 0.7 (the attention bias), cropped."""
    g = torch.Generator().manual_seed(6)
    mean, std = 0.1 * torch.randn(8, generator=g), 1 + 0.2 * torch.rand(8, generator=g)
    video, audio = latents(True)
    sizes = []

    def encode(height, width):
        sizes.append((height, width))
        return torch.full((1, 8, 1, height, width), 0.5)

    run = dict(stages=template_stages(7))
    i2v = sample_two_stage(transformer, lambda v: upsampler.upsample(v, mean, std), video, audio, 24.0, POSITIVE,
                           first_frame=FirstFrame(encode), **run)
    t2v = sample_two_stage(transformer, lambda v: upsampler.upsample(v, mean, std), video, audio, 24.0, POSITIVE,
                           **run)
    assert sizes == [(2, 3), (4, 6)] and i2v[0].shape == (1, 8, 2, 4, 6)
    assert torch.equal(i2v[0][:, :, 0], torch.full((1, 8, 4, 6), 0.5)) and not torch.equal(i2v[0], t2v[0])
    first, last = torch.randn(2, 1, 8, 1, 2, 3, generator=g)
    with_guides, mask, guides = add_guide(video, None, (), first, 0, 0.7)
    with_guides, mask, guides = add_guide(with_guides, mask, guides, last, guide_frame(-1, 2, 1)[0], 0.7)
    net = packed_model(transformer, [with_guides.shape, audio.shape], 24.0, video_mask=mask[0, 0], guides=guides)
    out, _ = sample_stage(net, with_guides, audio, template_stages(7)[0], POSITIVE, denoise_mask=(mask, None))
    assert guides == (Guide(0, 1, 0.7), Guide(8, 9, 0.7)) and out.shape == (1, 8, 4, 2, 3)
    assert crop_guides(out, mask, guides)[0].shape == video.shape and out.isfinite().all()


# --- the latent upsampler ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [{}, {"use_rational_resampler": False}, {"dims": 2}])
def test_upsampler_matches_diffusers(tmp_path, overrides):
    """The released layout (rational resampler: upsampler.conv + its blur buffer), the plain one (upsampler.0), and
    a 2-D file, vs LTX2LatentUpsamplerModel on the same weights; upsample() is LTXVLatentUpsampler's
    un-normalize, upsample, normalize."""
    pytest.importorskip("diffusers")
    reference = random_ltx2_upsampler(**overrides)
    save_ltx2_upsampler(reference, tmp_path / "up.safetensors")
    ours = LatentUpsampler.load(tmp_path / "up.safetensors")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 3, 4, 5, generator=g)
    with torch.no_grad():
        want = reference(x)
    assert want.shape == (1, 16, 3, 8, 10)
    assert rel_err(ours(x), want) <= 1e-4
    mean, std = torch.randn(16, generator=g), 1 + torch.rand(16, generator=g)
    view = (1, -1, 1, 1, 1)
    with torch.no_grad():
        want = (reference(x * std.view(view) + mean.view(view)) - mean.view(view)) / std.view(view)
    assert rel_err(ours.upsample(x, mean, std), want) <= 1e-4
    if torch.cuda.is_available():  # on the card (the nodes' place), the latents' device and dtype kept
        on_card = ours.to("cuda").upsample(x.bfloat16(), mean.cuda(), std.cuda())
        assert on_card.device == x.device and on_card.dtype == torch.bfloat16
        assert rel_err(on_card.float(), want) <= 1e-2


def test_upsampler_refuses_other_files(tmp_path):
    pytest.importorskip("diffusers")
    temporal = random_ltx2_upsampler(spatial_upsample=False, temporal_upsample=True)
    save_ltx2_upsampler(temporal, tmp_path / "temporal.safetensors")
    with pytest.raises(WeightsError, match="temporal upsampler"):
        LatentUpsampler.load(tmp_path / "temporal.safetensors")
    save_file({"initial_conv.weight": torch.zeros(32, 16, 3, 3, 3)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(WeightsError, match="post_upsample_res_blocks.0.conv2.bias"):
        LatentUpsampler.load(tmp_path / "other.safetensors")
    model = random_ltx2_upsampler()
    save_ltx2_upsampler(model, tmp_path / "up.safetensors")
    with pytest.raises(ValueError, match=r"\[B, 16, F, H, W\]"):
        LatentUpsampler.load(tmp_path / "up.safetensors")(torch.zeros(1, 8, 1, 2, 2))


def test_the_clip_bench_runs_tiny(capsys):
    """bench/bench_ltx25_clip.py's smoke run: both stages, the upsampler and both decoders, ours and diffusers', one
    row a phase and the whole clip."""
    pytest.importorskip("diffusers")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import bench_ltx25_clip
    assert bench_ltx25_clip.main(["--tiny"]) == 0
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[-4:] == ["stages 1 and 2 with the upsampler", "video decode", "audio decode with the vocoder",
                         "whole clip"], rows
