"""Krea 2 nodes: the loader, text encoder loader, text encode, the sampler (a style reference's latents from the
positive) and the VAE decode of the stock VAE Loader's qwen_image_vae, with the stock nodes' widgets; the style
reference's nodes are in krea2_reference.py."""
from __future__ import annotations

import weakref

import torch
from comfy_api.latest import io

from ..dit_core.families.krea2 import SAMPLING_MU, Krea2, latent_format
from ..dit_core.text.qwen3_vl import Krea2TextEncoder
from ..dit_core.sampling.ksampler import SAMPLERS, ksample, run_copy
from ..dit_core.sampling.schedules import TABLE_SCHEDULERS, flux_sigma_table
from ..dit_core.codecs import qwen_image_vae
from ..dit_core.codecs.qwen_image_vae import QwenImageDecoder
from ..dit_core.weights import TensorSource
from .base import (
    SwiftDiTError,
    check_family,
    checked,
    decode_image,
    dit_loader,
    text_encoder_loader,
    finite,
    interrupt_check,
    model_input,
    model_output,
    text_conditioning,
)
from .family_nodes import DiTLoaderNode, LoraLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode
from .family_settings import FLUX_MU, FamilySettings, PassSize, Schedule
from .krea2_reference import NODES as REFERENCE_NODES, reference_latents
from .memory import engine_device, graphed_dit_step, vae_on_device
from .queued_builds import QUEUED

CATEGORY = "SwiftDiT/Krea 2"
FAMILY = "krea2"
LATENT_CHANNELS = 16
SETTINGS = FamilySettings(
    schedule=Schedule(FLUX_MU, SAMPLING_MU),  # ModelSamplingFlux's mu, Krea 2's default at any size
    # an image row is a 2x2 patch of 8x8-pixel latent cells; before a prompt says its size, a pass has room for a
    # 2 MP image (8192 rows) and 1024 text rows
    pass_size=PassSize(image_row_pixels=16 * 16, default_rows=8192 + 1024))


load_dit = dit_loader(Krea2, SETTINGS.pass_size)


class Krea2Loader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTKrea2Loader", "Krea 2 Loader (SwiftDiT)", CATEGORY, FAMILY,
                                                 "Krea 2")
    DESCRIPTION = "Loads a Krea 2 diffusion model file (BF16, FP8 or INT8 ConvRot) for the SwiftDiT engine."
    SETTINGS = SETTINGS
    load = staticmethod(load_dit)


def flux_shift(max_shift: float, base_shift: float, width: int, height: int) -> float:
    """ModelSamplingFlux's shift (mu) for an image of width x height: the line through (256 tokens, base_shift) and
    (4096 tokens, max_shift) at its 2x2-patch tokens, in the stock node's order of operations."""
    slope = (max_shift - base_shift) / (4096 - 256)
    return (width * height / (8 * 8 * 2 * 2)) * slope + (base_shift - slope * 256)


class Krea2ModelSamplingFlux(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTKrea2ModelSamplingFlux", display_name="Krea 2 ModelSamplingFlux (SwiftDiT)",
            category=CATEGORY,
            description="The flux schedule's shift from the image size, as ModelSamplingFlux (Krea 2's default is "
                        "1.15 at any size; the style-reference template and the base model set it here).",
            inputs=[model_input("Krea 2"),
                    io.Float.Input("max_shift", default=1.15, min=0.0, max=100.0, step=0.01,
                                   tooltip="The shift at 4096 image tokens (1024x1024)"),
                    io.Float.Input("base_shift", default=0.5, min=0.0, max=100.0, step=0.01,
                                   tooltip="The shift at 256 image tokens (256x256)"),
                    io.Int.Input("width", default=1024, min=16, max=16384, step=8,
                                 tooltip="The image's width: the shift follows its size"),
                    io.Int.Input("height", default=1024, min=16, max=16384, step=8,
                                 tooltip="The image's height: the shift follows its size")],
            outputs=[model_output("Krea 2")])

    @classmethod
    def execute(cls, model, max_shift, base_shift, width, height) -> io.NodeOutput:
        node = "SwiftDiTKrea2ModelSamplingFlux"
        check_family(node, model, FAMILY, "Krea 2 loader")
        max_shift, base_shift = finite(node, "max_shift", max_shift), finite(node, "base_shift", base_shift)
        shift = flux_shift(max_shift, base_shift, width, height)
        if not shift > 0:
            raise SwiftDiTError(f"{node} · max_shift: the shift at {width}x{height} is {shift:g}; max_shift and "
                                f"base_shift must give a shift greater than 0")
        return io.NodeOutput(model.with_(schedule=model.schedule.at(shift)))


class Krea2LoraLoaderModelOnly(LoraLoaderNode):
    TITLE = "Krea 2"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTKrea2LoraLoaderModelOnly", "Krea 2 LoraLoaderModelOnly (SwiftDiT)", CATEGORY
    DESCRIPTION = "Merges a LoRA into the Krea 2 model's linears at load (the file's names, diffusers' or kohya's)."
    load = staticmethod(load_dit)


load_text_encoder = text_encoder_loader(Krea2TextEncoder, FAMILY)


class Krea2TextEncoderLoader(TextEncoderLoaderNode):
    TITLE = "Krea 2"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTKrea2TextEncoderLoader", "Krea 2 Text Encoder Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads Krea 2's Qwen3-VL-4B text encoder (BF16, FP8 or INT8 ConvRot)."
    TYPE = "krea2"
    load = staticmethod(load_text_encoder)


class Krea2TextEncode(TextEncodeNode):
    TITLE = "Krea 2"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTKrea2TextEncode", "Krea 2 Text Encode (SwiftDiT)", CATEGORY
    DESCRIPTION = "The prompt's text rows (Qwen3-VL layers 2, 5, ..., 35 of each token) as CONDITIONING."
    # valid rows only: [1, L, 12, 2560]
    conditioning = staticmethod(
        lambda clip, text: text_conditioning(load_text_encoder(clip).encode(text, interrupt_check)[None]))


def image_latent(node: str, samples: torch.Tensor) -> torch.Tensor:
    """The sampler's latent as [B, C, H, W]: EmptyLatentImage's [B, 4, H/8, W/8] zeros (widened to 16 channels by
    ksample, as ComfyUI's fix_empty_latent_channels) or Krea 2's own [B, 16, 1, H/8, W/8] (one frame)."""
    if samples.dim() == 5 and samples.shape[2] == 1:
        samples = samples[:, :, 0]
    if samples.dim() != 4 or samples.shape[-2] % 2 or samples.shape[-1] % 2:
        raise SwiftDiTError(f"{node} · latent_image: expected an image latent [B, 16, 1, H/8, W/8] (or Empty Latent "
                            f"Image's) with width and height multiples of 16 pixels, got {tuple(samples.shape)}")
    return samples


class Krea2Sampler(SamplerNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTKrea2Sampler", "Krea 2 KSampler (SwiftDiT)", CATEGORY,
                                                 FAMILY, "Krea 2")
    DESCRIPTION = ("KSampler for Krea 2 on the SwiftDiT engine (ModelSamplingFlux, shift 1.15); its latents decode "
                   "with the stock VAE Decode and qwen_image_vae. A style reference's latents come on the positive "
                   "(Krea 2 TextEncodeQwenImageEditPlus, index_timestep_zero).")
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 8, tuple(SAMPLERS), "euler", tuple(TABLE_SCHEDULERS), "simple"
    OUTPUT_TOOLTIP = "The denoised latent [B, 16, 1, H/8, W/8], for the stock VAE Decode"
    SETTINGS = SETTINGS
    load = staticmethod(load_dit)

    @classmethod
    def latent(cls, samples):
        return image_latent(cls.NODE_ID, samples)

    @classmethod
    def rows(cls, r):
        for name, rows in (("positive", r.positive), ("negative", r.negative)):
            if rows.dim() != 4:
                raise SwiftDiTError(f"{cls.NODE_ID} · {name}: not Krea 2 text rows [1, L, 12, 2560] (got "
                                    f"{tuple(rows.shape)}); encode the prompt with the Krea 2 Text Encode node")
        image = (r.latent.shape[-2] // 2) * (r.latent.shape[-1] // 2)
        # the references' tokens join each pass (their odd sides padded to the patch grid)
        image += sum(((z.shape[-2] + 1) // 2) * ((z.shape[-1] + 1) // 2)
                     for z in reference_latents(cls.NODE_ID, r.conditioning))
        text = max(r.positive.shape[1], r.negative.shape[1])
        return image, text, image + text

    @classmethod
    def sampling(cls, dit, r):
        device = engine_device()
        fused = {}  # id -> (conditioning, its text fusion on the device): once a sampler run, not once a step
        # the positive's references serve the negative's pass too (ConditioningZeroOut keeps them, as the
        # style-reference template's negative)
        refs = tuple(z.to(device) for z in reference_latents(cls.NODE_ID, r.conditioning))
        step = graphed_dit_step(dit, device)  # (while every block is resident and no reference rides along)
        # (the graphed step keeps each tensor's fusion across runs: a new seed of the same prompt fuses nothing)
        text_rows = dit.text_rows if step is None else lambda rows: step.text_rows(rows, torch.float32)

        def denoise_with(x, sigma, cond):  # x on the device: the sampler runs there
            if id(cond) not in fused:
                fused[id(cond)] = (cond, run_copy(torch.stack([text_rows(c) for c in cond.to(device)]), device))
            return dit.denoised(x, float(sigma), fused[id(cond)][1], interrupt_check, refs=refs, step=step)

        shift, scale = latent_format()

        def sample(callback, should_stop):
            return ksample(denoise_with, r.seed, r.steps, r.cfg, r.sampler_name, r.scheduler,
                           r.latent.to(device), positive=r.positive, negative=r.negative, denoise=r.denoise,
                           batch_index=r.latent_image.get("batch_index"), callback=callback, should_stop=should_stop,
                           latent_shift=shift, latent_scale=scale, latent_channels=LATENT_CHANNELS,
                           sigma_table=flux_sigma_table(r.model.schedule.shift))  # a FLUX_MU shift

        return sample, r.steps

    @classmethod
    def output(cls, samples):
        return samples[:, :, None]  # Krea 2's [B, 16, 1, H/8, W/8]


class StockVae:
    """The stock VAE Loader's VAE as a slot's key in LOADED: our decoder of its weights is made once for that VAE
    (a weak reference to its model: a VAE loaded again, or another file, makes it again)."""

    def __init__(self, vae):
        self.model = getattr(vae, "first_stage_model", None)

    def key(self) -> tuple:
        return ("vae", ("qwen_image_vae (the stock VAE Loader's)", weakref.ref(self.model)))


class Krea2VAEDecode(io.ComfyNode):
    NODE_ID = "SwiftDiTKrea2VAEDecode"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="Krea 2 VAE Decode (SwiftDiT)", category=CATEGORY,
            description="Decodes Krea 2 latents to an IMAGE with the stock VAE Loader's qwen_image_vae: one frame's "
                        "2-D decode of its weights on the SwiftDiT engine (the stock VAE Decode runs its 3-D convs).",
            inputs=[io.Latent.Input("samples", tooltip="The latent from the Krea 2 sampler"),
                    io.Vae.Input("vae", tooltip="qwen_image_vae, from the stock VAE Loader")],
            outputs=[io.Image.Output(tooltip="The decoded image")])

    @classmethod
    def queued_builds(cls, device: torch.device) -> tuple[tuple, object]:
        """(key, begin) of the decoder's norm kernels, built from the moment a prompt with this node is queued: the
        decoder is made at this node, and its kernels took the first decode 2.8 s on a new H100 machine."""
        return ("qwen_image_vae norms", device), lambda: qwen_image_vae.norms_built_ahead(device, torch.bfloat16)

    @classmethod
    def execute(cls, samples, vae) -> io.NodeOutput:
        node = cls.NODE_ID
        handle = StockVae(vae)
        if handle.model is None or not hasattr(handle.model, "state_dict"):
            raise SwiftDiTError(f"{node} · vae: expected the VAE of a stock VAE Loader (qwen_image_vae.safetensors), "
                                f"got {type(vae).__name__}")

        def load():
            queued = QUEUED.take(cls.queued_builds(engine_device())[0])
            if queued is not None:  # (the same kernels, not built twice)
                queued.join()
            with checked(node, "vae"):
                return QwenImageDecoder.load(TensorSource(handle.model.state_dict(), "the VAE Loader's VAE"))
        return io.NodeOutput(decode_image(node, vae_on_device(handle, load, FAMILY), samples))


NODES = [Krea2Loader, Krea2ModelSamplingFlux, Krea2LoraLoaderModelOnly, Krea2TextEncoderLoader, Krea2TextEncode,
         *REFERENCE_NODES, Krea2Sampler, Krea2VAEDecode]
