"""The LTX-2.5 frame nodes (nodes/ltx25_frames.py, issue 36) in-process on ComfyUI v0.3.75's modules: the
video_ltx2_5_i2v graph (Img To Video Inplace before each stage, 0.7 then 1) and the video_ltx2_5_flf2v graph (two Add
Guides at frames 0 and -1, strength 0.7, then Crop Guides) with our nodes equal the engine called directly
(sample_two_stage with its FirstFrame; add_guide, packed_model, sample_stage, crop_guides) bit for bit; the
conditioning's keyframe_idxs as ComfyUI's patchifier and pixel coordinates give them; errors naming node and input.
The tiny files and the stock stand-ins are tests/nodes/test_ltx25_nodes.py's (its fixtures are used here)."""
import math
from types import SimpleNamespace

import pytest
import torch
from node_contract import assert_schemas_follow, run
from tiny_models import builders

from dit_core.sampling.ltx25 import STAGE_1_SIGMAS, STAGE_2_SEED, STAGE_2_SIGMAS, TEMPLATE_SEED

pytest.importorskip("diffusers")
NODES_TEST = builders("nodes/test_ltx25_nodes.py")
pack, models, oracle, audio = NODES_TEST.pack, NODES_TEST.models, NODES_TEST.oracle, NODES_TEST.audio  # fixtures
FILES, AUDIO_VAE, PROMPT, FPS = NODES_TEST.FILES, NODES_TEST.AUDIO_VAE, NODES_TEST.PROMPT, NODES_TEST.FPS
WIDTH, HEIGHT, LENGTH, AUDIO_LATENTS = NODES_TEST.WIDTH, NODES_TEST.HEIGHT, NODES_TEST.LENGTH, NODES_TEST.AUDIO_LATENTS

CONTRACT = {
    "SwiftDiTLTX25ImgToVideoInplace": (["vae", "image", "latent", "strength", "bypass"], "LATENT"),
    "SwiftDiTLTX25AddGuide": (["positive", "negative", "vae", "latent", "image", "frame_idx", "strength"],
                              ["CONDITIONING", "CONDITIONING", "LATENT"]),
    "SwiftDiTLTX25CropGuides": (["positive", "negative", "latent"], ["CONDITIONING", "CONDITIONING", "LATENT"]),
}


@pytest.fixture(scope="module")
def ltx(pack):
    """The family's node module with its codec and frame nodes' modules' names beside it."""
    import swiftdit_pack.nodes.ltx25_codecs as codecs
    import swiftdit_pack.nodes.ltx25_frames as frames
    return SimpleNamespace(**{**vars(pack), **vars(codecs), **vars(frames)})


def images(seed: int, count: int = 2) -> list[torch.Tensor]:
    """IMAGEs [1, 40, 100, 3] in 0..1: another size than the latent's, so the nodes resize them."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(1, 40, 100, 3, generator=g) for _ in range(count)]


def resized(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    import comfy.utils
    return comfy.utils.common_upscale(image.movedim(-1, 1), width * 32, height * 32, "bilinear",
                                      "center").movedim(1, -1)


def test_schemas_follow_the_contract(ltx):
    assert_schemas_follow(ltx.FRAME_NODES, CONTRACT, "SwiftDiT/LTX-2.5")
    assert all(node in ltx.NODES for node in ltx.FRAME_NODES)


def loaders(ltx):
    (model,) = run(ltx.LTX25Loader, unet_name=FILES["diffusion_models"], weight_dtype="default", linears="as stored")
    (clip,) = run(ltx.LTX25TextEncoderLoader, clip_name=FILES["text_encoders"], type="ltxv")
    (video_vae,) = run(ltx.LTX25VAELoader, vae_name=FILES["vae"])
    (audio_vae,) = run(ltx.LTX25AudioVAELoader, vae_name=AUDIO_VAE)
    (positive,) = run(ltx.LTX25TextEncode, text=PROMPT, clip=clip)
    (negative,) = run(ltx.LTX25TextEncode, text=NODES_TEST.NEGATIVE_PROMPT, clip=clip)
    positive, negative = (NODES_TEST.ltxv_conditioning(c, FPS) for c in (positive, negative))
    (audio_latent,) = run(ltx.LTX25EmptyLatentAudio, frames_number=LENGTH, frame_rate=FPS, batch_size=1,
                          audio_vae=audio_vae)
    return dict(model=model, video_vae=video_vae, audio_vae=audio_vae, positive=positive, negative=negative,
                audio_latent=audio_latent)


def sampler(ltx, g, latent, seed, sigmas, positive=None, negative=None, **ancestral):
    (out,) = run(ltx.LTX25Sampler, model=g["model"], seed=seed, steps=len(sigmas.split(",")) - 1, cfg=1.0,
                 sampler_name="euler_ancestral", scheduler="manual", positive=positive or g["positive"],
                 negative=negative or g["negative"], latent_image=latent, denoise=1.0, audio_cfg=1.0, sigmas=sigmas,
                 **ancestral)
    return out


def i2v_graph(ltx, image, seed=TEMPLATE_SEED):
    """video_ltx2_5_i2v's sampling (enhance off): Img To Video Inplace (0.7) on the empty half-size latent, Concat
    AV, stage 1, Separate, the upsampler, Img To Video Inplace (1) on the upsampled latent, Concat with the audio
    part, stage 2 (seed 42), Separate."""
    g = loaders(ltx)
    (upscaler,) = run(ltx.LTX25LatentUpscaleModelLoader, model_name=FILES["latent_upscale_models"])
    empty = NODES_TEST.empty_ltxv_latent_video(WIDTH // 2, HEIGHT // 2, LENGTH)
    (first,) = run(ltx.LTX25ImgToVideoInplace, vae=g["video_vae"], image=image, latent=empty, strength=0.7,
                   bypass=False)
    (latent,) = run(ltx.LTX25ConcatAVLatent, video_latent=first, audio_latent=g["audio_latent"])
    stage_1 = sampler(ltx, g, latent, seed, STAGE_1_SIGMAS)
    video, audio_part = run(ltx.LTX25SeparateAVLatent, av_latent=stage_1)
    (upsampled,) = run(ltx.LTX25LatentUpsampler, samples=video, upscale_model=upscaler, vae=g["video_vae"])
    (second,) = run(ltx.LTX25ImgToVideoInplace, vae=g["video_vae"], image=image, latent=upsampled, strength=1.0,
                    bypass=False)
    (latent_2,) = run(ltx.LTX25ConcatAVLatent, video_latent=second, audio_latent=audio_part)
    stage_2 = sampler(ltx, g, latent_2, STAGE_2_SEED, STAGE_2_SIGMAS)
    return dict(g, first=first, latent=latent, stage_1=stage_1, second=second, stage_2=stage_2)


def engine_parts(models):
    from dit_core.codecs.ltx2_video_vae import VideoDecoder, VideoEncoder
    from dit_core.families.ltx25 import LTX25
    from dit_core.sampling.ltx25 import Prompt
    from dit_core.text.gemma4 import Gemma4TextEncoder, LTX25TextConnectors, encode_prompt
    dit_file = models / "diffusion_models" / FILES["diffusion_models"]
    encoder = Gemma4TextEncoder.load(models / "text_encoders" / FILES["text_encoders"])
    video, audio_rows, _ = encode_prompt(encoder, LTX25TextConnectors.load(dit_file), PROMPT)
    return dict(transformer=LTX25.load(dit_file), positive=Prompt(video[0], audio_rows[0]),
                encoder=VideoEncoder.load(models / "vae" / FILES["vae"]),
                decoder=VideoDecoder.load(models / "vae" / FILES["vae"]))


def test_i2v_graph_equals_the_engine(ltx, models):
    from dit_core.codecs.ltx2_latent_upsampler import LatentUpsampler
    from dit_core.sampling.ltx25 import FirstFrame, sample_two_stage, template_stages
    (image,) = images(3, 1)
    g = i2v_graph(ltx, image)
    e = engine_parts(models)
    encode = lambda h, w: e["encoder"].encode(resized(image, h, w))  # noqa: E731
    assert torch.equal(g["first"]["samples"][:, :, :1], encode(1, 2))
    assert g["first"]["noise_mask"].flatten().tolist() == pytest.approx([0.3, 1.0, 1.0])
    assert [tuple(m.shape) for m in g["latent"]["noise_mask"].unbind()] == [(1, 1, 3, 1, 1), (1, 8, AUDIO_LATENTS, 16)]
    assert torch.equal(g["second"]["noise_mask"].flatten(), torch.tensor([0.0, 1.0, 1.0]))
    upsampler = LatentUpsampler.load(models / "latent_upscale_models" / FILES["latent_upscale_models"])
    video, audio_out = sample_two_stage(
        e["transformer"], lambda v: upsampler.upsample(v, e["decoder"].latents_mean, e["decoder"].latents_std),
        torch.zeros(1, 128, 3, HEIGHT // 64, WIDTH // 64), torch.zeros(1, 8, AUDIO_LATENTS, 16), float(FPS),
        e["positive"], stages=template_stages(TEMPLATE_SEED), first_frame=FirstFrame(encode))
    got_video, got_audio = g["stage_2"]["samples"].tensors
    assert torch.equal(got_video, video) and torch.equal(got_audio, audio_out)
    assert torch.equal(got_video[:, :, :1], encode(2, 4))  # stage 2 keeps the frame whole
    assert "noise_mask" in g["stage_2"]  # SamplerCustomAdvanced's output keeps the latent's mask


def flf2v_graph(ltx, first, last, seed=5, eta=0.0):
    """video_ltx2_5_flf2v's sampling: Add Guide at frame 0 then at -1 (0.7 each) on the empty latent, Concat AV,
    one stage (the distilled sigmas, SamplerEulerAncestral's eta 0 and s_noise 1), Separate, Crop Guides."""
    g = loaders(ltx)
    empty = NODES_TEST.empty_ltxv_latent_video(WIDTH, HEIGHT, LENGTH)
    positive, negative, latent = run(ltx.LTX25AddGuide, positive=g["positive"], negative=g["negative"],
                                     vae=g["video_vae"], latent=empty, image=first, frame_idx=0, strength=0.7)
    positive, negative, guided = run(ltx.LTX25AddGuide, positive=positive, negative=negative, vae=g["video_vae"],
                                     latent=latent, image=last, frame_idx=-1, strength=0.7)
    (joined,) = run(ltx.LTX25ConcatAVLatent, video_latent=guided, audio_latent=g["audio_latent"])
    sampled = sampler(ltx, g, joined, seed, STAGE_1_SIGMAS, positive, negative, eta=eta, s_noise=1.0)
    video, _ = run(ltx.LTX25SeparateAVLatent, av_latent=sampled)
    cropped = run(ltx.LTX25CropGuides, positive=positive, negative=negative, latent=video)
    return dict(g, guided_positive=positive, guided=guided, sampled=sampled, cropped=cropped)


def test_flf2v_graph_equals_the_engine(ltx, models, comfy):
    from comfy.ldm.lightricks.symmetric_patchifier import SymmetricPatchifier, latent_to_pixel_coords

    from dit_core.sampling.ltx25 import (Stage, add_guide, crop_guides, guide_frame, manual_sigmas, packed_model,
                                         sample_stage)
    first, last = images(4)
    g = flf2v_graph(ltx, first, last)
    e = engine_parts(models)
    size = (HEIGHT // 32, WIDTH // 32)
    video = torch.zeros(1, 128, 3, *size)
    video, mask, guides = add_guide(video, None, (), e["encoder"].encode(resized(first, *size)), 0, 0.7)
    end, _ = guide_frame(-1, 3, 1)
    video, mask, guides = add_guide(video, mask, guides, e["encoder"].encode(resized(last, *size)), end, 0.7)
    assert torch.equal(g["guided"]["samples"], video) and torch.equal(g["guided"]["noise_mask"], mask)
    audio_in = torch.zeros(1, 8, AUDIO_LATENTS, 16)
    net = packed_model(e["transformer"], [video.shape, audio_in.shape], float(FPS), video_mask=mask[0, 0],
                       guides=guides)
    want_video, want_audio = sample_stage(net, video, audio_in, Stage(manual_sigmas(STAGE_1_SIGMAS), 5),
                                          e["positive"], denoise_mask=(mask, None), eta=0.0, s_noise=1.0)
    got_video, got_audio = g["sampled"]["samples"].tensors
    assert torch.equal(got_video, want_video) and torch.equal(got_audio, want_audio)
    # eta reaches the engine: the sampler's default (1, KSamplerSelect's euler_ancestral) samples another latent
    default = flf2v_graph(ltx, first, last, eta=1.0)["sampled"]["samples"].tensors[0]
    assert not torch.equal(default, got_video)
    positive, negative, cropped = g["cropped"]
    assert torch.equal(cropped["samples"], crop_guides(want_video, mask, guides)[0])
    assert cropped["samples"].shape == (1, 128, 3, *size) and cropped["noise_mask"].shape == (1, 1, 3, 1, 1)
    assert positive[0][1]["keyframe_idxs"] is None and negative[0][1]["guide_attention_entries"] is None
    # the positions as ComfyUI's LTXVAddGuide writes them: the patchifier's coordinates of a one-frame latent,
    # latent_to_pixel_coords with the causal fix (start and end), moved to frames 0 and 16 (-1: 8 (3 - 1) + 1 - 1)
    coords = SymmetricPatchifier(1).get_latent_coords(1, *size, 1, "cpu")
    want = torch.cat([torch.stack([latent_to_pixel_coords(c, (8, 32, 32), causal_fix=True) for c in
                                   (coords, coords + 1)], dim=-1) + torch.tensor([frame, 0, 0])[None, :, None, None]
                      for frame in (0, 16)], dim=2)
    extra = g["guided_positive"][0][1]
    assert torch.equal(extra["keyframe_idxs"], want)
    assert [(e["pre_filter_count"], e["strength"], e["latent_shape"]) for e in extra["guide_attention_entries"]] == \
        [(math.prod(size), 0.7, [1, *size])] * 2


def test_errors_name_node_and_input(ltx, models):
    from swiftdit_pack.nodes.base import SwiftDiTError
    g = loaders(ltx)
    (image,) = images(5, 1)
    empty = NODES_TEST.empty_ltxv_latent_video(WIDTH, HEIGHT, LENGTH)
    av = NODES_TEST.concat_av(empty, g["audio_latent"])
    inplace = dict(vae=g["video_vae"], image=image, latent=empty, strength=1.0, bypass=False)
    guide = dict(positive=g["positive"], negative=g["negative"], vae=g["video_vae"], latent=empty, image=image,
                 frame_idx=0, strength=1.0)
    for node, kw, message in [
            (ltx.LTX25ImgToVideoInplace, {**inplace, "latent": av}, "latent: not a video latent"),
            (ltx.LTX25ImgToVideoInplace, {**inplace, "vae": g["audio_vae"]}, "vae: not the LTX-2.5 video VAE"),
            (ltx.LTX25ImgToVideoInplace, {**inplace, "image": image.repeat(2, 1, 1, 1)}, "image: .*1 \\+ 8k"),
            (ltx.LTX25ImgToVideoInplace, {**inplace, "image": image.repeat(25, 1, 1, 1)},
             "image: 25 frames make 4 latent frames, more than the latent's 3"),
            (ltx.LTX25AddGuide, {**guide, "latent": av}, "latent: not a video latent"),
            (ltx.LTX25AddGuide, {**guide, "frame_idx": 40}, "frame_idx: the guide's 1 latent frames at frame 40"),
            (ltx.LTX25AddGuide, {**guide, "positive": [[g["positive"][0][0], {"keyframe_idxs": torch.zeros(
                1, 3, 5, 2, dtype=torch.long)}]]}, "positive: its guides hold 5 rows"),
            (ltx.LTX25CropGuides, dict(positive=g["positive"], negative=g["negative"], latent=av),
             "latent: not a video latent")]:
        with pytest.raises(SwiftDiTError, match=f"{node.GET_SCHEMA().node_id} · {message}"):
            run(node, **kw)
    assert run(ltx.LTX25ImgToVideoInplace, **{**inplace, "bypass": True})[0] is empty
    kw = dict(model=g["model"], seed=0, steps=8, cfg=1.0, sampler_name="euler_ancestral", scheduler="manual",
              positive=g["positive"], negative=g["negative"], latent_image=av, denoise=1.0, audio_cfg=1.0,
              sigmas=STAGE_1_SIGMAS)
    elsewhere = [[g["positive"][0][0], {"keyframe_idxs": torch.zeros(1, 3, 8, 2, dtype=torch.long)}]]
    for change, message in [
            ({"latent_image": {**av, "noise_mask": torch.ones(1, 1, 2, 1, 1)}}, "latent_image: a noise mask of"),
            ({"positive": elsewhere}, "positive: its guides' cells are not the latent's"),
            ({"eta": float("nan")}, "eta: must be a finite number in \\[0, inf\\]"),
            ({"s_noise": -1.0}, "s_noise: must be a finite number in \\[0, inf\\]")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTLTX25Sampler · {message}"):
            run(ltx.LTX25Sampler, **{**kw, **change})
