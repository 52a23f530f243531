"""MiniMax H3 Reference To Video (ref2va; ComfyUI's MiniMaxH3ReferenceToVideo): reference images, videos with their
soundtracks and standalone audios, encoded as the positive's `minimax_refs` blocks in ComfyUI's order (images,
videos, audios), and shown to the text encoder in that order as ComfyUI's node does (a video's frames at 2 fps).
nodes/minimax_h3.py registers the node, binding the prompt's conditioning (its text encoder)."""
from __future__ import annotations

import logging

import comfy.utils
import torch
from comfy_api.latest import io

from ..dit_core.families.minimax_h3_layout import (reference_image_size, reference_video_frames,
                                                   reference_video_size)
from ..dit_core.text.qwen3_vl_video import VIDEO_SAMPLE_FPS, PromptReference, sampled_frames
from . import minimax_h3_codecs as codecs  # its encoder loaders read at call time (tests swap them)
from .base import SwiftDiTError, checked, interrupt_check
from .minimax_h3_codecs import CATEGORY, CONDITIONING_OUTPUTS, canvas_inputs, empty_av_latent, vae_for
from .types import TextEncoder, Vae

log = logging.getLogger("SwiftDiT")
REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIOS = 9, 3, 3  # ComfyUI's ref_image_0..8, ref_video_0..2, ref_audio_0..2


def resized(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """IMAGE frames stretched to height x width (lanczos, no crop), RGB only, as ComfyUI's _resize."""
    return comfy.utils.common_upscale(frames[..., :3].movedim(-1, 1), width, height, "lanczos",
                                      "disabled").movedim(1, -1)


def image_reference(node: str, name: str, image: torch.Tensor, size: tuple[int, int], vae, index: int,
                    blocks: list) -> torch.Tensor:
    """A reference image as MiniMaxH3ReferenceToVideo takes it: its first image resized to size (height, width),
    the prompt's picture; with the video VAE its latent joins blocks as ComfyUI's image block."""
    pixels = resized(image[:1], *size)
    if vae_for(node, "vae", vae, "video") is not None:
        with checked(node, name):
            z = codecs.load_video_encoder(vae).encode(pixels, tile=None, check=interrupt_check)
        blocks.append({"kind": "image", "picture_index": index, "latent_h": size[0] // 16, "latent_w": size[1] // 16,
                       "latent": z})
    return pixels


def encode_audio(node: str, name: str, audio: dict, audio_vae) -> torch.Tensor:
    """An AUDIO's first item at 32 kHz -> its normalized latent [1, C, 2, Na] (the audio VAE's encoder)."""
    with checked(node, name):
        return codecs.load_audio_encoder(audio_vae).encode(audio["waveform"][:1], audio["sample_rate"],
                                                           interrupt_check)


def audio_reference(node: str, name: str, audio: dict, audio_vae, blocks: list) -> None:
    """A standalone reference audio: with the audio VAE its latent joins blocks as ComfyUI's audio block (without
    it, it is only the prompt's "<Audio j>: " label)."""
    if vae_for(node, "audio_vae", audio_vae, "audio") is not None:
        z = encode_audio(node, name, audio, audio_vae)
        blocks.append({"kind": "audio", "ref_audio_t": z.shape[-1], "audio_latent": z})


def video_reference(node: str, name: str, frames: torch.Tensor, soundtrack: dict | None, length: int, vae,
                    audio_vae, blocks: list) -> PromptReference:
    """A reference video (IMAGE frames at 24 fps) as MiniMaxH3ReferenceToVideo takes it: resized to its own canvas
    (reference_video_size), cut to the target's length and down to 17n + 5 frames; with the video VAE its latent
    [1, C, 5n + 2, h, w] joins blocks, with its soundtrack's latent when that and the audio VAE are wired (a
    "video_audio" block: the soundtrack's rows, then the frames', from one origin). Returns what the text encoder
    reads of it: the frames read at 2 fps, as ComfyUI's node picks them (every 12th of the 17n + 5 encoded, from the
    first; of 5 to 12 frames only the first, which the text encoder repeats into a pair), alone resized (the resize
    is per frame), and whether a soundtrack labels it."""
    if not isinstance(frames, torch.Tensor) or frames.dim() != 4:
        raise SwiftDiTError(f"{node} · {name}: IMAGE frames [F, H, W, 3] (a video's frames, e.g. from Load Video's "
                            f"components), got {type(frames).__name__}")
    with checked(node, name):
        count = reference_video_frames(frames.shape[0], length)
        height, width = reference_video_size(frames.shape[1], frames.shape[2])
        read, _ = sampled_frames(count)
    shown = PromptReference("video", resized(frames[read], height, width), soundtrack is not None, VIDEO_SAMPLE_FPS)
    if vae_for(node, "vae", vae, "video") is None:
        return shown
    pixels = resized(frames[:count], height, width)
    with checked(node, name):
        z = codecs.load_video_encoder(vae).encode(pixels, tile=None, check=interrupt_check)
    sound = None
    if soundtrack is not None and vae_for(node, "audio_vae", audio_vae, "audio") is not None:
        sound = encode_audio(node, name.replace("ref_video_", "ref_video_audio_"), soundtrack, audio_vae)
    blocks.append({"kind": "video_audio" if sound is not None else "video", "latent_t": z.shape[2],
                   "latent_h": height // 16, "latent_w": width // 16, "ref_audio_t": 0 if sound is None else
                   sound.shape[-1], "latent": z, "audio_latent": sound})
    return shown


class ReferenceToVideoNode(io.ComfyNode):  # MiniMaxH3ReferenceToVideo's inputs and outputs
    """The node less the prompt's conditioning(clip, prompt, references), which its subclass binds."""
    NODE_ID = "SwiftDiTMiniMaxH3ReferenceToVideo"

    @classmethod
    def define_schema(cls):
        vae = "Optional: the {} VAE, from the MiniMax H3 {}VAE Loader; without it the references {} only the text"
        return io.Schema(
            node_id=cls.NODE_ID, display_name="MiniMax H3 Reference To Video (SwiftDiT)", category=CATEGORY,
            description="The prompt after its references in order: images (<Picture i>), videos (<Video k> and "
                        "a timestamped block a frame pair at 2 fps, after its soundtrack's <Audio j>), audios "
                        "(<Audio j>); the references encoded as conditions (images, videos with their soundtracks, "
                        "audios), and the empty AV latent, as MiniMaxH3ReferenceToVideo.",
            inputs=[TextEncoder.Input("clip", tooltip="The MiniMax H3 text encoder, from its Text Encoder Loader"),
                    Vae.Input("vae", optional=True, tooltip=vae.format("video", "", "images and videos condition")),
                    Vae.Input("audio_vae", optional=True, tooltip=vae.format("audio", "Audio ", "audios label")),
                    *canvas_inputs(1344, 768),
                    io.Combo.Input("ref_image_size", options=["match", "max"], default="match",
                                   tooltip="'match': each image scaled down to the video's area; 'max': to a 2048 "
                                           "short edge (more rows every step: slower)"),
                    *[io.Image.Input(f"ref_image_{i}", optional=True, tooltip=f"Reference image <Picture {i + 1}>")
                      for i in range(REFERENCE_IMAGES)],
                    *[io.Image.Input(f"ref_video_{i}", optional=True,
                                     tooltip="Reference video frames at 24 fps (at least 5; cut to length, then "
                                             "to 17n + 5; the text encoder reads every 12th: 2 fps)")
                      for i in range(REFERENCE_VIDEOS)],
                    *[io.Audio.Input(f"ref_video_audio_{i}", optional=True,
                                     tooltip=f"The soundtrack of ref_video_{i}, at 32 kHz")
                      for i in range(REFERENCE_VIDEOS)],
                    *[io.Audio.Input(f"ref_audio_{i}", optional=True, tooltip="A reference audio at 32 kHz")
                      for i in range(REFERENCE_AUDIOS)]], outputs=CONDITIONING_OUTPUTS)

    @classmethod
    def execute(cls, clip, prompt, width, height, length, ref_image_size="match", vae=None, audio_vae=None,
                **references) -> io.NodeOutput:
        node, blocks, shown = cls.NODE_ID, [], []  # shown: the references the prompt shows, in blocks' order
        latent = empty_av_latent(node, width, height, length)
        for name in (f"ref_image_{i}" for i in range(REFERENCE_IMAGES)):
            if (image := references.get(name)) is not None:
                with checked(node, "ref_image_size"):
                    size = reference_image_size(image.shape[1], image.shape[2], height, width, ref_image_size)
                pixels = image_reference(node, name, image, size, vae, len(shown), blocks)
                shown.append(PromptReference("image", pixels))
        for i in range(REFERENCE_VIDEOS):
            frames, soundtrack = references.get(f"ref_video_{i}"), references.get(f"ref_video_audio_{i}")
            if frames is None and soundtrack is not None:  # unused, as ComfyUI's node leaves it
                log.warning("%s · ref_video_audio_%d: the soundtrack of ref_video_%d, which is not connected, is "
                            "unused; connect its video, or use a ref_audio input for audio alone", node, i, i)
            if frames is not None:
                shown.append(video_reference(node, f"ref_video_{i}", frames, soundtrack, length, vae, audio_vae,
                                             blocks))
        for name in (f"ref_audio_{i}" for i in range(REFERENCE_AUDIOS)):
            if (audio := references.get(name)) is not None:
                shown.append(PromptReference("audio"))
                audio_reference(node, name, audio, audio_vae, blocks)
        with checked(node, "prompt"):
            conditioning = cls.conditioning(clip, prompt, shown)
        if blocks:
            conditioning[0][1]["minimax_refs"] = blocks
        return io.NodeOutput(conditioning, {"samples": latent})
