"""MiniMax H3 text to video + audio on the host (sample_t2va) vs a reference loop written with diffusers 0.42.1's
MiniMaxH3Transformer3DModel and two MiniMaxH3Schedulers, as its modular t2va pipeline runs them (prepare latents,
set timesteps, denoise, unpack), from the same initial noise; tiny random model."""

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import MINIMAX_H3_TINY, minimax_h3_comfy_layout, random_minimax_h3

from dit_core.families.minimax_h3 import MiniMaxH3, Reference, audio_to_rows, patchify, rows_to_audio, unpatchify
from dit_core.sampling.minimax_h3 import FASTH3_SHIFTS, comfy_h3_sigmas, sample_h3_comfy, sample_t2va, t2va_noise
from dit_core.sampling.ksampler import SamplingCancelled, prepare_noise_parts

pytest.importorskip("diffusers")
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler

C, CA, TEXT = MINIMAX_H3_TINY["in_channels"], MINIMAX_H3_TINY["audio_in_channels"], MINIMAX_H3_TINY["text_dim"]
FRAMES, LH, LW, NA, NT = 3, 4, 6, 5, 6
PATCH = (1, 2, 2)


@pytest.fixture(scope="module")
def model():
    return random_minimax_h3()


@pytest.fixture(scope="module")
def ours(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("minimax_h3_sample") / "h3_f32.safetensors"
    save_file(minimax_h3_comfy_layout(model), path)
    return MiniMaxH3.load(path)


def text_features(seed=7):
    return torch.randn(1, NT, TEXT, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def diffusers_t2va(model, text, video_noise, audio_noise, steps):
    """diffusers' modular t2va, step by step (no conditions): the layout, the noise as its prepare-latents step takes
    given latents (audio [2, C, Na] -> rows), the two schedulers set to steps + 1 points, the row timesteps of each
    step, one forward and both schedulers' steps, then its decoders' unpacking."""
    nt = text.shape[1]
    positions, tags, video_idx, audio_idx, text_idx, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(nt, dtype=torch.long), FRAMES, LH, LW, NA, PATCH, 2, 2, 0, ())
    latents = patchify_video_latents(video_noise, PATCH)
    # ComfyUI's [1, C, 2, Na] as the stereo batch [2, C, Na] the pipeline accepts
    audio_latents = audio_noise[0].permute(1, 0, 2).permute(0, 2, 1).reshape(-1, CA)
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(steps + 1)
    sa.set_timesteps(steps + 1)
    for i, t in enumerate(sv.timesteps):
        ta = sa.timesteps[i]
        times, index = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_idx, audio_idx, 0, 0, nt, float(t), float(ta), max(float(t), 0.999), 1.0)
        v, a = model(hidden_states=latents[None], audio_hidden_states=audio_latents[None],
                     encoder_hidden_states=text, timestep=times, timestep_indices=index, token_tags=tags,
                     position_ids=positions, video_indices=video_idx, audio_indices=audio_idx,
                     text_indices=text_idx, return_dict=False)
        latents = sv.step(v[0].float(), t, latents, return_dict=False)[0]
        audio_latents = sa.step(a[0].float(), ta, audio_latents, return_dict=False)[0]
    # decoders' unpack: rows -> [1, C, F, LH, LW]; channel-major rows -> [2, C, Na] -> ComfyUI's [1, C, 2, Na]
    rows = latents.reshape(-1, FRAMES, LH // 2, LW // 2, C, 1, 2, 2).permute(0, 4, 1, 5, 2, 6, 3, 7)
    video = rows.reshape(-1, C, FRAMES, LH, LW)
    audio = audio_latents.reshape(2, NA, CA).permute(0, 2, 1)
    return video, audio.permute(1, 0, 2)[None]


def test_packing_round_trips():
    z, a = torch.randn(C, FRAMES, LH, LW), torch.randn(1, CA, 2, NA)
    assert torch.equal(unpatchify(patchify(z), FRAMES, LH, LW), z)
    rows = audio_to_rows(a)
    assert torch.equal(rows[:NA], a[0, :, 0].T) and torch.equal(rows[NA:], a[0, :, 1].T)  # L rows, then R
    assert torch.equal(rows_to_audio(rows), a)


@pytest.mark.parametrize("steps", [1, 4])
def test_t2va_matches_diffusers(model, ours, steps):
    video_noise, audio_noise = t2va_noise(ours, FRAMES, LH, LW, NA, seed=11)
    text = text_features()
    want_v, want_a = diffusers_t2va(model, text, video_noise, audio_noise, steps)
    got_v, got_a = sample_t2va(ours, text, FRAMES, LH, LW, NA, steps, noise=(video_noise, audio_noise))
    assert got_v.shape == (1, C, FRAMES, LH, LW) and got_a.shape == (1, CA, 2, NA)
    # measured 1.5e-7 to 2.5e-7 on both (1, 4, 8 steps): x0 from the grid's sigma vs diffusers' time-read one
    assert rel_err(got_v, want_v) <= 1e-4 and rel_err(got_a, want_a) <= 1e-4
    assert rel_err(got_v, video_noise) > 0.1 and rel_err(got_a, audio_noise) > 0.1  # it moved


def test_seeded_noise_is_comfy_prepare_noise(ours):
    """The seed draws ComfyUI's noise (prepare_noise over the AV latent's parts, video then audio), and a seeded run
    is the run from that noise."""
    video, audio = t2va_noise(ours, FRAMES, LH, LW, NA, seed=11)
    want = prepare_noise_parts([torch.zeros(1, C, FRAMES, LH, LW), torch.zeros(1, CA, 2, NA)], 11)
    assert torch.equal(video, want[0]) and torch.equal(audio, want[1])
    assert video.dtype == audio.dtype == torch.float32
    text = text_features()
    seeded = sample_t2va(ours, text, FRAMES, LH, LW, NA, 2, seed=11)
    given = sample_t2va(ours, text[0], FRAMES, LH, LW, NA, 2, noise=(video, audio))
    assert torch.equal(seeded[0], given[0]) and torch.equal(seeded[1], given[1])


def test_callback_stop_and_refusals(ours):
    text, seen, asks = text_features(), [], []
    sample_t2va(ours, text, FRAMES, LH, LW, NA, 3, seed=1, callback=lambda i, n, x, x0: seen.append((i, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)]

    def should_stop():
        asks.append(1)
        return len(asks) > 1

    with pytest.raises(SamplingCancelled) as err:
        sample_t2va(ours, text, FRAMES, LH, LW, NA, 3, seed=1, should_stop=should_stop)
    assert (err.value.steps_done, err.value.total) == (1, 3)
    with pytest.raises(ValueError, match="not both or neither"):
        sample_t2va(ours, text, FRAMES, LH, LW, NA, 3)
    with pytest.raises(ValueError, match="initial noise"):
        sample_t2va(ours, text, FRAMES, LH, LW, NA, 3, noise=(torch.zeros(1, C, FRAMES, LH, LW),
                                                               torch.zeros(1, CA, NA, 2)))


def test_keyframes_as_comfyui_adds_them(ours, monkeypatch):
    """i2v / first and last frame: each keyframe's rows reach every forward ahead of the target video rows as
    0.999 z + 0.001 n (n from a fresh generator seeded with the seed, for each frame), are never stepped, and the
    layout holds them (reference/families/minimax_h3.md section 6; ComfyUI's _cond_video_rows)."""
    gen = torch.Generator().manual_seed(3)
    first, last = (torch.randn(1, C, 1, LH, LW, generator=gen) for _ in range(2))
    seen = []
    denoised = MiniMaxH3.denoised

    def spy(self, video, audio, txt, layout, sigma_video, sigma_audio, check=None):
        seen.append((video.clone(), layout))
        return denoised(self, video, audio, txt, layout, sigma_video, sigma_audio, check)

    monkeypatch.setattr(MiniMaxH3, "denoised", spy)
    out = sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="res_multistep",
                      keyframes=(("first", first), ("last", last)))
    n = LH // 2 * LW // 2
    for latent, at in ((first, 0), (last, n)):
        noise = torch.randn(n, 4 * C, generator=torch.Generator().manual_seed(5))
        want = 0.999 * patchify(latent[0]) + 0.001 * noise
        for video, layout in seen:
            assert torch.equal(video[at:at + n], want) and layout.video_conditions == 2 * n
    assert len(seen) == 2 and all(v.shape[0] == 2 * n + FRAMES * n for v, _ in seen)
    plain = sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="res_multistep")
    assert out[0].shape == plain[0].shape and rel_err(out[0], plain[0]) > 1e-3  # the frames steer the video
    with pytest.raises(ValueError, match="give a sampler name and the seed"):
        sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, keyframes=(("first", first),))
    with pytest.raises(ValueError, match=r"keyframe latent is \[1, C, 1, 4, 6\]"):
        sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="euler",
                    keyframes=(("first", first[:, :, :, :2]),))


def test_odd_latent_sides_are_padded_circularly(ours, monkeypatch):
    """Text to image at a size whose latent sides are odd (1296 x 728 -> 81 x 46 cells): each forward sees the
    state padded circularly to the 2 x 2 patch grid (ComfyUI's pad_to_patch_size), its layout that size, and the
    sampler keeps the unpadded latent."""
    seen = []
    denoised = MiniMaxH3.denoised

    def spy(self, video, audio, txt, layout, sigma_video, sigma_audio, check=None):
        seen.append((unpatchify(video, 1, 4, 8), layout))
        return denoised(self, video, audio, txt, layout, sigma_video, sigma_audio, check)

    monkeypatch.setattr(MiniMaxH3, "denoised", spy)
    video, audio = sample_t2va(ours, text_features(), 1, 3, 7, 2, 2, seed=5, sampler="res_multistep")
    assert video.shape == (1, C, 1, 3, 7) and audio.shape == (1, CA, 2, 2)
    first = seen[0][0]
    noise = t2va_noise(ours, 1, 3, 7, 2, 5)[0][0]
    assert torch.equal(first[:, :, :3, :7], noise)  # sigma 1: the noise itself, then its circular wrap
    assert torch.equal(first[:, :, 3], first[:, :, 0]) and torch.equal(first[:, :, :, 7], first[:, :, :, 0])
    assert all(layout.video == 2 * 4 for _, layout in seen)


def test_references_as_comfyui_adds_them(ours, monkeypatch):
    """ref2va: a reference image (its own size) and an audio clip reach every forward as condition rows, the
    image's as 0.999 z + 0.001 n (n from a fresh generator seeded with the seed, as a keyframe's) after the
    keyframes' rows, the audio's as they are (ComfyUI's audio augmentation 1.0); neither is stepped, and the
    sampler returns the target rows only."""
    gen = torch.Generator().manual_seed(6)
    image, first = torch.randn(1, C, 1, 2, 8, generator=gen), torch.randn(1, C, 1, LH, LW, generator=gen)
    sound = torch.randn(1, CA, 2, 3, generator=gen)
    refs = (Reference("image", image), Reference("audio", audio=sound))
    seen = []
    denoised = MiniMaxH3.denoised

    def spy(self, video, audio, txt, layout, sigma_video, sigma_audio, check=None):
        seen.append((video.clone(), audio.clone(), layout))
        return denoised(self, video, audio, txt, layout, sigma_video, sigma_audio, check)

    monkeypatch.setattr(MiniMaxH3, "denoised", spy)
    out = sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="euler",
                      keyframes=(("first", first),), references=refs)
    n, m = LH // 2 * LW // 2, 4
    noise = lambda rows: torch.randn(rows, 4 * C, generator=torch.Generator().manual_seed(5))  # noqa: E731
    for video, audio, layout in seen:
        assert torch.equal(video[:n], 0.999 * patchify(first[0]) + 0.001 * noise(n))
        assert torch.equal(video[n:n + m], 0.999 * patchify(image[0]) + 0.001 * noise(m))
        assert torch.equal(audio[:6], audio_to_rows(sound))
        assert (layout.video_conditions, layout.audio_conditions, layout.video, layout.audio) == \
            (n + m, 6, FRAMES * n, 2 * NA)
    assert len(seen) == 2 and out[0].shape == (1, C, FRAMES, LH, LW) and out[1].shape == (1, CA, 2, NA)
    alone = sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="euler",
                        keyframes=(("first", first),))
    assert rel_err(out[0], alone[0]) > 1e-3 and rel_err(out[1], alone[1]) > 1e-3  # the references steer both
    with pytest.raises(ValueError, match="give a sampler name and the seed"):
        sample_t2va(ours, text_features(), FRAMES, LH, LW, NA, 2, seed=5, references=refs)


def test_reference_video_as_comfyui_adds_it(model, ours, monkeypatch):
    """ref2va with a reference video and its soundtrack (ComfyUI's video_audio block): its frames reach every forward
    as video condition rows 0.999 z + 0.001 n, its soundtrack as audio condition rows as they are; each forward's x0
    is diffusers' model on the rows, layout (build_ref2va_packed_sequence) and row times diffusers gives them, to
    1e-4; the reference steers both streams."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3Ref2VAPrepareLayoutStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3VideoReference
    gen = torch.Generator().manual_seed(8)
    clip, track = torch.randn(1, C, 2, 2, 4, generator=gen), torch.randn(1, CA, 2, 4, generator=gen)
    refs = (Reference("video", clip, track),)
    seen = []
    denoised = MiniMaxH3.denoised

    def spy(self, video, audio, txt, layout, sigma_video, sigma_audio, check=None):
        out = denoised(self, video, audio, txt, layout, sigma_video, sigma_audio, check)
        seen.append((video.clone(), audio.clone(), sigma_video, sigma_audio, out))
        return out

    monkeypatch.setattr(MiniMaxH3, "denoised", spy)
    text = text_features()
    out = sample_t2va(ours, text, FRAMES, LH, LW, NA, 2, seed=5, sampler="euler", references=refs)
    n = 2 * 1 * 2  # two latent frames of 1 x 2 patches
    noise = torch.randn(n, 4 * C, generator=torch.Generator().manual_seed(5))
    layout = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        torch.ones(NT, dtype=torch.long), [MiniMaxH3VideoReference(frames=None, audio=torch.empty(1))], [clip],
        [audio_to_rows(track)], FRAMES, LH, LW, NA, PATCH, 2, 2, 0)
    positions, tags, video_idx, audio_idx, text_idx, kv, ka = layout
    assert (kv, ka) == (n, 8) and len(seen) == 2
    for video, audio, sigma_v, sigma_a, (x0_v, x0_a) in seen:
        assert torch.equal(video[:n], 0.999 * patchify(clip[0]) + 0.001 * noise)
        assert torch.equal(audio[:8], audio_to_rows(track))
        times, index = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_idx, audio_idx, kv, ka, NT, 1.0 - sigma_v, 1.0 - sigma_a, max(1.0 - sigma_v, 0.999), 1.0)
        with torch.no_grad():
            v, a = model(hidden_states=video[None], audio_hidden_states=audio[None], encoder_hidden_states=text,
                         timestep=times, timestep_indices=index, token_tags=tags, position_ids=positions,
                         video_indices=video_idx, audio_indices=audio_idx, text_indices=text_idx, return_dict=False)
        assert rel_err(x0_v[n:], video[n:] + sigma_v * v[0, n:]) <= 1e-4
        assert rel_err(x0_a[8:], audio[8:] + sigma_a * a[0, 8:]) <= 1e-4
    alone = sample_t2va(ours, text, FRAMES, LH, LW, NA, 2, seed=5, sampler="euler")
    assert rel_err(out[0], alone[0]) > 1e-3 and rel_err(out[1], alone[1]) > 1e-3


@pytest.mark.parametrize("sampler", ["euler", "res_multistep"])
def test_fasth3_sigma_shift_as_comfyui_sets_it(sampler):
    """FastH3's MiniMaxH3SigmaShift(10, 3), 8 steps on the simple scheduler: the model sees, at step i of b = 1 -
    i/8, the video at sigma_v = 10 b/(1 + 9 b) (ModelSamplingAV's grid at shift 10) and the audio at its own clock
    sigma_a = 3 b/(1 + 2 b) (the model's inverse of the video shift, then shift 3); with x0 = 0 the rows it gets are
    the noise times those sigmas (the carried audio's scale, video/audio shift, undone)."""
    video_shift, audio_shift = FASTH3_SHIFTS
    steps = 8
    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(3, 4, generator=g), torch.randn(5, 2, generator=g)
    seen = []

    def denoised(v, a, sigma_video, sigma_audio):
        seen.append((sigma_video, sigma_audio, v.clone(), a.clone()))
        return torch.zeros_like(v), torch.zeros_like(a)

    sample_h3_comfy(denoised, video, audio, comfy_h3_sigmas("simple", steps, video_shift), sampler, video_shift,
                    audio_shift)
    assert len(seen) == steps
    for i, (sv, sa, v, a) in enumerate(seen):
        b = 1 - i / steps
        want_v, want_a = 10 * b / (1 + 9 * b), 3 * b / (1 + 2 * b)
        assert sv == pytest.approx(want_v, rel=1e-6) and sa == pytest.approx(want_a, rel=1e-6)
        assert torch.allclose(v, want_v * video, rtol=1e-5, atol=1e-6)
        assert torch.allclose(a, want_a * audio, rtol=1e-5, atol=1e-6)
