"""Krea 2's style reference: TextEncodeQwenImageEditPlus's role on our text encoder (its pictures read by Qwen3-VL's
vision tower, its reference latents from the stock VAE), the reference latents' checks for the sampler, and the
host's twin of FluxKontextMultiReferenceLatentMethod (ComfyUI v0.3.75's lacks "index_timestep_zero")."""
from __future__ import annotations

import math

import comfy.utils
import torch
from comfy_api.latest import io

from ..dit_core.families.krea2 import latent_format
from ..dit_core.sampling.ksampler import process_in
from ..dit_core.text.qwen3_vl import KREA2_DEEPSTACK_LAYERS, KREA2_VISION_HEADS, Krea2TextEncoder
from .base import SwiftDiTError, checked, interrupt_check, text_conditioning, text_encoder_loader
from .types import TextEncoder

CATEGORY = "SwiftDiT/Krea 2"
LATENT_CHANNELS = 16
# ComfyUI's conditioning keys: TextEncodeQwenImageEditPlus's latents, FluxKontextMultiReferenceLatentMethod's method
REFERENCES, METHOD = "reference_latents", "reference_latents_method"
# The one way the engine places references (dit_core/families/krea2.py velocity): the style-reference template's
INDEX_TIMESTEP_ZERO = "index_timestep_zero"
METHODS = ("offset", "index", "uxo/uno", INDEX_TIMESTEP_ZERO)  # newer ComfyUI's choices; v0.3.75 lacks the last
VISION_AREA, LATENT_AREA = 384 * 384, 1024 * 1024  # TextEncodeQwenImageEditPlus's picture and reference areas
# Qwen3-VL-4B's vision tower (qwen3vl_4b_fp8_scaled.safetensors); tests of tiny towers set their own
VISION = {"vision_heads": KREA2_VISION_HEADS, "deepstack_layers": KREA2_DEEPSTACK_LAYERS}


class _WithVision:
    """Krea2TextEncoder.load with the file's vision tower (the pictures need it), in text_encoder_loader's call."""
    @staticmethod
    def load(path, tokenizer_dir, **kwargs):
        return Krea2TextEncoder.load(path, tokenizer_dir, vision=True, **VISION, **kwargs)


# its own cache entry: the plain text encode (the Krea 2 Text Encode's entry) needs no vision tower
load_reference_encoder = text_encoder_loader(_WithVision, "krea2 with vision")
load_text_encoder = text_encoder_loader(Krea2TextEncoder, "krea2")


def _area_resized(image: torch.Tensor, area: int, multiple: int | None) -> torch.Tensor:
    """IMAGE [B, H, W, C] scaled to about `area` pixels ("area" filter), each side rounded as the stock node does:
    to the nearest pixel, or to a multiple of `multiple`."""
    samples = image.movedim(-1, 1)
    scale = math.sqrt(area / (samples.shape[3] * samples.shape[2]))
    if multiple is None:
        width, height = round(samples.shape[3] * scale), round(samples.shape[2] * scale)
    else:
        width = round(samples.shape[3] * scale / multiple) * multiple
        height = round(samples.shape[2] * scale / multiple) * multiple
    return comfy.utils.common_upscale(samples, width, height, "area", "disabled").movedim(1, -1)


class Krea2TextEncodeQwenImageEditPlus(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTKrea2TextEncodeQwenImageEditPlus",
            display_name="Krea 2 TextEncodeQwenImageEditPlus (SwiftDiT)", category=CATEGORY,
            description="The prompt and up to three pictures as Krea 2's text rows (Qwen3-VL reads the pictures), "
                        "and with a VAE their latents as reference latents: the style reference's conditioning.",
            inputs=[TextEncoder.Input("clip", tooltip="The Krea 2 text encoder, from its Text Encoder Loader (the "
                                                      "file's vision tower reads the pictures)"),
                    io.String.Input("prompt", multiline=True, dynamic_prompts=True, tooltip="The prompt"),
                    io.Vae.Input("vae", optional=True,
                                 tooltip="qwen_image_vae from the stock VAE Loader: encodes the reference latents"),
                    *[io.Image.Input(f"image{i}", optional=True, tooltip=f"Reference picture {i}")
                      for i in (1, 2, 3)]],
            outputs=[io.Conditioning.Output(tooltip="Text rows with the reference latents, for "
                                                    "FluxKontextMultiReferenceLatentMethod (index_timestep_zero)")])

    @classmethod
    def execute(cls, clip, prompt, vae=None, image1=None, image2=None, image3=None) -> io.NodeOutput:
        node = "SwiftDiTKrea2TextEncodeQwenImageEditPlus"
        pictures, refs = [], []
        for name, image in (("image1", image1), ("image2", image2), ("image3", image3)):
            if image is None:
                continue
            if image.dim() != 4 or image.shape[0] != 1 or image.shape[-1] < 3:
                raise SwiftDiTError(f"{node} · {name}: expected one picture [1, H, W, 3] (IMAGE), got "
                                    f"{tuple(image.shape)}; pass one image (Load Image), not a batch")
            pictures.append(_area_resized(image, VISION_AREA, None))
            if vae is not None:
                with checked(node, "vae"):
                    refs.append(vae.encode(_area_resized(image, LATENT_AREA, 8)[:, :, :, :3]))
        with checked(node, "clip"):  # the vision tower only when there are pictures to read
            encoder = (load_reference_encoder if pictures else load_text_encoder)(clip)
        with checked(node, "prompt"):
            rows = encoder.encode_reference(prompt, pictures, interrupt_check)
        conditioning = text_conditioning(rows[None])
        if refs:
            conditioning[0][1][REFERENCES] = refs
        return io.NodeOutput(conditioning)


class Krea2ReferenceLatentMethod(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTKrea2ReferenceLatentMethod",
            display_name="Krea 2 Reference Latent Method (SwiftDiT)", category=CATEGORY,
            description="FluxKontextMultiReferenceLatentMethod with newer ComfyUI's index_timestep_zero, which "
                        "ComfyUI v0.3.75's lacks: how the sampler places the reference latents.",
            inputs=[io.Conditioning.Input("conditioning", tooltip="The style reference's conditioning"),
                    io.Combo.Input("reference_latents_method", options=list(METHODS), default=INDEX_TIMESTEP_ZERO,
                                   tooltip="Krea 2's style reference: index_timestep_zero")],
            outputs=[io.Conditioning.Output(tooltip="The conditioning with its reference latents' method")])

    @classmethod
    def execute(cls, conditioning, reference_latents_method) -> io.NodeOutput:
        return io.NodeOutput([[rows, {**extra, METHOD: reference_latents_method}] for rows, extra in conditioning])


def reference_latents(node: str, conditioning: list) -> tuple[torch.Tensor, ...]:
    """The positive's reference latents as the engine takes them: each [16, h, w] in Krea 2's latent format (the
    stock VAE's [1, 16, 1, h, w] or [1, 16, h, w], (z - mean) / std as the latent), placed index_timestep_zero."""
    extra = conditioning[0][1]
    refs = extra.get(REFERENCES) or []
    if refs and extra.get(METHOD) != INDEX_TIMESTEP_ZERO:
        raise SwiftDiTError(f"{node} · positive: reference latents placed by {extra.get(METHOD)!r}; Krea 2's style "
                            f"reference places them with index_timestep_zero: set FluxKontextMultiReferenceLatentMethod "
                            f"(or the Krea 2 Reference Latent Method node) to index_timestep_zero")
    shift, scale = latent_format()
    out = []
    for j, z in enumerate(refs):
        if isinstance(z, torch.Tensor) and z.dim() == 5 and z.shape[2] == 1:
            z = z[:, :, 0]
        if not isinstance(z, torch.Tensor) or z.dim() != 4 or z.shape[:2] != (1, LATENT_CHANNELS):
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise SwiftDiTError(f"{node} · positive: reference latent {j} is {got}, expected one qwen_image_vae "
                                f"latent [1, {LATENT_CHANNELS}, 1, h, w]; encode the picture with qwen_image_vae")
        out.append(process_in(z.float(), shift, scale)[0])
    return tuple(out)


NODES = [Krea2TextEncodeQwenImageEditPlus, Krea2ReferenceLatentMethod]
