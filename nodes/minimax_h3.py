"""MiniMax H3 nodes, text, images and references to video + audio and text to image: the DiT and LoRA loaders, the
text encoder loader and encode, Image To Video, Reference To Video (nodes/minimax_h3_references.py, bound here to
the prompt's conditioning), the sampler; and the VAE nodes of nodes/minimax_h3_codecs.py, all in NODES."""
from __future__ import annotations

import comfy.utils
import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.families.minimax_h3 import MiniMaxH3
from ..dit_core.sampling.ksampler import SAMPLERS as KSAMPLERS
from ..dit_core.sampling.minimax_h3 import AUDIO_SHIFT, VIDEO_SHIFT, comfy_h3_sigmas, sample_t2va
from ..dit_core.sampling.schedules import SCHEDULERS
from ..dit_core.text.qwen3_vl import MiniMaxH3TextEncoder
from ..dit_core.text.qwen3_vl_video import PromptReference
from .base import (FileHandle, SwiftDiTError, checked, dit_loader, interrupt_check, text_conditioning,
                   text_encoder_loader)
from .family_nodes import DiTLoaderNode, LoraLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode
from .family_settings import H3, FamilySettings, PassSize, Schedule
from .minimax_h3_codecs import (CATEGORY, CONDITIONING_OUTPUTS, FAMILY, MiniMaxH3AudioVAELoader, MiniMaxH3VAEDecode,
                                MiniMaxH3VAEDecodeAudio, MiniMaxH3VAELoader, av_parts, canvas_inputs, empty_av_latent,
                                empty_image_latent, keyframes_of, load_video_encoder, references_of)
from .minimax_h3_references import ReferenceToVideoNode
from .minimax_h3_schedule import MiniMaxH3SigmaShift
from .types import TextEncoder, Vae

SETTINGS = FamilySettings(
    schedule=Schedule(H3, VIDEO_SHIFT),  # the video grid's shift 12 (the audio grid keeps shift 3)
    # a video row: 2x2 latent cells of 16x16 pixels; the default pass: 864x480x124's 37 x 405 video, 2 x 207 audio
    pass_size=PassSize(image_row_pixels=32 * 32, default_rows=37 * 405 + 2 * 207 + 512, video=True))

load_dit = dit_loader(MiniMaxH3, SETTINGS.pass_size)
# Qwen3-VL-32B's first 50 layers: about 51 GB in BF16, half that INT8, so its INT8 ConvRot linears (and the NVFP4
# file's, read as INT8) stay INT8 on the card
TEXT_INT8_KEPT = True
load_text_encoder = text_encoder_loader(MiniMaxH3TextEncoder, FAMILY, int8_kept=TEXT_INT8_KEPT)


class MiniMaxH3Loader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTMiniMaxH3Loader", "MiniMax H3 Loader (SwiftDiT)", CATEGORY,
                                                 FAMILY, "MiniMax H3")
    DESCRIPTION = "Loads a MiniMax H3 diffusion model file for the SwiftDiT engine (on one GPU or several: gpus)."
    SETTINGS, load = SETTINGS, staticmethod(load_dit)


class MiniMaxH3LoraLoaderModelOnly(LoraLoaderNode):
    TITLE = "MiniMax H3"
    NODE_ID, DISPLAY, CATEGORY = ("SwiftDiTMiniMaxH3LoraLoaderModelOnly", "MiniMax H3 LoraLoaderModelOnly (SwiftDiT)",
                                  CATEGORY)
    DESCRIPTION = ("Merges a LoRA into the MiniMax H3 model's linears at load (the templates' turbo LoRAs: the file's "
                   "names, or diffusers').")
    load = staticmethod(load_dit)


class MiniMaxH3TextEncoderLoader(TextEncoderLoaderNode):
    TITLE = "MiniMax H3"
    NODE_ID, DISPLAY, CATEGORY = ("SwiftDiTMiniMaxH3TextEncoderLoader", "MiniMax H3 Text Encoder Loader (SwiftDiT)",
                                  CATEGORY)
    DESCRIPTION = "Loads H3's Qwen3-VL-32B text encoder (the template's NVFP4-AWQ file or the INT8 ConvRot one)."
    TYPE = "minimax"
    load = staticmethod(load_text_encoder)


def prompt_conditioning(clip: FileHandle, text: str) -> list:  # rows [1, Nt, 5120]: Qwen3-VL-32B's layer 50
    return text_conditioning(load_text_encoder(clip).encode(text, interrupt_check))


def pictures_conditioning(clip: FileHandle, text: str, pictures: list[torch.Tensor]) -> list:
    """The prompt after its pictures ("<Picture i>: " and the vision rows, as ComfyUI's H3 tokenizer presents
    keyframes): references_conditioning's."""
    return references_conditioning(clip, text, [PromptReference("image", picture) for picture in pictures])


def references_conditioning(clip: FileHandle, text: str, references: list[PromptReference]) -> list:
    """The prompt after a ref2va request's references in order (images, videos, audios: ComfyUI's presentation,
    encode_references): the rows, and their modality tags in the entry's `text_token_tags` (vision rows: video's)."""
    rows, tags = load_text_encoder(clip).encode_references(text, references, interrupt_check)
    conditioning = text_conditioning(rows)
    conditioning[0][1]["text_token_tags"] = tags
    return conditioning


class MiniMaxH3TextEncode(TextEncodeNode):
    TITLE = "MiniMax H3"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTMiniMaxH3TextEncode", "MiniMax H3 Text Encode (SwiftDiT)", CATEGORY
    DESCRIPTION = "The prompt's text rows (Qwen3-VL-32B layer 50, the prompt verbatim) as CONDITIONING."
    conditioning = staticmethod(prompt_conditioning)


class MiniMaxH3ImageToVideo(io.ComfyNode):  # MiniMaxH3ImageToVideo's inputs and outputs
    NODE_ID = "SwiftDiTMiniMaxH3ImageToVideo"

    @classmethod
    def define_schema(cls):
        frame = "Optional: the video's {} frame (the first image of the batch), encoded by the video VAE"
        return io.Schema(
            node_id=cls.NODE_ID, display_name="MiniMax H3 Image To Video (SwiftDiT)", category=CATEGORY,
            description="The prompt's conditioning and the empty AV latent (video and audio parts) of width x "
                        "height and length frames at 24 fps, with optional first and last frames as keyframes, as "
                        "MiniMaxH3ImageToVideo.",
            inputs=[TextEncoder.Input("clip", tooltip="The MiniMax H3 text encoder, from its Text Encoder Loader"),
                    Vae.Input("vae", optional=True,
                              tooltip="The video VAE, from the MiniMax H3 VAE Loader (needed with a frame)"),
                    io.Image.Input("first_frame", optional=True, tooltip=frame.format("first")),
                    io.Image.Input("last_frame", optional=True, tooltip=frame.format("last")),
                    *canvas_inputs(864, 480)], outputs=CONDITIONING_OUTPUTS)

    @classmethod
    def execute(cls, clip, prompt, width, height, length, vae=None, first_frame=None,
                last_frame=None) -> io.NodeOutput:
        node = cls.NODE_ID
        latent = empty_av_latent(node, width, height, length)
        # ComfyUI's: the first frame stretched to the canvas, the last one cropped to cover it (lanczos both)
        wanted = [(name, image, index, crop) for name, image, index, crop in
                  (("first_frame", first_frame, 0, "disabled"), ("last_frame", last_frame, length - 1, "center"))
                  if image is not None]
        if wanted and (vae is None or vae.role != "video"):
            raise SwiftDiTError(f"{node} · vae: a first or last frame is encoded by the video VAE; connect the "
                                f"MiniMax H3 VAE Loader")
        keyframes, pictures = [], []
        for name, image, index, crop in wanted:
            pixels = comfy.utils.common_upscale(image[:1].movedim(-1, 1), width, height, "lanczos",
                                                crop).movedim(1, -1)
            with checked(node, name):
                z = load_video_encoder(vae).encode(pixels, tile=None, check=interrupt_check)
            keyframes.append({"resolved_frame_index": index, "latent": z})
            pictures.append(pixels)
        with checked(node, "prompt"):  # the frames are the prompt's pictures too, as the stock node tokenizes
            conditioning = pictures_conditioning(clip, prompt, pictures) if pictures else \
                prompt_conditioning(clip, prompt)
        if keyframes:
            conditioning[0][1]["minimax_keyframes"] = keyframes
        return io.NodeOutput(conditioning, {"samples": latent})


class MiniMaxH3ReferenceToVideo(ReferenceToVideoNode):  # nodes/minimax_h3_references.py, with the prompt's text
    conditioning = staticmethod(references_conditioning)


class MiniMaxH3Sampler(SamplerNode):
    """SamplerNode's body fits: KSampler's inputs (a drop-in for a KSampler after Image To Video), the widget checks,
    the memory check, progress and cancel; only the latent view, the rows and the loop are H3's."""
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTMiniMaxH3Sampler", "MiniMax H3 KSampler (SwiftDiT)",
                                                 CATEGORY, FAMILY, "MiniMax H3")
    DESCRIPTION = ("Text to video + audio for MiniMax H3 on the SwiftDiT engine, sampled as ComfyUI samples H3: "
                   "the sampler on the video grid (shift 12) with the audio carried on it (its own shift 3), one "
                   "forward a step (guidance-distilled: cfg 1, the negative unused).")
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 20, tuple(KSAMPLERS), "res_multistep", tuple(SCHEDULERS), \
        "simple"
    OUTPUT_TOOLTIP = "The clean AV latent, for the MiniMax H3 VAE Decode and VAE Decode Audio nodes"
    SETTINGS, load = SETTINGS, staticmethod(load_dit)

    @classmethod
    def latent(cls, samples):
        if isinstance(samples, torch.Tensor) and samples.dim() == 4:
            return empty_image_latent(cls.NODE_ID, samples)  # text to image: EmptyLatentImage, as the t2i template
        av_parts(cls.NODE_ID, "latent_image", samples)
        return samples

    @classmethod
    def rows(cls, r):
        node = cls.NODE_ID
        for name, value, why in (("cfg", r.cfg, "H3 is guidance-distilled (one pass a step)"),
                                 ("denoise", r.denoise, "text to video starts from noise")):
            if value != 1:
                raise SwiftDiTError(f"{node} · {name}: {why}; set {name} to 1")
        if r.positive.dim() != 3:
            raise SwiftDiTError(f"{node} · positive: not H3 text rows [1, Nt, 5120] (got {tuple(r.positive.shape)})"
                                f"; encode the prompt with the MiniMax H3 Text To Video or Text Encode node")
        video, audio = r.latent.tensors
        image = video.shape[2] * (video.shape[3] // 2) * (video.shape[4] // 2) + 2 * audio.shape[3]
        conditions = sum(ref.rows() for ref in references_of(node, r.conditioning))
        return image, r.positive.shape[1], image + r.positive.shape[1] + conditions

    @classmethod
    def loaded(cls, dit, r):
        video, audio = r.latent.tensors
        for name, got, want in (("latent_image", video.shape[1], dit.arch.latents), ("positive", r.positive.shape[-1],
                                dit.arch.text_dim), ("latent_image", audio.shape[1], dit.audio_in.in_features)):
            if got != want:
                raise SwiftDiTError(f"{cls.NODE_ID} · {name}: {got} channels where this model takes {want}; make "
                                    f"it with the MiniMax H3 nodes")

    @classmethod
    def sampling(cls, dit, r):
        video, audio = r.latent.tensors
        shift = r.model.schedule.shift
        total = len(comfy_h3_sigmas(r.scheduler, r.steps, shift)) - 1  # ddim_uniform can add a step, as ComfyUI's
        pixel_frames = max(1, (video.shape[2] - 2) // 5 * 17 + 5)
        keyframes = keyframes_of(cls.NODE_ID, r.conditioning, pixel_frames)
        tags = r.conditioning[0][1].get("text_token_tags") if r.conditioning else None
        references = references_of(cls.NODE_ID, r.conditioning)
        return (lambda callback, should_stop: NestedTensor(sample_t2va(
            dit, r.positive, *video.shape[2:], audio.shape[3], r.steps, seed=r.seed, video_shift=shift,
            audio_shift=r.model.schedule.second_shift or AUDIO_SHIFT, sampler=r.sampler_name, scheduler=r.scheduler,
            keyframes=keyframes, text_tags=tags, references=references, callback=callback, should_stop=should_stop,
            check=interrupt_check))), total


NODES = [MiniMaxH3Loader, MiniMaxH3LoraLoaderModelOnly, MiniMaxH3TextEncoderLoader, MiniMaxH3TextEncode,
         MiniMaxH3ImageToVideo, MiniMaxH3ReferenceToVideo, MiniMaxH3SigmaShift, MiniMaxH3Sampler, MiniMaxH3VAELoader,
         MiniMaxH3AudioVAELoader, MiniMaxH3VAEDecode, MiniMaxH3VAEDecodeAudio]
