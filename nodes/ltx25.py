"""LTX-2.5 nodes, text to video + audio as the video_ltx2_5_t2v template runs it: the loaders (DiT, text encoder,
video and audio VAE, latent upscale model), text encode, LTXVEmptyLatentAudio's role, a sampler per stage (one
SamplerCustomAdvanced group of the template), the latent upsampler between the stages, the tiled video decode and
the audio decode. Stock EmptyLTXVLatentVideo, LTXVConcat/SeparateAVLatent and LTXVConditioning stay in the graph.
On the host (CPU, f32) for now: the GPU path is issue 36."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import comfy.model_management
import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.codecs.ltx2_audio_vae import LATENT_CHANNELS as AUDIO_CHANNELS, AudioDecoder  # 8
from ..dit_core.codecs.ltx2_latent_upsampler import LatentUpsampler
from ..dit_core.codecs.ltx2_video_vae import TEMPLATE_TILES, VideoDecoder
from ..dit_core.codecs.ltx2_vocoder import Vocoder
from ..dit_core.families.ltx25 import LTX25
from ..dit_core.sampling.ltx25 import STAGE_1_SIGMAS, Prompt, Stage, manual_sigmas, packed_model, sample_stage
from ..dit_core.text.gemma4 import Gemma4TextEncoder, LTX25TextConnectors
from .base import (FileHandle, ModelHandle, SwiftDiTError, checked, decode_image, file_checked, finite,
                   interrupt_check, text_conditioning)
from .family_nodes import (DiTLoaderNode, FileLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode,
                           VAELoaderNode)
from .family_settings import FamilySettings, PassSize
from .ltx25_frames import CATEGORY, FAMILY, FRAME_NODES, HOST, host_model, sampler_frames, vae_role
from .memory import LOADED, engine_device
from .types import LatentUpscaleModel, Vae

# LTXVEmptyLatentAudio's length rule, ceil(frames / fps x 25) (ComfyUI's AudioVAE.num_of_latents_from_frames:
# 16 kHz / mel hop 160 / x4 latents per second), and the "sample_rate" it writes (the audio VAE's 16 kHz).
AUDIO_LATENTS_PER_S, AUDIO_SAMPLE_RATE = 25, 16000
FRAME_RATE = 25  # the RoPE's fps where no LTXVConditioning set one (ComfyUI's LTXV extra_conds default)
SETTINGS = FamilySettings(
    schedule=None,  # no shift: each stage samples ManualSigmas' list as typed
    # a video row is one 32x32-pixel latent cell of 8 frames; the template's stage 2 (1280x704, 121 frames):
    # 16 x 22 x 40 video rows, 127 audio rows and the connectors' 1024 text rows
    pass_size=PassSize(image_row_pixels=32 * 32, default_rows=16 * 22 * 40 + 127 + 1024))


@dataclass(frozen=True)
class LoadedDiT:
    """The DiT file's two models: the transformer, and the text connectors that turn the text encoder's features
    into its prompt rows (ComfyUI's LTX-AV model runs them inside the model too)."""
    transformer: LTX25
    connectors: LTX25TextConnectors


@dataclass(frozen=True)
class AudioCodec:
    """The audio VAE file's two models: the VAE decoder (latents -> log-mel) and the vocoder (-> 48 kHz)."""
    decoder: AudioDecoder
    vocoder: Vocoder


def load_dit(handle: ModelHandle, rows: int | None = None, check=None) -> LoadedDiT:
    """The DiT on the host (rows and check: SamplerNode's memory check, not made for LTX-2.5 yet)."""
    if engine_device().type == "cuda":
        raise ValueError("LTX-2.5 runs on the host only for now, and ComfyUI computes on a CUDA GPU here: the GPU "
                         "path is issue 36 (start ComfyUI with --cpu to run it on the host)")
    return host_model("dit", handle, lambda ckpt: LoadedDiT(LTX25.load(ckpt), LTX25TextConnectors.load(ckpt)))


def load_text_encoder(handle: FileHandle) -> Gemma4TextEncoder:  # its tokenizer is the file's own
    return LOADED.get("text", (*handle.key(), str(HOST), FAMILY), lambda: Gemma4TextEncoder.load(handle.path), HOST,
                      handle.role)


load_video_vae = functools.partial(host_model, "vae", read=VideoDecoder.load, role="video")
load_audio_vae = functools.partial(host_model, "vae", read=lambda c: AudioCodec(AudioDecoder.load(c), Vocoder.load(c)),
                                   role="audio")
load_upscale_model = functools.partial(host_model, "latent_upscale", read=LatentUpsampler.load)


class LTX25Loader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTLTX25Loader", "LTX-2.5 Loader (SwiftDiT)", CATEGORY, FAMILY,
                                                 "LTX-2.5")
    DESCRIPTION = "Loads the LTX-2.5 audio-video model file (INT8 ConvRot or BF16) and its text connectors."
    SETTINGS, load = SETTINGS, staticmethod(load_dit)

    @classmethod
    def execute(cls, unet_name, weight_dtype, linears, gpu_budget_gb=0.0) -> io.NodeOutput:
        for name, value, kept in (("weight_dtype", weight_dtype, "default"), ("linears", linears, "as stored")):
            if value != kept:
                raise SwiftDiTError(f"{cls.NODE_ID} · {name}: LTX-2.5's linears run as the file stores them (INT8 "
                                    f"ConvRot or BF16) for now; set {name} to {kept!r}")
        return super().execute(unet_name, weight_dtype, linears, gpu_budget_gb)


class LTX25TextEncoderLoader(TextEncoderLoaderNode):
    TITLE, TYPE = "LTX-2.5", "ltxv"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTLTX25TextEncoderLoader", "LTX-2.5 Text Encoder Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads LTX-2.5's Gemma-4 12B text encoder with its feature projections (the 'with-proj' file)."
    load = staticmethod(load_text_encoder)


def prompt_conditioning(clip: FileHandle, text: str) -> list:
    """The prompt's features per token, video || audio [1, n, 4096 + 2048]; the sampler's DiT file turns them into
    its prompt rows (its connectors), as ComfyUI's LTX-AV model does."""
    return text_conditioning(torch.cat(load_text_encoder(clip).encode(text, interrupt_check), dim=-1))


class LTX25TextEncode(TextEncodeNode):
    TITLE = "LTX-2.5"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTLTX25TextEncode", "LTX-2.5 Text Encode (SwiftDiT)", CATEGORY
    DESCRIPTION = "The prompt's Gemma-4 features (all hidden states, projected for video and audio) as CONDITIONING."
    conditioning = staticmethod(prompt_conditioning)


class LTX25VAELoader(VAELoaderNode):
    TITLE, ROLE = "LTX-2.5 video", "video"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTLTX25VAELoader", "LTX-2.5 VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads LTX-2.5's video VAE decoder (ltx-2.5-video-vae), kept loaded beside the audio VAE."
    load = staticmethod(load_video_vae)


class LTX25AudioVAELoader(VAELoaderNode):
    TITLE, ROLE = "LTX-2.5 audio", "audio"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTLTX25AudioVAELoader", "LTX-2.5 Audio VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads LTX-2.5's audio VAE decoder and vocoder (ltx-2.5-audio-vae), kept beside the video VAE."
    load = staticmethod(load_audio_vae)


class LTX25LatentUpscaleModelLoader(FileLoaderNode):  # LatentUpscaleModelLoader's widget
    TITLE, FOLDER, INPUT, KIND = "LTX-2.5 latent upscale model", "latent_upscale_models", "model_name", "latent_upscale"
    NODE_ID, DISPLAY, CATEGORY = ("SwiftDiTLTX25LatentUpscaleModelLoader", "LTX-2.5 Latent Upscale Model Loader "
                                  "(SwiftDiT)", CATEGORY)
    DESCRIPTION = "Loads LTX-2.5's x2 spatial latent upsampler (ltx-2.5-latent-spatial-upscaler-x2)."
    load = staticmethod(load_upscale_model)

    @classmethod
    def validate_inputs(cls, model_name) -> bool | str:
        return file_checked(cls, cls.FOLDER, model_name, cls.INPUT)

    @classmethod
    def output(cls):
        return LatentUpscaleModel.Output(tooltip="The latent upsampler, for the LTX-2.5 Latent Upsampler")


def part(samples, index: int) -> torch.Tensor:
    """The video (0) or audio (-1) part of an AV latent, or the latent itself (LTXVSeparateAVLatent's output)."""
    return samples.tensors[index] if isinstance(samples, NestedTensor) else samples


class LTX25EmptyLatentAudio(io.ComfyNode):  # LTXVEmptyLatentAudio's inputs and output
    NODE_ID = "SwiftDiTLTX25EmptyLatentAudio"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Empty Latent Audio (SwiftDiT)", category=CATEGORY,
            description="The empty audio latent for a video of frames_number frames at frame_rate, as "
                        "LTXVEmptyLatentAudio: 25 latents a second, the mel bins the audio VAE reads.",
            inputs=[io.Int.Input("frames_number", default=121, min=1, max=1000,
                                 tooltip="The video's frames, 8n + 1 (121: 5 s at 24 fps)"),
                    io.Int.Input("frame_rate", default=24, min=1, max=1000, tooltip="Frames per second"),
                    io.Int.Input("batch_size", default=1, min=1, max=4096, tooltip="Latents in the batch"),
                    Vae.Input("audio_vae", tooltip="The LTX-2.5 audio VAE, from its Audio VAE Loader")],
            outputs=[io.Latent.Output(tooltip="The empty audio latent, for LTXVConcatAVLatent's audio_latent")])

    @classmethod
    def execute(cls, frames_number, frame_rate, batch_size, audio_vae) -> io.NodeOutput:
        node = cls.NODE_ID
        if frames_number % 8 != 1:
            below = frames_number - (frames_number - 1) % 8
            raise SwiftDiTError(f"{node} · frames_number: {frames_number} frames is not 8n + 1 (the video VAE's "
                                f"frames; EmptyLTXVLatentVideo floors to {below}, and sound and picture would "
                                f"differ in length); use {below} or {below + 8}")
        vae_role(node, "audio_vae", audio_vae, "audio")
        bins = load_audio_vae(audio_vae).decoder.latents_mean.numel() // AUDIO_CHANNELS
        latents = math.ceil(frames_number / frame_rate * AUDIO_LATENTS_PER_S)
        samples = torch.zeros(batch_size, AUDIO_CHANNELS, latents, bins,
                              device=comfy.model_management.intermediate_device())
        return io.NodeOutput({"samples": samples, "sample_rate": AUDIO_SAMPLE_RATE, "type": "audio"})


def prompt_rows(connectors: LTX25TextConnectors, features: torch.Tensor) -> Prompt:
    """Text Encode's features [1, n, video + audio width] through the DiT file's connectors; every row attended
    (their mask is all ones)."""
    width = connectors.video.width
    video, audio, _ = connectors(features[..., :width], features[..., width:])
    return Prompt(video[0], audio[0])


class LTX25Sampler(SamplerNode):
    """One stage of the template (a SamplerCustomAdvanced with RandomNoise, LTXVDualCFGGuider, KSamplerSelect and
    ManualSigmas) in KSampler's inputs: seed, cfg the guider's video_cfg, the sampler euler_ancestral, the scheduler
    'manual' (the sigmas widget, whose steps `steps` states), then audio_cfg and sigmas."""
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTLTX25Sampler", "LTX-2.5 KSampler (SwiftDiT)", CATEGORY,
                                                 FAMILY, "LTX-2.5")
    DESCRIPTION = ("A stage of LTX-2.5's text to video + audio as ComfyUI samples it: euler_ancestral on the AV "
                   "latent over ManualSigmas' noise levels, video and audio guided as LTXVDualCFGGuider (both 1: one "
                   "pass a step, the negative unused). The template: stage 1 from the empty latent, stage 2 (seed "
                   "42, sigmas 0.85, 0.7250, 0.4219, 0.0) after the latent upsampler.")
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 8, ("euler_ancestral",), "euler_ancestral", ("manual",), "manual"
    OUTPUT_TOOLTIP = "The AV latent, for LTXVSeparateAVLatent (then the upsampler or the decoders)"
    SETTINGS, load, NOISE_MASK = SETTINGS, staticmethod(load_dit), True  # the frame nodes' masks (ltx25_frames.py)

    @classmethod
    def extra_inputs(cls) -> list:
        return [io.Float.Input("audio_cfg", default=1.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="LTXVDualCFGGuider's audio_cfg: the sound's guidance (cfg is the video's)"),
                io.String.Input("sigmas", default=STAGE_1_SIGMAS,
                                tooltip="ManualSigmas' noise levels, falling to 0 (the template's stage 1; its stage "
                                        "2: 0.85, 0.7250, 0.4219, 0.0)")]

    @classmethod
    def checked_extra(cls, audio_cfg=1.0, sigmas=STAGE_1_SIGMAS) -> dict:
        values = manual_sigmas(sigmas)
        if len(values) < 2 or values[0] > 1 or values[-1] < 0 or (values[1:] >= values[:-1]).any():
            raise SwiftDiTError(f"{cls.NODE_ID} · sigmas: {sigmas!r} is not a falling list of noise levels within "
                                f"[0, 1] (ManualSigmas' text, e.g. {STAGE_1_SIGMAS!r})")
        return {"audio_cfg": finite(cls.NODE_ID, "audio_cfg", audio_cfg, 0.0), "sigmas": values}

    @classmethod
    def latent(cls, samples):
        parts = getattr(samples, "tensors", None)
        if not isinstance(samples, NestedTensor) or [t.dim() for t in parts] != [5, 4] or \
                [t.shape[0] for t in parts] != [1, 1]:
            got = [tuple(t.shape) for t in parts] if parts else tuple(getattr(samples, "shape", ()))
            raise SwiftDiTError(f"{cls.NODE_ID} · latent_image: not one AV latent (video [1, C, F, H, W] and audio "
                                f"[1, C, L, M], got {got}); join them with LTXVConcatAVLatent")
        return parts

    @classmethod
    def rows(cls, r):
        node, steps = cls.NODE_ID, len(r.extra["sigmas"]) - 1
        if r.steps != steps:
            raise SwiftDiTError(f"{node} · steps: {r.steps}, and sigmas has {steps} steps; set steps to {steps}")
        if r.denoise != 1:
            raise SwiftDiTError(f"{node} · denoise: the first sigma is the stage's denoise (the template's stage 2 "
                                f"starts at 0.85); set denoise to 1")
        video, audio = r.latent
        image = video[0, 0].numel() + audio.shape[2]
        return image, r.positive.shape[1], image + r.positive.shape[1]

    @classmethod
    def loaded(cls, dit, r):
        (video, audio), t, c = r.latent, dit.transformer, dit.connectors
        for name, got, want in (("latent_image", video.shape[1], t.video.proj_in.in_features),
                                ("latent_image", audio.shape[1] * audio.shape[3], t.audio.proj_in.in_features),
                                ("positive", r.positive.shape[-1], c.video.width + c.audio.width),
                                ("negative", r.negative.shape[-1], c.video.width + c.audio.width)):
            if got != want:
                raise SwiftDiTError(f"{cls.NODE_ID} · {name}: {got} values a row where this model takes {want}; make "
                                    f"it with the LTX-2.5 nodes")

    @classmethod
    def sampling(cls, dit, r):
        video, audio = r.latent
        stage = Stage(r.extra["sigmas"], r.seed, r.cfg, r.extra["audio_cfg"])
        fps = float(r.conditioning[0][1].get("frame_rate", FRAME_RATE))  # LTXVConditioning's
        positive = prompt_rows(dit.connectors, r.positive)
        one_pass = math.isclose(stage.video_cfg, 1.0) and math.isclose(stage.audio_cfg, 1.0)
        negative = None if one_pass else prompt_rows(dit.connectors, r.negative)
        mask, frames = sampler_frames(cls.NODE_ID, r.latent_image, r.conditioning, video, audio)
        net = packed_model(dit.transformer, [video.shape, audio.shape], fps, check=interrupt_check, **frames)
        return (lambda callback, should_stop: NestedTensor(sample_stage(
            net, video, audio, stage, positive, negative, mask, callback=callback, should_stop=should_stop))), \
            len(stage.sigmas) - 1


class LTX25LatentUpsampler(io.ComfyNode):  # LTXVLatentUpsampler's inputs and output
    NODE_ID = "SwiftDiTLTX25LatentUpsampler"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Latent Upsampler (SwiftDiT)", category=CATEGORY,
            description="The video latent at twice the width and height, as LTXVLatentUpsampler (un-normalized by "
                        "the video VAE's statistics, upsampled, normalized again).",
            inputs=[io.Latent.Input("samples", tooltip="The video latent, from LTXVSeparateAVLatent"),
                    LatentUpscaleModel.Input("upscale_model", tooltip="From the LTX-2.5 Latent Upscale Model Loader"),
                    Vae.Input("vae", tooltip="The LTX-2.5 video VAE, from its VAE Loader")],
            outputs=[io.Latent.Output(tooltip="The upsampled video latent, for LTXVConcatAVLatent")])

    @classmethod
    def execute(cls, samples, upscale_model, vae) -> io.NodeOutput:
        node = cls.NODE_ID
        vae_role(node, "vae", vae, "video")
        if isinstance(samples["samples"], NestedTensor):
            raise SwiftDiTError(f"{node} · samples: an AV latent; connect LTXVSeparateAVLatent's video_latent")
        decoder, upsampler = load_video_vae(vae), load_upscale_model(upscale_model)
        with checked(node, "samples"):
            upsampled = upsampler.upsample(samples["samples"], decoder.latents_mean, decoder.latents_std)
        kept = {k: v for k, v in samples.items() if k != "noise_mask"}
        return io.NodeOutput({**kept, "samples": upsampled})


class LTX25VAEDecodeTiled(io.ComfyNode):  # VAEDecodeTiled's inputs and output
    NODE_ID = "SwiftDiTLTX25VAEDecodeTiled"

    @classmethod
    def define_schema(cls):
        tile, overlap, frames, frame_overlap = TEMPLATE_TILES
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 VAE Decode (Tiled) (SwiftDiT)", category=CATEGORY,
            description="Decodes the video latent (or an AV latent's video part) to IMAGE frames in tiles, as "
                        "VAEDecodeTiled places and blends them.",
            inputs=[io.Latent.Input("samples", tooltip="The video latent, from LTXVSeparateAVLatent"),
                    Vae.Input("vae", tooltip="The LTX-2.5 video VAE, from its VAE Loader"),
                    io.Int.Input("tile_size", default=tile, min=64, max=4096, step=32, tooltip="Tile side, pixels"),
                    io.Int.Input("overlap", default=overlap, min=0, max=4096, step=32, tooltip="Tile overlap, pixels"),
                    io.Int.Input("temporal_size", default=frames, min=8, max=4096, step=4,
                                 tooltip="Frames a tile decodes"),
                    io.Int.Input("temporal_overlap", default=frame_overlap, min=4, max=4096, step=4,
                                 tooltip="Frames tiles overlap")],
            outputs=[io.Image.Output(tooltip="The video's frames, for CreateVideo")])

    @classmethod
    def execute(cls, samples, vae, tile_size, overlap, temporal_size, temporal_overlap) -> io.NodeOutput:
        node = cls.NODE_ID
        vae_role(node, "vae", vae, "video")
        for name, value in (("tile_size", tile_size), ("overlap", overlap)):
            if value % 32 or value < (64 if name == "tile_size" else 0):
                raise SwiftDiTError(f"{node} · {name}: {value} is not a multiple of 32 pixels (a latent cell)"
                                    f"{' of at least 64' if name == 'tile_size' else ''}")
        tiles = (tile_size, overlap, temporal_size, temporal_overlap)
        decoder = SimpleNamespace(decode=functools.partial(load_video_vae(vae).decode, tiles=tiles))
        return io.NodeOutput(decode_image(node, decoder, {"samples": part(samples["samples"], 0)}))


class LTX25AudioVAEDecode(io.ComfyNode):  # LTXVAudioVAEDecode's inputs and output
    NODE_ID = "SwiftDiTLTX25AudioVAEDecode"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Audio VAE Decode (SwiftDiT)", category=CATEGORY,
            description="Decodes the audio latent (or an AV latent's audio part) to 48 kHz stereo AUDIO: the audio "
                        "VAE to log-mel, then the vocoder.",
            inputs=[io.Latent.Input("samples", tooltip="The audio latent, from LTXVSeparateAVLatent"),
                    Vae.Input("audio_vae", tooltip="The LTX-2.5 audio VAE, from its Audio VAE Loader")],
            outputs=[io.Audio.Output(tooltip="The clip's sound, for CreateVideo")])

    @classmethod
    def execute(cls, samples, audio_vae) -> io.NodeOutput:
        vae_role(cls.NODE_ID, "audio_vae", audio_vae, "audio")
        codec = load_audio_vae(audio_vae)
        with checked(cls.NODE_ID, "samples"):
            mel = codec.decoder.decode(part(samples["samples"], -1), interrupt_check)
            return io.NodeOutput(codec.vocoder.audio(mel, interrupt_check))


class LTX25ConcatAVLatent(io.ComfyNode):  # LTXVConcatAVLatent's inputs and output, for a ComfyUI without it
    NODE_ID = "SwiftDiTLTX25ConcatAVLatent"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Concat AV Latent (SwiftDiT)", category=CATEGORY,
            description="The video and audio latents as one AV latent, as LTXVConcatAVLatent joins them (noise masks "
                        "too, ones where a part has none); for ComfyUI versions without it (v0.3.75).",
            inputs=[io.Latent.Input("video_latent", tooltip="The video latent (EmptyLTXVLatentVideo, the upsampler)"),
                    io.Latent.Input("audio_latent", tooltip="The audio latent (Empty Latent Audio, or the split's)")],
            outputs=[io.Latent.Output(display_name="latent", tooltip="The AV latent, for the sampler")])

    @classmethod
    def execute(cls, video_latent, audio_latent) -> io.NodeOutput:
        parts = (video_latent, audio_latent)
        joined = {**video_latent, **audio_latent, "samples": NestedTensor(tuple(p["samples"] for p in parts))}
        if any(p.get("noise_mask") is not None for p in parts):
            joined["noise_mask"] = NestedTensor(tuple(p["noise_mask"] if p.get("noise_mask") is not None
                                                      else torch.ones_like(p["samples"]) for p in parts))
        return io.NodeOutput(joined)


class LTX25SeparateAVLatent(io.ComfyNode):  # LTXVSeparateAVLatent's inputs and outputs, for a ComfyUI without it
    NODE_ID = "SwiftDiTLTX25SeparateAVLatent"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Separate AV Latent (SwiftDiT)", category=CATEGORY,
            description="An AV latent's video and audio parts (noise masks too), as LTXVSeparateAVLatent splits "
                        "them; for ComfyUI versions without it (v0.3.75).",
            inputs=[io.Latent.Input("av_latent", tooltip="The AV latent, from the sampler")],
            outputs=[io.Latent.Output("video_latent", display_name="video_latent", tooltip="The video part"),
                     io.Latent.Output("audio_latent", display_name="audio_latent", tooltip="The audio part")])

    @classmethod
    def execute(cls, av_latent) -> io.NodeOutput:
        if not isinstance(av_latent["samples"], NestedTensor):
            raise SwiftDiTError(f"{cls.NODE_ID} · av_latent: not an AV latent; connect the LTX-2.5 KSampler")
        mask = av_latent.get("noise_mask")
        masks = mask.unbind() if isinstance(mask, NestedTensor) else (None, None)
        parts = [{**av_latent, "samples": samples} for samples in av_latent["samples"].unbind()]
        for part, part_mask in zip(parts, masks):
            part.pop("noise_mask", None)
            if part_mask is not None:
                part["noise_mask"] = part_mask
        return io.NodeOutput(*parts)


NODES = [LTX25Loader, LTX25TextEncoderLoader, LTX25TextEncode, LTX25VAELoader, LTX25AudioVAELoader,
         LTX25LatentUpscaleModelLoader, LTX25EmptyLatentAudio, LTX25Sampler, LTX25LatentUpsampler, LTX25VAEDecodeTiled,
         LTX25AudioVAEDecode, LTX25ConcatAVLatent, LTX25SeparateAVLatent, *FRAME_NODES]
