"""LTX-2.5's VAE, audio and latent nodes: the video and audio VAE loaders, the latent upscale model's loader,
LTXVEmptyLatentAudio's role, the latent upsampler, the tiled video decode, the audio decode, and the AV latent's
concat / separate for a ComfyUI without them; nodes/ltx25.py registers them with the family's other nodes."""
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
from .base import SwiftDiTError, checked, decode_image, file_checked, interrupt_check
from .family_nodes import FileLoaderNode, VAELoaderNode
from .ltx25_frames import CATEGORY, device_model, vae_role
from .types import LatentUpscaleModel, Vae

# LTXVEmptyLatentAudio's length rule, ceil(frames / fps x 25) (ComfyUI's AudioVAE.num_of_latents_from_frames:
# 16 kHz / mel hop 160 / x4 latents per second), and the "sample_rate" it writes (the audio VAE's 16 kHz).
AUDIO_LATENTS_PER_S, AUDIO_SAMPLE_RATE = 25, 16000


@dataclass(frozen=True)
class AudioCodec:
    """The audio VAE file's two models: the VAE decoder (latents -> log-mel) and the vocoder (-> 48 kHz)."""
    decoder: AudioDecoder
    vocoder: Vocoder

    def to(self, device: torch.device, dtype: torch.dtype = torch.float32) -> AudioCodec:
        return AudioCodec(self.decoder.to(device, dtype), self.vocoder.to(device, dtype))


# On ComfyUI's device: the video VAE in BF16 on a GPU (as stock decodes), the rest f32 (the vocoder as ComfyUI
# runs it)
load_video_vae = functools.partial(device_model, "vae", read=VideoDecoder.load, role="video", gpu_dtype=torch.bfloat16)
load_audio_vae = functools.partial(device_model, "vae", read=lambda c: AudioCodec(AudioDecoder.load(c), Vocoder.load(c)),
                                   role="audio")
load_upscale_model = functools.partial(device_model, "latent_upscale", read=LatentUpsampler.load)


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


CODEC_NODES = [LTX25VAELoader, LTX25AudioVAELoader, LTX25LatentUpscaleModelLoader, LTX25EmptyLatentAudio,
               LTX25LatentUpsampler, LTX25VAEDecodeTiled, LTX25AudioVAEDecode, LTX25ConcatAVLatent,
               LTX25SeparateAVLatent]
