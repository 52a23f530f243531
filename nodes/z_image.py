"""Z-Image Turbo nodes: loaders, text encode, the sampler and VAE decode, with the stock nodes' widgets."""
from __future__ import annotations

import torch
from comfy_api.latest import io

from ..dit_core.families.z_image import SEQ_MULTIPLE, ZImage
from ..dit_core.text.qwen3 import Qwen3TextEncoder
from ..dit_core.sampling.ksampler import SAMPLERS, ksample, model_on_device
from ..dit_core.sampling.schedules import SCHEDULERS
from ..dit_core.codecs.flux1_vae import SCALING, SHIFT, ImageDecoder
from .base import (
    FileHandle,
    cancellable,
    decode_image,
    dit_loader,
    text_encoder_loader,
    decode_schema,
    interrupt_check,
    model_input,
    model_output,
    positive_shift,
    text_conditioning,
)
from .family_nodes import (DiTLoaderNode, LoraLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode,
                           VAELoaderNode)
from .family_settings import FLOW, FamilySettings, PassSize, Schedule
from .memory import engine_device, graphed_dit_step, vae_on_device

CATEGORY = "SwiftDiT/Z-Image"
FAMILY = "z_image"
LATENT_CHANNELS = 16
SETTINGS = FamilySettings(
    # ComfyUI's ZImage model_sampling default (supported_models.py), as ModelSamplingAuraFlow(3)
    schedule=Schedule(FLOW, 3.0),
    # an image row is a 2x2 patch of 8x8-pixel latent cells; before a prompt says its size, a pass has room for a
    # 2 MP image (8192 rows) and 1024 text rows
    pass_size=PassSize(image_row_pixels=16 * 16, default_rows=8192 + 1024))


load_dit = dit_loader(ZImage, SETTINGS.pass_size)


def pass_rows(latent: torch.Tensor, *conditionings: torch.Tensor) -> int:
    """The rows of one image's pass: its 2x2 patches and the longest conditioning's rows, each padded to a
    multiple of 32 as the model pads them."""
    pad = lambda n: -(-n // SEQ_MULTIPLE) * SEQ_MULTIPLE  # noqa: E731
    return pad((latent.shape[-2] // 2) * (latent.shape[-1] // 2)) + pad(max(c.shape[-2] for c in conditionings))


class ZImageLoader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTZImageLoader", "Z-Image Loader (SwiftDiT)", CATEGORY, FAMILY,
                                                 "Z-Image")
    DESCRIPTION = "Loads a Z-Image diffusion model file (BF16, FP8 or INT8 ConvRot) for the SwiftDiT engine."
    SETTINGS = SETTINGS
    load = staticmethod(load_dit)


class ZImageModelSamplingAuraFlow(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTZImageModelSamplingAuraFlow", display_name="Z-Image ModelSamplingAuraFlow (SwiftDiT)",
            category=CATEGORY, description="The flow schedule's shift (multiplier 1), as ModelSamplingAuraFlow.",
            inputs=[model_input("Z-Image"),
                    io.Float.Input("shift", default=SETTINGS.schedule.shift, min=0.0, max=100.0, step=0.01,
                                   tooltip="The flow schedule's shift (greater than 0); higher spends more steps "
                                           "at high noise")],
            outputs=[model_output("Z-Image")])

    @classmethod
    def execute(cls, model, shift) -> io.NodeOutput:
        shift = positive_shift("SwiftDiTZImageModelSamplingAuraFlow", shift)
        return io.NodeOutput(model.with_(schedule=model.schedule.at(shift)))


class ZImageLoraLoaderModelOnly(LoraLoaderNode):
    TITLE = "Z-Image"
    NODE_ID, DISPLAY, CATEGORY = ("SwiftDiTZImageLoraLoaderModelOnly", "Z-Image LoraLoaderModelOnly (SwiftDiT)",
                                  CATEGORY)
    DESCRIPTION = "Merges a LoRA into the Z-Image model's linears at load."
    load = staticmethod(load_dit)


load_text_encoder = text_encoder_loader(Qwen3TextEncoder, FAMILY)


class ZImageTextEncoderLoader(TextEncoderLoaderNode):
    TITLE = "Z-Image"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTZImageTextEncoderLoader", "Z-Image Text Encoder Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads Z-Image's Qwen3-4B text encoder (BF16, FP8 or INT8 ConvRot)."
    TYPE = "lumina2"
    load = staticmethod(load_text_encoder)


class ZImageTextEncode(TextEncodeNode):
    TITLE = "Z-Image"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTZImageTextEncode", "Z-Image Text Encode (SwiftDiT)", CATEGORY
    DESCRIPTION = "The prompt's Qwen3 rows as CONDITIONING, exactly as CLIPTextEncode makes them for Z-Image."
    conditioning = staticmethod(
        lambda clip, text: text_conditioning(load_text_encoder(clip).encode(text, interrupt_check)))


class ZImageSampler(SamplerNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTZImageSampler", "Z-Image KSampler (SwiftDiT)", CATEGORY,
                                                 FAMILY, "Z-Image")
    DESCRIPTION = "KSampler for Z-Image on the SwiftDiT engine: same seed, same image as stock."
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 8, tuple(SAMPLERS), "res_multistep", tuple(SCHEDULERS), "simple"
    SETTINGS = SETTINGS
    load = staticmethod(load_dit)

    @classmethod
    def rows(cls, r):
        latent, text = r.latent, max(r.positive.shape[-2], r.negative.shape[-2])
        return (latent.shape[-2] // 2) * (latent.shape[-1] // 2), text, pass_rows(latent, r.positive, r.negative)

    @classmethod
    def sampling(cls, dit, r):
        device = engine_device()
        step = graphed_dit_step(dit, device)  # (while every block is resident)

        def sample(callback, should_stop):
            return ksample(model_on_device(dit.denoised, device, interrupt_check, step), r.seed, r.steps, r.cfg,
                           r.sampler_name, r.scheduler, r.latent.to(device), positive=r.positive,
                           negative=r.negative, denoise=r.denoise,
                           shift=r.model.schedule.shift,  # a FLOW shift: ksample's flow table
                           batch_index=r.latent_image.get("batch_index"), callback=callback,
                           should_stop=should_stop, latent_shift=SHIFT, latent_scale=SCALING,  # FLUX.1's VAE
                           latent_channels=LATENT_CHANNELS)

        return sample, r.steps


def load_vae(handle: FileHandle) -> ImageDecoder:
    return vae_on_device(handle, lambda: cancellable(ImageDecoder.load, handle.path), role=handle.role)


class ZImageVAELoader(VAELoaderNode):
    TITLE = "Z-Image"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTZImageVAELoader", "Z-Image VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads FLUX.1's VAE (ae.safetensors), Z-Image's decoder."
    load = staticmethod(load_vae)


class ZImageVAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTZImageVAEDecode", display_name="Z-Image VAE Decode (SwiftDiT)", category=CATEGORY,
            description="Decodes Z-Image latents to an IMAGE, in tiles for large images.",
            **decode_schema("Z-Image"))

    @classmethod
    def execute(cls, samples, vae) -> io.NodeOutput:
        return io.NodeOutput(decode_image("SwiftDiTZImageVAEDecode", load_vae(vae), samples))


NODES = [ZImageLoader, ZImageTextEncoderLoader, ZImageTextEncode, ZImageModelSamplingAuraFlow,
         ZImageLoraLoaderModelOnly, ZImageSampler, ZImageVAELoader, ZImageVAEDecode]
