"""The LTX-2.5 nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, the video_ltx2_5_t2v
template's graph with our nodes in place of its LTX model nodes against the engine called directly (text encoder and
connectors, sample_two_stage, the tiled video decode, the audio VAE and vocoder), Cancel within a step, errors naming
node and input, and the swap leaving i2v and flf2v as they are (issue 36). The stock nodes that stay in the
template's graph are stood in by their few lines (EmptyLTXVLatentVideo and LTXVConditioning as v0.3.75 has them,
LTXVConcat/SeparateAVLatent as newer ComfyUI does): ComfyUI's own `nodes` module, which comfy_extras imports, is
shadowed here by the pack's. Tiny random files: the transformer as tests/dit_core/sampling's (128 video and 8 x 16
audio latent values a row, to meet the VAEs) with the connectors of tests/dit_core/text/test_ltx25_text.py in its
file, that test's Gemma-4 text encoder, the VAEs of tests/families/test_ltx25_codecs.py, a tiny upsampler."""
import shutil

import pytest
import torch
from conftest import rel_err
from node_contract import assert_schemas_follow, run
from tiny_models import builders
from safetensors.torch import save_file

from dit_core.sampling.ltx25 import NEGATIVE_PROMPT, STAGE_1_SIGMAS, STAGE_2_SEED, STAGE_2_SIGMAS, TEMPLATE_SEED

pytest.importorskip("diffusers")
PROMPT = "a fox runs through the snow at dusk; it barks twice"
WIDTH, HEIGHT, LENGTH, FPS = 128, 64, 17, 24  # stage 1 at 64 x 32: 2 x 1 latent cells, 3 latent frames
AUDIO_LATENTS = 18  # ceil(17 / 24 x 25)
FILES = {"diffusion_models": "ltx-2.5-tiny.safetensors", "text_encoders": "gemma4-12b-with-proj-tiny.safetensors",
         "vae": "ltx-2.5-video-vae-tiny.safetensors", "latent_upscale_models": "ltx-2.5-upscaler-x2-tiny.safetensors"}
AUDIO_VAE = "ltx-2.5-audio-vae-tiny.safetensors"


TEXT = builders("dit_core/text/test_ltx25_text.py")
CODECS = builders("families/test_ltx25_codecs.py")
oracle, audio = TEXT.oracle, CODECS.audio  # their module fixtures, used here too


def codecs():
    """The pack's nodes/ltx25_codecs.py (LTX-2.5's VAE, audio and latent nodes), as ComfyUI imports the pack."""
    import swiftdit_pack.nodes.ltx25_codecs as module
    return module


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.ltx25 as ltx
    yield ltx
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()  # later tests count the models they load


@pytest.fixture(scope="module")
def models(pack, oracle, audio, tmp_path_factory):
    """The five tiny files in ComfyUI's models folders, and a Z-Image DiT (another family's)."""
    import folder_paths
    from diffusers import AutoencoderKLLTX2Video
    from tiny_models import (ltx25_comfy_layout, random_ltx2_upsampler, random_ltx25, random_z_image,
                             save_ltx2_upsampler, z_image_comfy_layout)
    root = tmp_path_factory.mktemp("models")
    for folder in FILES:
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    dit = random_ltx25(in_channels=128, out_channels=128, audio_in_channels=128, audio_out_channels=128)
    connectors = {k: v for k, v in TEXT.dit_layout(oracle).items() if "_embeddings_connector." in k}
    save_file({**ltx25_comfy_layout(dit), **connectors}, root / "diffusion_models" / FILES["diffusion_models"])
    save_file(z_image_comfy_layout(random_z_image().state_dict()), root / "diffusion_models" / "z_image.safetensors")
    shutil.copy(root / "diffusion_models" / "z_image.safetensors", root / "text_encoders")
    save_file(TEXT.text_encoder_layout(oracle), root / "text_encoders" / FILES["text_encoders"])
    CODECS.video_file(root / "vae", CODECS.randomized(AutoencoderKLLTX2Video(**CODECS.VIDEO), 0), FILES["vae"])
    shutil.copy(audio["path"], root / "vae" / AUDIO_VAE)
    save_ltx2_upsampler(random_ltx2_upsampler(in_channels=128, mid_channels=32),
                        root / "latent_upscale_models" / FILES["latent_upscale_models"])
    return root


CONTRACT = {
    "SwiftDiTLTX25Loader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb", "gpus"], "SWIFTDIT_MODEL"),
    "SwiftDiTLTX25TextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTLTX25TextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTLTX25VAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTLTX25AudioVAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTLTX25LatentUpscaleModelLoader": (["model_name"], "SWIFTDIT_LATENT_UPSCALE_MODEL"),
    "SwiftDiTLTX25EmptyLatentAudio": (["frames_number", "frame_rate", "batch_size", "audio_vae"], "LATENT"),
    "SwiftDiTLTX25Sampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative",
                              "latent_image", "denoise", "audio_cfg", "sigmas", "eta", "s_noise"], "LATENT"),
    "SwiftDiTLTX25LatentUpsampler": (["samples", "upscale_model", "vae"], "LATENT"),
    "SwiftDiTLTX25VAEDecodeTiled": (["samples", "vae", "tile_size", "overlap", "temporal_size", "temporal_overlap"],
                                    "IMAGE"),
    "SwiftDiTLTX25AudioVAEDecode": (["samples", "audio_vae"], "AUDIO"),
    "SwiftDiTLTX25ConcatAVLatent": (["video_latent", "audio_latent"], "LATENT"),
    "SwiftDiTLTX25SeparateAVLatent": (["av_latent"], ["LATENT", "LATENT"]),
    # the frame nodes (nodes/ltx25_frames.py), whose own test is tests/nodes/test_ltx25_frames.py
    "SwiftDiTLTX25ImgToVideoInplace": (["vae", "image", "latent", "strength", "bypass"], "LATENT"),
    "SwiftDiTLTX25AddGuide": (["positive", "negative", "vae", "latent", "image", "frame_idx", "strength"],
                              ["CONDITIONING", "CONDITIONING", "LATENT"]),
    "SwiftDiTLTX25CropGuides": (["positive", "negative", "latent"], ["CONDITIONING", "CONDITIONING", "LATENT"]),
}


def test_schemas_follow_the_contract(pack):
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/LTX-2.5")
    inputs = {n.GET_SCHEMA().node_id: {i.id: i for i in n.GET_SCHEMA().inputs} for n in pack.NODES}
    sampler = inputs["SwiftDiTLTX25Sampler"]
    assert (sampler["steps"].default, sampler["sampler_name"].default, sampler["scheduler"].default,
            sampler["sigmas"].default) == (8, "euler_ancestral", "manual", STAGE_1_SIGMAS)
    tiled = inputs["SwiftDiTLTX25VAEDecodeTiled"]
    assert [tiled[k].default for k in ("tile_size", "overlap", "temporal_size", "temporal_overlap")] == \
        [512, 64, 64, 16]  # the template's VAEDecodeTiled
    assert inputs["SwiftDiTLTX25TextEncoderLoader"]["type"].default == "ltxv"
    from swiftdit_pack.nodes import NODES_BY_FAMILY
    assert NODES_BY_FAMILY["ltx25"] == pack.NODES


# The template's stock nodes that stay stock, as ComfyUI's code does them (comfy_extras/nodes_lt.py).
def empty_ltxv_latent_video(width, height, length):  # EmptyLTXVLatentVideo, batch 1
    return {"samples": torch.zeros(1, 128, (length - 1) // 8 + 1, height // 32, width // 32)}


def ltxv_conditioning(conditioning, frame_rate):  # LTXVConditioning: node_helpers.conditioning_set_values
    return [[rows, {**extra, "frame_rate": frame_rate}] for rows, extra in conditioning]


def concat_av(video, audio):  # LTXVConcatAVLatent
    from comfy.nested_tensor import NestedTensor
    return {**video, **audio, "samples": NestedTensor((video["samples"], audio["samples"]))}


def separate_av(av):  # LTXVSeparateAVLatent
    video, audio = av["samples"].unbind()
    return {**av, "samples": video}, {**av, "samples": audio}


def test_av_latent_twins_are_the_stock_plumbing(pack):
    """Concat / Separate AV Latent (for ComfyUI v0.3.75, which lacks the stock two) give what the stock nodes give;
    a noise mask on one part is joined with ones for the other and split back."""
    from swiftdit_pack.nodes.base import SwiftDiTError
    video = {"samples": torch.randn(1, 128, 3, 1, 2)}
    audio = {"samples": torch.randn(1, 8, 18, 16), "sample_rate": 16000, "type": "audio"}
    (joined,) = run(codecs().LTX25ConcatAVLatent, video_latent=video, audio_latent=audio)
    want = concat_av(video, audio)
    assert joined.keys() == want.keys() and all(
        torch.equal(a, b) for a, b in zip(joined["samples"].unbind(), want["samples"].unbind()))
    for got, part in zip(run(codecs().LTX25SeparateAVLatent, av_latent=joined), separate_av(joined)):
        assert got.keys() == part.keys() and torch.equal(got["samples"], part["samples"])
    mask = torch.rand(1, 1, 3, 1, 2)
    (joined,) = run(codecs().LTX25ConcatAVLatent, video_latent={**video, "noise_mask": mask}, audio_latent=audio)
    video_part, audio_part = run(codecs().LTX25SeparateAVLatent, av_latent=joined)
    assert torch.equal(video_part["noise_mask"], mask) and torch.equal(audio_part["noise_mask"],
                                                                       torch.ones_like(audio["samples"]))
    with pytest.raises(SwiftDiTError, match="SwiftDiTLTX25SeparateAVLatent · av_latent: not an AV latent"):
        run(codecs().LTX25SeparateAVLatent, av_latent=video)


def graph(ltx, seed=TEMPLATE_SEED, cfgs=(1.0, 1.0), gpus="1"):
    """video_ltx2_5_t2v's graph (enhance off): the loaders, both encodes through LTXVConditioning, stage 1 at half
    size from the empty AV latent, the x2 upsampler, stage 2 (seed 42), the tiled and the audio decode; gpus: the
    loader's."""
    (model,) = run(ltx.LTX25Loader, unet_name=FILES["diffusion_models"], weight_dtype="default", linears="as stored",
                   gpus=gpus)
    (clip,) = run(ltx.LTX25TextEncoderLoader, clip_name=FILES["text_encoders"], type="ltxv")
    (video_vae,) = run(codecs().LTX25VAELoader, vae_name=FILES["vae"])
    (audio_vae,) = run(codecs().LTX25AudioVAELoader, vae_name=AUDIO_VAE)
    (upscaler,) = run(codecs().LTX25LatentUpscaleModelLoader, model_name=FILES["latent_upscale_models"])
    (positive,) = run(ltx.LTX25TextEncode, text=PROMPT, clip=clip)
    (negative,) = run(ltx.LTX25TextEncode, text=NEGATIVE_PROMPT, clip=clip)
    positive, negative = (ltxv_conditioning(c, FPS) for c in (positive, negative))
    (audio_latent,) = run(codecs().LTX25EmptyLatentAudio, frames_number=LENGTH, frame_rate=FPS, batch_size=1,
                          audio_vae=audio_vae)
    latent = concat_av(empty_ltxv_latent_video(WIDTH // 2, HEIGHT // 2, LENGTH), audio_latent)
    stage = dict(model=model, cfg=cfgs[0], sampler_name="euler_ancestral", scheduler="manual", positive=positive,
                 negative=negative, denoise=1.0, audio_cfg=cfgs[1])
    (stage_1,) = run(ltx.LTX25Sampler, seed=seed, steps=8, latent_image=latent, sigmas=STAGE_1_SIGMAS, **stage)
    video, audio_part = separate_av(stage_1)
    (upsampled,) = run(codecs().LTX25LatentUpsampler, samples=video, upscale_model=upscaler, vae=video_vae)
    (stage_2,) = run(ltx.LTX25Sampler, seed=STAGE_2_SEED, steps=3, latent_image=concat_av(upsampled, audio_part),
                     sigmas=STAGE_2_SIGMAS, **stage)
    video, audio_part = separate_av(stage_2)
    (frames,) = run(codecs().LTX25VAEDecodeTiled, samples=video, vae=video_vae, tile_size=512, overlap=64,
                    temporal_size=64, temporal_overlap=16)
    (sound,) = run(codecs().LTX25AudioVAEDecode, samples=audio_part, audio_vae=audio_vae)
    return dict(model=model, clip=clip, video_vae=video_vae, audio_vae=audio_vae, upscaler=upscaler,
                positive=positive, negative=negative, latent=latent, stage_2=stage_2, frames=frames, sound=sound)


def engine(models, cfgs=(1.0, 1.0), seed=TEMPLATE_SEED):
    """The same run through the engine's API: encode_prompt, sample_two_stage (template stages), decodes."""
    from dit_core.codecs.ltx2_audio_vae import AudioDecoder
    from dit_core.codecs.ltx2_latent_upsampler import LatentUpsampler
    from dit_core.codecs.ltx2_video_vae import VideoDecoder
    from dit_core.codecs.ltx2_vocoder import Vocoder
    from dit_core.families.ltx25 import LTX25
    from dit_core.sampling.ltx25 import Prompt, sample_two_stage, template_stages
    from dit_core.text.gemma4 import Gemma4TextEncoder, LTX25TextConnectors, encode_prompt
    dit_file = models / "diffusion_models" / FILES["diffusion_models"]
    encoder = Gemma4TextEncoder.load(models / "text_encoders" / FILES["text_encoders"])
    connectors = LTX25TextConnectors.load(dit_file)
    positive, negative = (Prompt(v[0], a[0]) for v, a, _ in (encode_prompt(encoder, connectors, p)
                                                              for p in (PROMPT, NEGATIVE_PROMPT)))
    decoder = VideoDecoder.load(models / "vae" / FILES["vae"])
    upsampler = LatentUpsampler.load(models / "latent_upscale_models" / FILES["latent_upscale_models"])
    video, audio = sample_two_stage(
        LTX25.load(dit_file), lambda v: upsampler.upsample(v, decoder.latents_mean, decoder.latents_std),
        torch.zeros(1, 128, 3, HEIGHT // 64, WIDTH // 64), torch.zeros(1, 8, AUDIO_LATENTS, 16), float(FPS),
        positive, negative, template_stages(seed, *cfgs))
    mel = AudioDecoder.load(models / "vae" / AUDIO_VAE).decode(audio)
    return dict(encoder=encoder, video=video, audio=audio, frames=decoder.decode(video),
                sound=Vocoder.load(models / "vae" / AUDIO_VAE).audio(mel))


def test_t2va_graph_equals_the_engine(pack, models):
    g, want = graph(pack), engine(models)
    features = torch.cat(want["encoder"].encode(PROMPT), dim=-1)  # video || audio features a token
    assert features.shape[-1] == 32 + 16 and torch.equal(g["positive"][0][0], features)
    assert g["positive"][0][1]["frame_rate"] == FPS
    assert [tuple(t.shape) for t in g["latent"]["samples"].tensors] == [(1, 128, 3, 1, 2), (1, 8, AUDIO_LATENTS, 16)]
    video, audio = g["stage_2"]["samples"].tensors
    assert video.shape == (1, 128, 3, 2, 4)  # x2 in width and height
    assert torch.equal(video, want["video"]) and torch.equal(audio, want["audio"])
    assert g["frames"].shape == (LENGTH, HEIGHT, WIDTH, 3) and torch.equal(g["frames"], want["frames"])
    assert g["sound"]["sample_rate"] == want["sound"]["sample_rate"] == 48000
    assert g["sound"]["waveform"].shape == (1, 2, (4 * AUDIO_LATENTS - 3) * 12)  # mel hop 4 x 3 (48 / 16 kHz)
    assert torch.equal(g["sound"]["waveform"], want["sound"]["waveform"])


def test_dual_cfg_and_small_tiles_equal_the_engine(pack, models):
    """Unequal video and audio guidance (both passes, the negative's rows through the connectors) and tiles smaller
    than the latent, each as the engine gives them."""
    g, want = graph(pack, seed=5, cfgs=(3.0, 7.0)), engine(models, cfgs=(3.0, 7.0), seed=5)
    assert all(torch.equal(a, b) for a, b in zip(g["stage_2"]["samples"].tensors, (want["video"], want["audio"])))
    video = separate_av(g["stage_2"])[0]
    (frames,) = run(codecs().LTX25VAEDecodeTiled, samples=video, vae=g["video_vae"], tile_size=64, overlap=32,
                    temporal_size=16, temporal_overlap=8)
    decoder = codecs().load_video_vae(g["video_vae"])
    assert torch.equal(frames, decoder.decode(want["video"], tiles=(64, 32, 16, 8)))
    assert not torch.equal(frames, g["frames"])  # tiles of 2 x 2 cells: blended, not the whole decode


def test_gpus_share_each_step_between_ranks(pack, models):
    """gpus 2 without a GPU: the transformer in two host processes (gloo), the connectors and the sampler here; both
    stages (guided: the negative's passes too) give one process's latents within f32 rounding."""
    from swiftdit_pack.nodes.memory import LOADED
    want = graph(pack, seed=5, cfgs=(3.0, 7.0))["stage_2"]["samples"].tensors
    got = graph(pack, seed=5, cfgs=(3.0, 7.0), gpus="2")["stage_2"]["samples"].tensors
    assert LOADED._held[("dit", "main")][1].transformer.world == 2
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(got, want)), [rel_err(g, w) for g, w in zip(got, want)]
    LOADED.free()


def test_progress_and_cancel_within_a_step(pack, models, monkeypatch):
    """ComfyUI's progress bar moves a step at a time; Cancel set during the first block of step 2 ends the stage
    after that block (interrupt_check after each block), before the step's second block."""
    import comfy.model_management
    import comfy.utils
    g = graph(pack)
    progress = []
    monkeypatch.setattr(comfy.utils, "PROGRESS_BAR_HOOK", lambda value, total, preview, node_id=None:
                        progress.append((value, total)))
    transformer = pack.load_dit(g["model"]).transformer
    calls, block = [], type(transformer).block

    def counted(self, *args):
        calls.append(1)
        if len(calls) == 3:  # two blocks a forward: the first block of step 2
            comfy.model_management.interrupt_current_processing(True)
        return block(self, *args)

    monkeypatch.setattr(type(transformer), "block", counted)
    with pytest.raises(comfy.model_management.InterruptProcessingException):
        run(pack.LTX25Sampler, model=g["model"], seed=1, steps=8, cfg=1.0, sampler_name="euler_ancestral",
            scheduler="manual", positive=g["positive"], negative=g["negative"], latent_image=g["latent"],
            denoise=1.0, audio_cfg=1.0, sigmas=STAGE_1_SIGMAS)
    assert len(calls) == 3 and not comfy.model_management.processing_interrupted()
    assert progress == [(1, 8)]


def test_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import ModelHandle, SwiftDiTError
    loader = dict(unet_name=FILES["diffusion_models"], weight_dtype="default", linears="as stored")
    for node, kw, message in [
            (pack.LTX25Loader, {**loader, "unet_name": "z_image.safetensors"}, "unet_name: .*LTX-2.5"),
            (pack.LTX25Loader, {**loader, "linears": "int8 convrot"}, "linears: .*set linears to 'as stored'"),
            (pack.LTX25Loader, {**loader, "weight_dtype": "fp8_e4m3fn"}, "weight_dtype: "),
            (pack.LTX25TextEncoderLoader, {"clip_name": "z_image.safetensors", "type": "ltxv"},
             "clip_name: z_image.safetensors: is not a Gemma-4 text encoder.*type ltxv"),
            (codecs().LTX25VAELoader, {"vae_name": AUDIO_VAE}, "vae_name: "),
            (codecs().LTX25AudioVAELoader, {"vae_name": FILES["vae"]}, "vae_name: .*audio VAE"),
            (codecs().LTX25LatentUpscaleModelLoader, {"model_name": "nothing.safetensors"}, "model_name: ")]:
        with pytest.raises(SwiftDiTError, match=f"{node.GET_SCHEMA().node_id} · {message}"):
            run(node, **kw)
    g = graph(pack, seed=1)
    with pytest.raises(SwiftDiTError, match=r"SwiftDiTLTX25TextEncode · text: the prompt is \d+ tokens .*more than the "
                                            r"text encoder's 1024; shorten it"):
        run(pack.LTX25TextEncode, text="a fox " * 1100, clip=g["clip"])
    empty = dict(frames_number=LENGTH, frame_rate=FPS, batch_size=1, audio_vae=g["audio_vae"])
    for change, message in [({"frames_number": 120}, "frames_number: 120 frames is not 8n \\+ 1.*use 113 or 121"),
                            ({"audio_vae": g["video_vae"]}, "audio_vae: not the LTX-2.5 audio VAE")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTLTX25EmptyLatentAudio · {message}"):
            run(codecs().LTX25EmptyLatentAudio, **{**empty, **change})
    kw = dict(model=g["model"], seed=0, steps=8, cfg=1.0, sampler_name="euler_ancestral", scheduler="manual",
              positive=g["positive"], negative=g["negative"], latent_image=g["latent"], denoise=1.0, audio_cfg=1.0,
              sigmas=STAGE_1_SIGMAS)
    for change, message in [({"model": ModelHandle("z_image", g["model"].path, "stored")}, "model: a z_image model"),
                            ({"steps": 3}, "steps: 3, and sigmas has 8 steps; set steps to 8"),
                            ({"sigmas": "0.5, 0.9, 0"}, "sigmas: '0.5, 0.9, 0' is not a falling list"),
                            ({"scheduler": "simple"}, "scheduler: 'simple' is not supported"),
                            ({"sampler_name": "euler"}, "sampler_name: 'euler' is not supported"),
                            ({"denoise": 0.5}, "denoise: the first sigma is the stage's denoise"),
                            ({"latent_image": {"samples": torch.zeros(1, 128, 3, 1, 2)}}, "latent_image: not one AV"),
                            ({"positive": [[torch.zeros(1, 5, 7), {}]]}, "positive: 7 values a row")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTLTX25Sampler · {message}"):
            run(pack.LTX25Sampler, **{**kw, **change})
    video = separate_av(g["stage_2"])[0]
    tiles = dict(tile_size=512, overlap=64, temporal_size=64, temporal_overlap=16)
    for node, kw, message in [
            (codecs().LTX25LatentUpsampler, dict(samples=g["stage_2"], upscale_model=g["upscaler"], vae=g["video_vae"]),
             "samples: an AV latent; connect LTXVSeparateAVLatent's video_latent"),
            (codecs().LTX25LatentUpsampler, dict(samples=video, upscale_model=g["upscaler"], vae=g["audio_vae"]),
             "vae: not the LTX-2.5 video VAE"),
            (codecs().LTX25VAEDecodeTiled, dict(samples=video, vae=g["video_vae"], **{**tiles, "tile_size": 500}),
             "tile_size: 500 is not a multiple"),
            (codecs().LTX25VAEDecodeTiled, dict(samples=separate_av(g["stage_2"])[1], vae=g["video_vae"], **tiles),
             "samples: .*expected LTX-2 video latents"),
            (codecs().LTX25AudioVAEDecode, dict(samples=video, audio_vae=g["audio_vae"]),
             "samples: .*expected LTX-2 audio"),
            (codecs().LTX25AudioVAEDecode, dict(samples=video, audio_vae=g["video_vae"]), "audio_vae: not the LTX-2.5")]:
        with pytest.raises(SwiftDiTError, match=f"{node.GET_SCHEMA().node_id} · {message}"):
            run(node, **kw)


def test_a_request_too_large_is_refused_before_any_work(pack, models, monkeypatch):
    """A stage whose pass cannot fit in the memory there is (here the host's, the f32 path): refused at the sampler
    before any step, naming latent_image and the fix for a video (its size or its frames)."""
    import comfy.model_management
    from swiftdit_pack.nodes.base import SwiftDiTError
    monkeypatch.setattr(comfy.model_management, "get_free_memory", lambda *a, **k: 0)
    monkeypatch.setattr(pack, "sample_stage", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(SwiftDiTError, match=r"SwiftDiTLTX25Sampler · latent_image: [\d.]+ megapixels of video .* "
                                            r"GiB of host memory .* use a smaller width and height or fewer frames"):
        graph(pack)


@pytest.mark.parametrize("name", ["video_ltx2_5_t2v", "video_ltx2_5_i2v", "video_ltx2_5_flf2v"])
def test_the_swap_writes_our_nodes_inputs(pack, name):
    """Issue 36: `swiftdit swap` takes all three templates (tests/test_swap.py: what maps to what); every node of
    ours it writes has a value for each of our node's widgets (control_after_generate aside), and its inputs are
    our node's, the wired ones of the type the swap gave the wire."""
    from official_templates import template

    from swiftdit import swap_ui
    after, report = swap_ui(template(name), "ltx25")
    assert report.not_yet == [] and report.changed
    schemas = {n.GET_SCHEMA().node_id: n.GET_SCHEMA() for n in pack.NODES}
    for node in (n for n in after["definitions"]["subgraphs"][0]["nodes"] if n["type"].startswith("SwiftDiT")):
        inputs = {i.id: i for i in schemas[node["type"]].inputs}
        widgets = [i.id for i in inputs.values() if i.get_io_type() not in ("SWIFTDIT_MODEL", "SWIFTDIT_VAE",
                                                                            "SWIFTDIT_TEXT_ENCODER", "CONDITIONING",
                                                                            "LATENT", "IMAGE",
                                                                            "SWIFTDIT_LATENT_UPSCALE_MODEL")]
        values = [v for v in node.get("widgets_values") or [] if v not in ("randomize", "fixed")]
        assert len(values) == len(widgets), (node["type"], values, widgets)
        for entry in node["inputs"]:
            assert entry["name"] in inputs, (node["type"], entry["name"])
            if entry.get("link") is not None and not entry.get("widget"):
                assert entry["type"] == inputs[entry["name"]].get_io_type(), (node["type"], entry["name"])


# --- where the text path loads (issue 34): the engine's GPU, in the file's precision -------------------------------

class Recorded:
    """A stand-in for a load that would need a GPU: records its arguments, returns itself."""

    def __init__(self, calls):
        self.calls = calls

    def load(self, path, *args, **kw):
        self.calls.append((path, kw))
        return self


def test_text_encoder_loads_on_the_engine_gpu_in_the_text_slot(pack, models, monkeypatch):
    """On a CUDA engine device the Gemma-4 file is read to it in BF16 (INT8 linears on the kernels: load()'s CUDA
    default), Cancel honoured (an open Checkpoint), in LOADED's "text" slot on that device, so make_room's give_back
    of kind "text" there takes it back; the loader's device "cpu" keeps the f32 host reference, keyed apart."""
    from swiftdit_pack.dit_core.weights import Checkpoint
    from swiftdit_pack.nodes.base import FileHandle
    from swiftdit_pack.nodes.memory import LOADED
    calls, rooms, gpu = [], [], torch.device("cuda", 0)
    monkeypatch.setattr(pack, "Gemma4TextEncoder", Recorded(calls))
    monkeypatch.setattr(pack, "engine_device", lambda: gpu)
    monkeypatch.setattr(pack, "room_before", lambda f, device, int8_kept: rooms.append(device))  # ComfyUI's free_memory there
    handle = FileHandle("text_encoder", str(models / "text_encoders" / FILES["text_encoders"]))
    try:
        encoder = pack.load_text_encoder(handle)
        assert pack.load_text_encoder(handle) is encoder and len(calls) == 1  # kept
        path, kw = calls[0]
        assert isinstance(path, Checkpoint) and kw == {"dtype": torch.bfloat16, "device": gpu} and rooms == [gpu]
        assert LOADED._held["text", handle.role][2] == gpu and str(gpu) in LOADED._held["text", handle.role][0]
        assert LOADED.give_back(1, gpu, kinds=("text",)) == 0 and ("text", handle.role) not in LOADED._held
        pack.load_text_encoder(FileHandle(handle.kind, handle.path, handle.role, "cpu"))
        assert calls[1][1] == {"dtype": torch.float32, "device": torch.device("cpu")}
        assert LOADED._held["text", handle.role][2] == torch.device("cpu")
    finally:
        LOADED.free()


def test_connectors_load_on_the_dit_gpu_in_bf16(pack, models, oracle, monkeypatch):
    """On a CUDA device read_dit reads the connectors straight to it with BF16 linears, after making room there for
    them (BF16 bytes of every connector tensor); on the host f32, as before."""
    from swiftdit_pack.dit_core.weights import Checkpoint
    calls, rooms, gpu = [], [], torch.device("cuda", 0)
    connectors = Recorded(calls)
    monkeypatch.setattr(pack, "LTX25TextConnectors", connectors)
    monkeypatch.setattr(pack, "make_room", lambda device, nbytes: rooms.append((device, nbytes)))
    ckpt = Checkpoint(models / "diffusion_models" / FILES["diffusion_models"])
    assert pack.read_dit(ckpt, gpu).connectors is connectors
    assert calls == [(ckpt, {"device": gpu, "dtype": torch.bfloat16})]
    values = sum(t.numel() for k, t in TEXT.dit_layout(oracle).items() if "_embeddings_connector." in k)
    assert rooms == [(gpu, 2 * values)]
    pack.read_dit(ckpt)
    assert calls[1] == (ckpt, {}) and len(rooms) == 1
