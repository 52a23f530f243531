"""The MiniMax H3 nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, the text to video + audio
graph against the engine called directly (text encoder, sample_t2va, both decoders), both VAEs loaded together, and
errors naming node and input. Tiny random files: the transformer as tests/families/test_minimax_h3.py builds it (24
video and 8 audio latent channels, to meet the VAEs), the text encoder as tests/dit_core/text/test_minimax_h3_text.py
(its layer 6 of 8 through a test-side adapter, as test_loading's), the VAEs as tests/dit_core/codecs' H3 tests."""

import pytest
import torch
from conftest import rel_err
from node_contract import assert_schemas_follow, pack_tokenizer_dir, run
from safetensors.torch import save_file
from tiny_models import builders, QWEN3_VL_VISION_TINY

pytest.importorskip("diffusers")
PROMPT = "a red fox runs through the snow; it barks twice"
WIDTH, HEIGHT, LENGTH = 64, 96, 22  # 4 x 6 latent cells, 17 + 5 frames -> 7 latent frames, 37 audio latents
TINY_AUDIO_CHANNELS = 8  # the tiny audio VAE's (H3's is 32)


TEXT = builders("dit_core/text/test_minimax_h3_text.py")
VIDEO_VAE = builders("dit_core/codecs/test_h3_video_vae.py")
AUDIO_VAE = builders("dit_core/codecs/test_h3_audio_vae.py")


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.minimax_h3 as h
    import swiftdit_pack.nodes.minimax_h3_codecs as codecs
    from swiftdit_pack.nodes.base import text_encoder_loader
    from swiftdit_pack.dit_core.codecs.h3_audio_vae import AudioDecoder, AudioEncoder  # the pack's (its Checkpoint)
    from swiftdit_pack.dit_core.codecs.h3_video_vae import VideoDecoder, VideoEncoder
    from swiftdit_pack.dit_core.text.qwen3_vl import MiniMaxH3TextEncoder

    class TinyH3TextEncoder(MiniMaxH3TextEncoder):  # the tiny Qwen3-VL: layer 6 of 8, its own width and tower
        @classmethod
        def load(cls, path, tokenizer_dir, **kw):
            return super().load(path, tokenizer_dir, layer=TEXT.TINY_LAYER, expected_hidden=None,
                                vision_heads=QWEN3_VL_VISION_TINY["num_heads"],
                                deepstack_layers=tuple(QWEN3_VL_VISION_TINY["deepstack_visual_indexes"]), **kw)

    class TinyAudioDecoder(AudioDecoder):  # the tiny audio VAE's two upsampling stages (H3's seven by default)
        @classmethod
        def load(cls, source, rates=AUDIO_VAE.RATES_TINY, dilations=AUDIO_VAE.DIL_TINY):
            return super().load(source, rates, dilations)

    class TinyVideoDecoder(VideoDecoder):  # the tiny video VAE's heads of 16 (H3's 64 by default)
        @classmethod
        def load(cls, source):
            return super().load(source, head_dim=16)

    class TinyVideoEncoder(VideoEncoder):  # the tiny video VAE's norm groups (H3's 32 by default)
        @classmethod
        def load(cls, source):
            return super().load(source, groups=VIDEO_VAE.CONFIG["norm_num_groups"])

    class TinyAudioEncoder(AudioEncoder):  # the tiny audio VAE's attention heads (H3's 8 by default)
        @classmethod
        def load(cls, source):
            return super().load(source, heads=AUDIO_VAE.TINY["num_attention_heads"])

    patch = pytest.MonkeyPatch()
    tiny = text_encoder_loader(TinyH3TextEncoder, h.FAMILY, int8_kept=h.TEXT_INT8_KEPT)
    patch.setattr(h, "load_text_encoder", tiny)
    patch.setattr(h.MiniMaxH3TextEncoderLoader, "load", staticmethod(tiny))
    audio = codecs.vae_loader(TinyAudioDecoder, "audio VAE", "audio_vae", torch.float32)
    patch.setattr(codecs, "load_audio_vae", audio)
    patch.setattr(h.MiniMaxH3AudioVAELoader, "load", staticmethod(audio))
    video = codecs.vae_loader(TinyVideoDecoder, "video VAE", "vae", torch.bfloat16)
    patch.setattr(codecs, "load_video_vae", video)
    patch.setattr(h.MiniMaxH3VAELoader, "load", staticmethod(video))
    video_encoder = codecs.vae_loader(TinyVideoEncoder, "video VAE", "vae", torch.float32, " encoder")
    patch.setattr(h, "load_video_encoder", video_encoder)
    patch.setattr(codecs, "load_video_encoder", video_encoder)
    patch.setattr(codecs, "load_audio_encoder", codecs.vae_loader(TinyAudioEncoder, "audio VAE", "audio_vae", None,
                                                                  " encoder"))
    patch.setattr(codecs, "AUDIO_CHANNELS", TINY_AUDIO_CHANNELS)
    h.TinyH3TextEncoder, h.TinyAudioDecoder, h.TinyAudioEncoder = TinyH3TextEncoder, TinyAudioDecoder, TinyAudioEncoder
    yield h
    patch.undo()
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()  # the two VAE slots are H3's alone: later tests count the models they load


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """The four tiny files in ComfyUI's models folders; the VAE files hold their latents_mean/std."""
    import folder_paths
    from tiny_models import (minimax_h3_comfy_layout, qwen3_vl_layout, random_minimax_h3, random_qwen3_vl,
                             random_z_image, z_image_comfy_layout)
    root = tmp_path_factory.mktemp("models")
    for folder in ("diffusion_models", "text_encoders", "vae"):
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    text = random_qwen3_vl(seed=7, num_hidden_layers=TEXT.TINY_LAYERS)
    dit = random_minimax_h3(in_channels=24, audio_in_channels=TINY_AUDIO_CHANNELS,
                            text_dim=text.config.text_config.hidden_size)
    save_file(minimax_h3_comfy_layout(dit), root / "diffusion_models" / "minimax_h3_tiny.safetensors")
    save_file(z_image_comfy_layout(random_z_image().state_dict()),
              root / "diffusion_models" / "z_image_tiny.safetensors")
    save_file(qwen3_vl_layout(text, "comfy"), root / "text_encoders" / "qwen3vl_minimax_h3_tiny.safetensors")
    video = VIDEO_VAE.tiny_vae()
    state = {k: v.contiguous() for k, v in video.state_dict().items()}
    save_file(state, root / "vae" / "h3_video_vae_no_stats.safetensors")
    save_file({**state, "latents_mean": torch.tensor(video.config.latents_mean),
               "latents_std": torch.tensor(video.config.latents_std)}, root / "vae" / "h3_video_vae.safetensors")
    g = torch.Generator().manual_seed(5)
    audio = {k: v.contiguous() for k, v in AUDIO_VAE.tiny_vae().state_dict().items()}
    save_file({**audio, "latents_mean": 0.3 * torch.randn(TINY_AUDIO_CHANNELS, generator=g),
               "latents_std": 0.5 + torch.rand(TINY_AUDIO_CHANNELS, generator=g)},
              root / "vae" / "h3_audio_vae.safetensors")
    return root


CONTRACT = {
    "SwiftDiTMiniMaxH3Loader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb", "gpus"], "SWIFTDIT_MODEL"),
    "SwiftDiTMiniMaxH3LoraLoaderModelOnly": (["model", "lora_name", "strength_model"], "SWIFTDIT_MODEL"),
    "SwiftDiTMiniMaxH3TextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTMiniMaxH3TextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTMiniMaxH3ImageToVideo": (["clip", "vae", "first_frame", "last_frame", "prompt", "width", "height",
                                       "length"],
                                     ["CONDITIONING", "LATENT"]),
    "SwiftDiTMiniMaxH3ReferenceToVideo": (["clip", "vae", "audio_vae", "prompt", "width", "height", "length",
                                           "ref_image_size", *[f"ref_image_{i}" for i in range(9)],
                                           *[f"ref_video_{i}" for i in range(3)],
                                           *[f"ref_video_audio_{i}" for i in range(3)],
                                           *[f"ref_audio_{i}" for i in range(3)]], ["CONDITIONING", "LATENT"]),
    "SwiftDiTMiniMaxH3SigmaShift": (["model", "shift_video", "shift_audio"], "SWIFTDIT_MODEL"),
    "SwiftDiTMiniMaxH3Sampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive",
                                  "negative", "latent_image", "denoise"], "LATENT"),
    "SwiftDiTMiniMaxH3VAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTMiniMaxH3AudioVAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTMiniMaxH3VAEDecode": (["samples", "vae"], "IMAGE"),
    "SwiftDiTMiniMaxH3VAEDecodeAudio": (["samples", "vae"], "AUDIO"),
}


def test_schemas_follow_the_contract(pack):
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/MiniMax H3")
    sampler = {i.id: i for i in pack.MiniMaxH3Sampler.GET_SCHEMA().inputs}
    assert (sampler["steps"].default, sampler["sampler_name"].default, sampler["scheduler"].default) == \
        (20, "res_multistep", "simple")  # the t2v template's 20 steps, sampler and scheduler
    assert sampler["sampler_name"].options == ["euler", "res_multistep"] and "beta" in sampler["scheduler"].options
    t2v = {i.id: i for i in pack.MiniMaxH3ImageToVideo.GET_SCHEMA().inputs}
    assert (t2v["width"].default, t2v["height"].default, t2v["length"].default) == (864, 480, 124)
    assert next(i for i in pack.MiniMaxH3TextEncoderLoader.GET_SCHEMA().inputs if i.id == "type").default == \
        "minimax"
    from swiftdit_pack.nodes import NODES_BY_FAMILY
    assert NODES_BY_FAMILY["minimax_h3"] == pack.NODES


def graph(h, seed=11, steps=2, length=LENGTH, shifts=None, gpus="1"):
    """The t2v template's graph with a KSampler in SamplerCustomAdvanced's place (cfg 1: BasicGuider); shifts:
    (video, audio) through a Sigma Shift node, as the r2v and FastH3 templates set them; gpus: the loader's."""
    (model,) = run(h.MiniMaxH3Loader, unet_name="minimax_h3_tiny.safetensors", weight_dtype="default",
                   linears="as stored", gpus=gpus)
    if shifts is not None:
        (model,) = run(h.MiniMaxH3SigmaShift, model=model, shift_video=shifts[0], shift_audio=shifts[1])
    (clip,) = run(h.MiniMaxH3TextEncoderLoader, clip_name="qwen3vl_minimax_h3_tiny.safetensors", type="minimax")
    (video_vae,) = run(h.MiniMaxH3VAELoader, vae_name="h3_video_vae.safetensors")
    (audio_vae,) = run(h.MiniMaxH3AudioVAELoader, vae_name="h3_audio_vae.safetensors")
    positive, latent = run(h.MiniMaxH3ImageToVideo, clip=clip, vae=video_vae, prompt=PROMPT, width=WIDTH,
                           height=HEIGHT, length=length)
    negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None}]]  # ConditioningZeroOut
    (samples,) = run(h.MiniMaxH3Sampler, model=model, seed=seed, steps=steps, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=negative, latent_image=latent, denoise=1.0)
    (frames,) = run(h.MiniMaxH3VAEDecode, samples=samples, vae=video_vae)
    (audio,) = run(h.MiniMaxH3VAEDecodeAudio, samples=samples, vae=audio_vae)
    return dict(model=model, positive=positive, negative=negative, latent=latent, samples=samples, frames=frames,
                audio=audio, video_vae=video_vae, audio_vae=audio_vae)


def test_t2va_graph_equals_the_engine(pack, models):
    from comfy.nested_tensor import NestedTensor
    from dit_core.codecs.h3_video_vae import VideoDecoder
    from dit_core.families.minimax_h3 import MiniMaxH3
    from dit_core.sampling.minimax_h3 import sample_t2va
    g = graph(pack)
    rows = pack.TinyH3TextEncoder.load(models / "text_encoders" / "qwen3vl_minimax_h3_tiny.safetensors",
                                       pack_tokenizer_dir()).encode(PROMPT)
    assert torch.equal(g["positive"][0][0], rows)
    latent = g["latent"]["samples"]
    assert isinstance(latent, NestedTensor)
    assert [tuple(t.shape) for t in latent.tensors] == [(1, 24, 7, 6, 4), (1, TINY_AUDIO_CHANNELS, 2, 37)]
    dit = MiniMaxH3.load(models / "diffusion_models" / "minimax_h3_tiny.safetensors")
    video, audio = sample_t2va(dit, rows, 7, 6, 4, 37, 2, seed=11, sampler="res_multistep", scheduler="simple")
    out = g["samples"]["samples"]
    assert isinstance(out, NestedTensor) and torch.equal(out.tensors[0], video) and torch.equal(out.tensors[1], audio)
    frames = VideoDecoder.load(models / "vae" / "h3_video_vae.safetensors", head_dim=16).decode(video)
    assert g["frames"].shape == (LENGTH, HEIGHT, WIDTH, 3) and torch.equal(g["frames"], frames)
    dec = pack.TinyAudioDecoder.load(models / "vae" / "h3_audio_vae.safetensors")
    want = dec.audio(dec.raw_latents(audio.permute(0, 2, 1, 3)))
    assert g["audio"]["sample_rate"] == 32000 and g["audio"]["waveform"].shape == (1, 2, 37 * 10)
    assert torch.equal(g["audio"]["waveform"], want["waveform"])
    assert not torch.equal(graph(pack, seed=12)["samples"]["samples"].tensors[1], audio)  # the seed is used


def test_sigma_shift(pack, models):
    """MiniMaxH3SigmaShift's two shifts reach both grids (FastH3's 10 / 3 against the engine's); out of range named."""
    from dit_core.families.minimax_h3 import MiniMaxH3
    from dit_core.sampling.minimax_h3 import sample_t2va
    from swiftdit_pack.nodes.base import SwiftDiTError
    g = graph(pack, shifts=(10.0, 2.0))
    dit = MiniMaxH3.load(models / "diffusion_models" / "minimax_h3_tiny.safetensors")
    want = sample_t2va(dit, g["positive"][0][0], 7, 6, 4, 37, 2, seed=11, video_shift=10.0, audio_shift=2.0,
                       sampler="res_multistep", scheduler="simple")
    assert all(torch.equal(a, b) for a, b in zip(g["samples"]["samples"].tensors, want))
    (model,) = run(pack.MiniMaxH3SigmaShift, model=g["model"], shift_video=12.0, shift_audio=3.0)
    assert model.schedule == g["model"].schedule.at(12.0, 3.0)
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3SigmaShift · shift_audio: .*got 0.0"):
        run(pack.MiniMaxH3SigmaShift, model=g["model"], shift_video=12.0, shift_audio=0.0)


def test_gpus_share_each_step_between_ranks(pack, models):
    """gpus 2 on a host without a GPU: two host processes (gloo) run each step's blocks, the sampler here; the
    same latents as one process within f32 rounding. The loader says where the model is; freeing ComfyUI's models
    stops the ranks; more ranks than cores is refused on the loader."""
    import os

    import comfy.utils
    from swiftdit_pack.nodes.base import SwiftDiTError
    from swiftdit_pack.nodes.memory import LOADED
    want = graph(pack)["samples"]["samples"].tensors
    got = graph(pack, gpus="2")
    ranked = LOADED._held[("dit", "main")][1]
    assert ranked.world == 2 and got["model"].gpus == 2
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(got["samples"]["samples"].tensors, want))
    processes = ranked._pool._processes

    class KillingBar(comfy.utils.ProgressBar):  # rank 1 dies after the first step
        def update_absolute(self, value, total=None, preview=None):
            processes[1].kill()
            processes[1].join()

    with pytest.MonkeyPatch.context() as patch, \
            pytest.raises(SwiftDiTError, match=r"SwiftDiTMiniMaxH3Sampler · latent_image: sequence parallel: rank 1 "
                                               r"of 2 failed: its process exited .* the other ranks were stopped"):
        patch.setattr(comfy.utils, "ProgressBar", KillingBar)
        graph(pack, gpus="2")
    assert not ranked.alive and not any(p.is_alive() for p in processes)
    again = graph(pack, gpus="2")["samples"]["samples"].tensors
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(again, want))
    ranked = LOADED._held[("dit", "main")][1]
    processes = ranked._pool._processes
    LOADED.free()
    assert not ranked.alive and not any(p.is_alive() for p in processes)
    with pytest.MonkeyPatch.context() as patch:  # two GPUs and a PyTorch without NCCL (Windows builds)
        import swiftdit_pack.nodes.base as base
        patch.setattr(base, "engine_device", lambda: torch.device("cuda", 0))
        patch.setattr(torch.cuda, "device_count", lambda: 2)
        patch.setattr(torch.distributed, "is_nccl_available", lambda: False)
        with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3Loader · gpus: .* NCCL, which this PyTorch lacks"):
            base.rank_count(pack.MiniMaxH3Loader.NODE_ID, "2")
        assert base.rank_count(pack.MiniMaxH3Loader.NODE_ID, "1") == 1
    too_many = next((n for n in ("2", "4", "8") if int(n) > (os.cpu_count() or 1)), None)
    if too_many is None:
        return
    with pytest.raises(SwiftDiTError, match=f"SwiftDiTMiniMaxH3Loader · gpus: {too_many} asked, .* set gpus to"):
        run(pack.MiniMaxH3Loader, unet_name="minimax_h3_tiny.safetensors", weight_dtype="default",
            linears="as stored", gpus=too_many)


def test_both_vaes_stay_loaded(pack, models):
    import swiftdit_pack.nodes.minimax_h3_codecs as codecs
    from swiftdit_pack.nodes.memory import LOADED
    g = graph(pack, steps=1)
    video, audio = codecs.load_video_vae(g["video_vae"]), codecs.load_audio_vae(g["audio_vae"])
    assert LOADED._held[("vae", "video")][1] is video and LOADED._held[("vae", "audio")][1] is audio
    run(pack.MiniMaxH3VAEDecode, samples=g["samples"], vae=g["video_vae"])  # decoding one keeps the other
    assert codecs.load_audio_vae(g["audio_vae"]) is audio and codecs.load_video_vae(g["video_vae"]) is video


def test_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import ModelHandle, SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3Loader · unet_name: .*MiniMax H3"):
        run(pack.MiniMaxH3Loader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears="as stored")
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3VAELoader · vae_name: .*no latents_mean/latents_std"):
        run(pack.MiniMaxH3VAELoader, vae_name="h3_video_vae_no_stats.safetensors")
    g = graph(pack, steps=1)
    clip = run(pack.MiniMaxH3TextEncoderLoader, clip_name="qwen3vl_minimax_h3_tiny.safetensors", type="minimax")[0]
    t2v = dict(clip=clip, prompt=PROMPT, width=WIDTH, height=HEIGHT, length=LENGTH)
    for change, message in [({"length": 124 - 1}, "length: 123 frames is not 17n \\+ 5.*use 107 or 124"),
                            ({"length": 4}, "length: 4 frames is not 17n \\+ 5.*use 5"),
                            ({"width": 48}, "width: 48 is not a multiple of 32")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTMiniMaxH3ImageToVideo · {message}"):
            run(pack.MiniMaxH3ImageToVideo, **{**t2v, **change})
    kw = dict(model=g["model"], seed=0, steps=1, cfg=1.0, sampler_name="euler", scheduler="simple",
              positive=g["positive"], negative=g["negative"], latent_image=g["latent"], denoise=1.0)
    for change, message in [({"model": ModelHandle("z_image", g["model"].path, "stored")}, "model: a z_image model"),
                            ({"cfg": 3.0}, "cfg: H3 is guidance-distilled"), ({"denoise": 0.5}, "denoise: "),
                            ({"sampler_name": "dpmpp_2m"}, "sampler_name: 'dpmpp_2m' is not supported"),
                            ({"latent_image": {"samples": torch.zeros(1, 24, 7, 6, 4)}}, "latent_image: not MiniMax"),
                            ({"positive": [[torch.zeros(1, 5, 7), {}]]}, "positive: 7 channels")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTMiniMaxH3Sampler · {message}"):
            run(pack.MiniMaxH3Sampler, **{**kw, **change})
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3VAEDecodeAudio · vae: a MiniMax H3 video VAE"):
        run(pack.MiniMaxH3VAEDecodeAudio, samples=g["samples"], vae=g["video_vae"])
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3VAEDecode · vae: a MiniMax H3 audio VAE"):
        run(pack.MiniMaxH3VAEDecode, samples=g["samples"], vae=g["audio_vae"])


def test_a_request_too_large_is_refused_before_any_work(pack, models, monkeypatch):
    """A video whose pass cannot fit in the memory there is: refused at the sampler before any step, naming
    latent_image and the fix for a video (its size or its frames)."""
    import comfy.model_management
    from swiftdit_pack.nodes.base import SwiftDiTError
    monkeypatch.setattr(comfy.model_management, "get_free_memory", lambda *a, **k: 0)
    monkeypatch.setattr(pack, "sample_t2va", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(SwiftDiTError, match=r"SwiftDiTMiniMaxH3Sampler · latent_image: [\d.]+ megapixels of video .* "
                                            r"GiB of host memory .* use a smaller width and height or fewer frames"):
        graph(pack, steps=1)


def test_first_and_last_frame(pack, models):
    """Image To Video with frames as ComfyUI's: the first frame stretched and the last one cropped to the canvas
    (lanczos), each encoded by the video VAE (the posterior mean, one latent frame) into the positive's
    minimax_keyframes at frames 0 and length - 1; the sampler adds them as keyframe rows (sample_t2va's keyframes)."""
    import comfy.utils
    from dit_core.codecs.h3_video_vae import VideoEncoder
    from dit_core.families.minimax_h3 import MiniMaxH3
    from dit_core.sampling.minimax_h3 import sample_t2va
    gen = torch.Generator().manual_seed(2)
    first, last = torch.rand(2, 50, 70, 3, generator=gen), torch.rand(1, 120, 60, 3, generator=gen)
    (clip,) = run(pack.MiniMaxH3TextEncoderLoader, clip_name="qwen3vl_minimax_h3_tiny.safetensors", type="minimax")
    (vae,) = run(pack.MiniMaxH3VAELoader, vae_name="h3_video_vae.safetensors")
    positive, latent = run(pack.MiniMaxH3ImageToVideo, clip=clip, vae=vae, first_frame=first, last_frame=last,
                           prompt=PROMPT, width=WIDTH, height=HEIGHT, length=LENGTH)
    encoder = VideoEncoder.load(models / "vae" / "h3_video_vae.safetensors", groups=VIDEO_VAE.CONFIG["norm_num_groups"])
    kf = positive[0][1]["minimax_keyframes"]
    assert [k["resolved_frame_index"] for k in kf] == [0, LENGTH - 1]
    pictures = []
    for k, image, crop in ((kf[0], first, "disabled"), (kf[1], last, "center")):
        pixels = comfy.utils.common_upscale(image[:1].movedim(-1, 1), WIDTH, HEIGHT, "lanczos", crop).movedim(1, -1)
        assert torch.equal(k["latent"], encoder.encode(pixels, tile=None))
        assert k["latent"].shape == (1, 24, 1, HEIGHT // 16, WIDTH // 16)
        pictures.append(pixels)
    # the frames are the prompt's pictures too ("<Picture 1>: " and its vision rows first), tagged as video rows
    rows, tags = pack.TinyH3TextEncoder.load(models / "text_encoders" / "qwen3vl_minimax_h3_tiny.safetensors",
                                             pack_tokenizer_dir()).encode_tagged(PROMPT, pictures)
    assert torch.equal(positive[0][0], rows) and torch.equal(positive[0][1]["text_token_tags"], tags)
    assert (tags == 0).any() and (tags == 1).any()
    (model,) = run(pack.MiniMaxH3Loader, unet_name="minimax_h3_tiny.safetensors", weight_dtype="default",
                   linears="as stored")
    (samples,) = run(pack.MiniMaxH3Sampler, model=model, seed=4, steps=2, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=positive, latent_image=latent, denoise=1.0)
    dit = MiniMaxH3.load(models / "diffusion_models" / "minimax_h3_tiny.safetensors")
    video, audio = sample_t2va(dit, positive[0][0], 7, 6, 4, 37, 2, seed=4, sampler="res_multistep",
                               keyframes=(("first", kf[0]["latent"]), ("last", kf[1]["latent"])), text_tags=tags)
    assert torch.equal(samples["samples"].tensors[0], video) and torch.equal(samples["samples"].tensors[1], audio)
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3ImageToVideo · vae: a first or last frame"):
        run(pack.MiniMaxH3ImageToVideo, clip=clip, first_frame=first, prompt=PROMPT, width=WIDTH, height=HEIGHT,
            length=LENGTH)


def test_text_to_image(pack, models):
    """The t2i template's graph: Text Encode, EmptyLatentImage's zeros (48 x 56 pixels: 6 x 7 -> 3 x 4 cells, an
    odd side), our sampler (one frame, two audio latents, as ComfyUI's MiniMaxH3AV makes of an empty image), the
    video part (LTXVSeparateAVLatent's output) into our VAE Decode: one IMAGE."""
    from dit_core.families.minimax_h3 import MiniMaxH3
    from dit_core.sampling.minimax_h3 import sample_t2va
    (model,) = run(pack.MiniMaxH3Loader, unet_name="minimax_h3_tiny.safetensors", weight_dtype="default",
                   linears="as stored")
    (clip,) = run(pack.MiniMaxH3TextEncoderLoader, clip_name="qwen3vl_minimax_h3_tiny.safetensors", type="minimax")
    (positive,) = run(pack.MiniMaxH3TextEncode, clip=clip, text=PROMPT)
    empty = {"samples": torch.zeros(1, 4, 6, 7), "downscale_ratio_spacial": 8}
    (samples,) = run(pack.MiniMaxH3Sampler, model=model, seed=3, steps=2, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=positive, latent_image=empty, denoise=1.0)
    video, audio = samples["samples"].tensors
    dit = MiniMaxH3.load(models / "diffusion_models" / "minimax_h3_tiny.safetensors")
    want = sample_t2va(dit, positive[0][0], 1, 3, 4, 2, 2, seed=3, sampler="res_multistep")
    assert torch.equal(video, want[0]) and torch.equal(audio, want[1])
    (vae,) = run(pack.MiniMaxH3VAELoader, vae_name="h3_video_vae.safetensors")
    (image,) = run(pack.MiniMaxH3VAEDecode, samples={"samples": video}, vae=vae)
    assert image.shape == (1, 48, 64, 3)
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTMiniMaxH3Sampler · latent_image: an image latent"):
        run(pack.MiniMaxH3Sampler, model=model, seed=3, steps=2, cfg=1.0, sampler_name="res_multistep",
            scheduler="simple", positive=positive, negative=positive, latent_image={"samples": torch.ones(1, 4, 6, 7)},
            denoise=1.0)


def test_reference_to_video(pack, models):
    """Reference To Video as ComfyUI's: each reference image resized (lanczos, no crop; 'match': down to the
    video's area, sides to multiples of 32) is the prompt's "<Picture i>" and, with the video VAE, an image block of
    its latent; a reference audio is "<Audio j>" and, with the audio VAE, an audio block; the sampler adds the blocks
    as reference rows (sample_t2va's references) to the same numbers as the engine. A reference video (IMAGE frames)
    is resized to its own canvas (here its sides rounded to 32s), cut to length (17n + 5 frames) and, with its
    soundtrack, a video_audio block after the images. The prompt shows, as ComfyUI's node hands minimax_ref_items to
    its tokenizer: the images, the video's soundtrack "<Audio 1>", "<Video 1>" with its frames 0 and 12 of the 22
    (range(0, 22, 12): 2 fps) as one timestamped block, the standalone audio "<Audio 2>". A video of 5 frames (stock
    takes 5 or more) shows its first frame alone; a soundtrack without its video is unused, as stock leaves it."""
    import comfy.utils
    from dit_core.codecs.h3_video_vae import VideoEncoder
    from dit_core.families.minimax_h3 import MiniMaxH3, Reference
    from dit_core.sampling.minimax_h3 import sample_t2va
    from dit_core.text.qwen3_vl_video import PromptReference
    from swiftdit_pack.nodes.base import SwiftDiTError
    gen = torch.Generator().manual_seed(9)
    wide, tall = torch.rand(1, 50, 70, 3, generator=gen), torch.rand(2, 120, 60, 3, generator=gen)
    voice = {"waveform": 0.3 * torch.randn(1, 1, 300, generator=gen), "sample_rate": 32000}
    clip_frames = torch.rand(30, 40, 70, 3, generator=gen)
    track = {"waveform": 0.3 * torch.randn(1, 2, 200, generator=gen), "sample_rate": 32000}
    (clip,) = run(pack.MiniMaxH3TextEncoderLoader, clip_name="qwen3vl_minimax_h3_tiny.safetensors", type="minimax")
    (vae,) = run(pack.MiniMaxH3VAELoader, vae_name="h3_video_vae.safetensors")
    (audio_vae,) = run(pack.MiniMaxH3AudioVAELoader, vae_name="h3_audio_vae.safetensors")
    r2v = dict(clip=clip, prompt=PROMPT, width=WIDTH, height=HEIGHT, length=LENGTH, ref_image_size="match",
               ref_image_0=wide, ref_image_3=tall, ref_audio_1=voice, ref_video_1=clip_frames,
               ref_video_audio_1=track)
    positive, latent = run(pack.MiniMaxH3ReferenceToVideo, vae=vae, audio_vae=audio_vae, **r2v)
    blocks = positive[0][1]["minimax_refs"]
    assert [(b["kind"], b.get("latent_h"), b.get("latent_w")) for b in blocks] == [
        ("image", 4, 4), ("image", 6, 4), ("video_audio", 2, 4), ("audio", None, None)]
    encoder = VideoEncoder.load(models / "vae" / "h3_video_vae.safetensors", groups=VIDEO_VAE.CONFIG["norm_num_groups"])
    pictures = []
    for block, image, (h, w) in ((blocks[0], wide, (64, 64)), (blocks[1], tall, (96, 64))):
        pixels = comfy.utils.common_upscale(image[:1].movedim(-1, 1), w, h, "lanczos", "disabled").movedim(1, -1)
        assert torch.equal(block["latent"], encoder.encode(pixels, tile=None))
        pictures.append(pixels)
    frames = comfy.utils.common_upscale(clip_frames[:22].movedim(-1, 1), 64, 32, "lanczos", "disabled").movedim(1, -1)
    assert torch.equal(blocks[2]["latent"], encoder.encode(frames, tile=None)) and blocks[2]["latent_t"] == 7
    audio_encoder = pack.TinyAudioEncoder.load(models / "vae" / "h3_audio_vae.safetensors")
    sound, soundtrack = audio_encoder.encode(voice["waveform"], 32000), audio_encoder.encode(track["waveform"], 32000)
    assert torch.equal(blocks[3]["audio_latent"], sound) and blocks[3]["ref_audio_t"] == 30
    assert torch.equal(blocks[2]["audio_latent"], soundtrack) and blocks[2]["ref_audio_t"] == 20
    text_encoder = pack.TinyH3TextEncoder.load(models / "text_encoders" / "qwen3vl_minimax_h3_tiny.safetensors",
                                               pack_tokenizer_dir())
    read = comfy.utils.common_upscale(clip_frames[[0, 12]].movedim(-1, 1), 64, 32, "lanczos", "disabled").movedim(1, -1)
    shown = [PromptReference("image", pictures[0]), PromptReference("image", pictures[1]),
             PromptReference("video", read, has_audio=True, fps=2.0), PromptReference("audio")]
    rows, tags = text_encoder.encode_references(PROMPT, shown)
    assert torch.equal(positive[0][0], rows) and torch.equal(positive[0][1]["text_token_tags"], tags)
    assert [tuple(t.shape) for t in latent["samples"].tensors] == [(1, 24, 7, 6, 4), (1, TINY_AUDIO_CHANNELS, 2, 37)]
    (model,) = run(pack.MiniMaxH3Loader, unet_name="minimax_h3_tiny.safetensors", weight_dtype="default",
                   linears="as stored")
    (samples,) = run(pack.MiniMaxH3Sampler, model=model, seed=4, steps=2, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=positive, latent_image=latent, denoise=1.0)
    dit = MiniMaxH3.load(models / "diffusion_models" / "minimax_h3_tiny.safetensors")
    refs = (Reference("image", blocks[0]["latent"]), Reference("image", blocks[1]["latent"]),
            Reference("video", blocks[2]["latent"], soundtrack), Reference("audio", audio=sound))
    video, audio = sample_t2va(dit, rows, 7, 6, 4, 37, 2, seed=4, sampler="res_multistep", text_tags=tags,
                               references=refs)
    assert torch.equal(samples["samples"].tensors[0], video) and torch.equal(samples["samples"].tensors[1], audio)
    text_only, _ = run(pack.MiniMaxH3ReferenceToVideo, **r2v)  # no VAEs: the references label the prompt only
    assert "minimax_refs" not in text_only[0][1] and torch.equal(text_only[0][0], rows)
    short, _ = run(pack.MiniMaxH3ReferenceToVideo, **{**r2v, "ref_video_1": clip_frames[:5]})
    first = comfy.utils.common_upscale(clip_frames[:1].movedim(-1, 1), 64, 32, "lanczos", "disabled").movedim(1, -1)
    want = text_encoder.encode_references(PROMPT, [*shown[:2], PromptReference("video", first, True, 2.0), shown[3]])
    assert torch.equal(short[0][0], want[0]) and torch.equal(short[0][1]["text_token_tags"], want[1])
    orphan, _ = run(pack.MiniMaxH3ReferenceToVideo, **{**r2v, "ref_video_audio_0": track})
    assert torch.equal(orphan[0][0], rows)
    for change, message in [({"vae": audio_vae}, "vae: a MiniMax H3 audio VAE where the video VAE goes"),
                            ({"audio_vae": audio_vae, "ref_audio_1": {**voice, "sample_rate": 44100}},
                             "ref_audio_1: audio: 44100 Hz"),
                            ({"ref_image_size": "huge"}, "ref_image_size: .*'match' or 'max'"),
                            ({"ref_video_1": clip_frames[:4]}, "ref_video_1: a reference video has at least 5 frames"),
                            ({"ref_video_1": track}, "ref_video_1: IMAGE frames")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTMiniMaxH3ReferenceToVideo · {message}"):
            run(pack.MiniMaxH3ReferenceToVideo, **{**r2v, **change})


def test_the_text_encoder_keeps_its_int8_linears_on_a_gpu(swiftdit_pack, tmp_path, monkeypatch):
    """On a CUDA engine device H3's 32B encoder keeps its INT8 linears (the NVFP4 file's read as INT8 too) on the
    INT8 kernels, its room asked for the codes as stored; the image families' 4B encoders dequantize to BF16 there;
    the loader's device cpu is the f32 host reference either way."""
    from swiftdit_pack.dit_core.text.qwen3 import Qwen3TextEncoder
    from swiftdit_pack.dit_core.text.qwen3_vl import MiniMaxH3TextEncoder
    from swiftdit_pack.nodes import base, minimax_h3, z_image
    gpu, loads, rooms = torch.device("cuda", 0), [], []
    monkeypatch.setattr(base, "engine_device", lambda: gpu)
    monkeypatch.setattr(base, "room_before", lambda f, device, int8_kept=False, streams=False:
                        rooms.append((device, int8_kept)) and False)
    monkeypatch.setattr(base, "cancellable", lambda load, path: load(path))
    monkeypatch.setattr(base.LOADED, "get", lambda kind, key, load, device, role: load())
    monkeypatch.setattr(base.LOADED, "attached", lambda kind, name, make, role: make())  # (nothing held here)
    for cls in (MiniMaxH3TextEncoder, Qwen3TextEncoder):
        monkeypatch.setattr(cls, "load", classmethod(lambda c, f, tokenizer_dir, **kw: loads.append(kw)))
    path = tmp_path / "text.safetensors"
    path.write_bytes(b"")
    for module, device in ((minimax_h3, "default"), (z_image, "default"), (minimax_h3, "cpu")):
        module.load_text_encoder(base.FileHandle("text_encoder", str(path), device=device))
    assert [(kw["dtype"], kw["device"], kw["int8_linears"]) for kw in loads] == [
        (torch.bfloat16, gpu, True), (torch.bfloat16, gpu, False), (torch.float32, torch.device("cpu"), False)]
    assert rooms == [(gpu, True), (gpu, False), (torch.device("cpu"), True)]
