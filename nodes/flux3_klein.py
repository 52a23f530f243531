"""FLUX.3 Klein nodes: loaders, text encode, the sampler (step cache, reference edits), VAE decode and encode."""
from __future__ import annotations

import torch
from comfy_api.latest import io

from ..dit_core.families.flux3_klein import Flux3Klein
from ..dit_core.text.qwen3_vl import Qwen3VLTextEncoder
from ..dit_core.sampling.ksampler import prepare_noise, run_copy
from ..dit_core.sampling.klein import sample_klein
from ..dit_core.sampling.schedules import klein_sigmas
from ..dit_core.sampling.step_cache import StepCache
from ..dit_core.codecs.flux2_vae import PACKED, Flux2VAE
from .base import (
    FileHandle,
    SwiftDiTError,
    cancellable,
    checked,
    dit_loader,
    text_encoder_loader,
    decode_image,
    decode_schema,
    finite,
    interrupt_check,
    text_conditioning,
)
from .family_nodes import DiTLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode, VAELoaderNode
from .family_settings import KLEIN, FamilySettings, PassSize, Schedule
from .memory import engine_device, graphed_dit_step, log, vae_on_device
from .types import Vae

CATEGORY = "SwiftDiT/FLUX.3 Klein"
FAMILY = "flux3_klein"
SETTINGS = FamilySettings(
    # Sigmas shift_16(linspace(1, 1/n, n)) then 0, as BFL's code and ComfyUI's klein workflows sample
    # (reference/families/flux3_klein.md section 7, sampling).
    schedule=Schedule(KLEIN, 16.0),
    # an image row is one 16x16-pixel cell of the packed FLUX.2 latent; before a prompt says its size, a pass has
    # room for a 2 MP image (8192 rows) and 1024 text rows
    pass_size=PassSize(image_row_pixels=16 * 16, default_rows=8192 + 1024))
# ComfyUI's reference-image key: ReferenceLatent (comfy_extras/nodes_edit_model.py) and ReferenceMultiLatent
# append [B, 128, h, w] latents to this list on the conditioning.
REFERENCES = "reference_latents"


load_dit = dit_loader(Flux3Klein, SETTINGS.pass_size)


load_text_encoder = text_encoder_loader(Qwen3VLTextEncoder, FAMILY)


def load_vae(handle: FileHandle) -> Flux2VAE:
    return vae_on_device(handle, lambda: cancellable(Flux2VAE.load, handle.path), FAMILY, role=handle.role)


class Flux3KleinLoader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTFlux3KleinLoader", "FLUX.3 Klein Loader (SwiftDiT)", CATEGORY
    FAMILY, TITLE, SETTINGS = FAMILY, "FLUX.3 Klein", SETTINGS
    DESCRIPTION = ("Loads a FLUX.3 Klein diffusion model file (distilled or base; BF16, FP8 or INT8 ConvRot) for the "
                   "SwiftDiT engine.")
    load = staticmethod(load_dit)


class Flux3KleinTextEncoderLoader(TextEncoderLoaderNode):
    TITLE = "FLUX.3 Klein"
    NODE_ID, DISPLAY = "SwiftDiTFlux3KleinTextEncoderLoader", "FLUX.3 Klein Text Encoder Loader (SwiftDiT)"
    CATEGORY, TYPE = CATEGORY, "flux3"
    DESCRIPTION = "Loads FLUX.3 Klein's Qwen3-VL-4B text encoder (BF16, FP8 or INT8 ConvRot)."
    load = staticmethod(load_text_encoder)


class Flux3KleinTextEncode(TextEncodeNode):
    TITLE = "FLUX.3 Klein"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTFlux3KleinTextEncode", "FLUX.3 Klein Text Encode (SwiftDiT)", CATEGORY
    DESCRIPTION = ("The prompt's Qwen3-VL rows (layers 4, 8, ..., 32 stacked, padded to a multiple of 80 tokens) as "
                   "CONDITIONING.")
    # pad rows included: the DiT attends them
    conditioning = staticmethod(
        lambda clip, text: text_conditioning(load_text_encoder(clip).encode(text, interrupt_check)))


class Flux3KleinSampler(SamplerNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTFlux3KleinSampler", "FLUX.3 Klein KSampler (SwiftDiT)",
                                                 CATEGORY, FAMILY, "FLUX.3 Klein")
    DESCRIPTION = ("KSampler for FLUX.3 Klein on the SwiftDiT engine, with the step cache; reference images come on "
                   "the positive conditioning (ReferenceLatent, ReferenceMultiLatent).")
    # FLUX.3 Klein samples with Euler on its own schedule (SETTINGS.schedule, a KLEIN shift: its 'simple' table).
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 16, ("euler",), "euler", ("simple",), "simple"
    SETTINGS = SETTINGS
    load = staticmethod(load_dit)

    @classmethod
    def extra_inputs(cls) -> list:
        return [io.Float.Input("cache", default=0.3, min=0.0, max=1.0, step=0.01,
                               tooltip="Step cache limit on the first block's change: a step under it skips the "
                                       "other blocks. 0 runs every block; 0.3 suits distilled Klein"),
                io.Int.Input("refresh", default=0, min=0, max=10000,
                             tooltip="Edits: recompute the reference images' keys and values every this many steps "
                                     "and reuse them between; 0 recomputes them every step")]

    @classmethod
    def checked_extra(cls, cache=0.3, refresh=0) -> dict:
        return {"cache": finite(cls.NODE_ID, "cache", cache, 0.0, 1.0), "refresh": int(refresh)}

    @classmethod
    def latent(cls, samples):
        if samples.dim() != 4 or samples.shape[1] != PACKED:
            raise SwiftDiTError(f"{cls.NODE_ID} · latent_image: expected a FLUX.2 latent [B, {PACKED}, H/16, W/16] "
                                f"(EmptyFlux2LatentImage), got {tuple(samples.shape)}")
        return samples

    @classmethod
    def references(cls, r) -> list:
        refs = r.conditioning[0][1].get(REFERENCES) or []
        for j, ref in enumerate(refs):
            if not isinstance(ref, torch.Tensor) or ref.dim() != 4 or ref.shape[1] != PACKED:
                got = tuple(ref.shape) if isinstance(ref, torch.Tensor) else type(ref).__name__
                raise SwiftDiTError(f"{cls.NODE_ID} · positive: reference latent {j} is {got}, expected a FLUX.2 "
                                    f"latent [B, {PACKED}, h, w]; encode references with the FLUX.2 VAE")
        return refs

    @classmethod
    def rows(cls, r):
        # A pass's rows: the image's tokens, the longest text rows and every reference's tokens.
        image = r.latent.shape[-2] * r.latent.shape[-1] + sum(f.shape[-2] * f.shape[-1] for f in cls.references(r))
        text = max(r.positive.shape[-2], r.negative.shape[-2])
        return image, text, image + text

    @classmethod
    def loaded(cls, dit, r):
        if cls.references(r) and not dit.mode_blocks["image_cond"]:
            raise SwiftDiTError(f"{cls.NODE_ID} · positive: this model file takes no reference images (no "
                                f"image_cond blocks); remove ReferenceLatent or load an edit-capable Klein")

    @classmethod
    def sampling(cls, dit, r):
        node, refs, latent = cls.NODE_ID, cls.references(r), r.latent
        cache, refresh = r.extra["cache"], r.extra["refresh"]
        with checked(node, "steps"):
            sigmas = klein_sigmas(r.steps, r.model.schedule.shift, r.denoise)
        if len(sigmas) < 2:  # denoise 0: nothing to do, as KSampler
            return None
        noise = prepare_noise(latent, r.seed, r.latent_image.get("batch_index"))
        device, batch, steps = engine_device(), latent.shape[0], r.steps
        step = graphed_dit_step(dit, device)  # the joint blocks, while every block is resident
        pick = lambda t, i: run_copy(t[min(i, t.shape[0] - 1)], device)  # noqa: E731  a batch of one serves every image

        def sample(callback, should_stop):
            out = []
            for i in range(batch):
                step_cache = StepCache(cache)
                x = sample_klein(dit, noise[i].to(device), sigmas, pick(r.positive, i), [pick(f, i) for f in refs],
                                 step_cache, refresh, negative=pick(r.negative, i), cfg=r.cfg,
                                 callback=lambda s, n, x, x0, i=i: callback(i * steps + s, batch * steps, x, x0),
                                 should_stop=should_stop, latent=pick(latent, i), step=step)
                out.append(x.cpu())
                if cache > 0:
                    log.info("%s: step cache %.3g skipped %d of %d steps (image %d of %d)", node, cache,
                             step_cache.skipped, step_cache.steps, i + 1, batch)
            return torch.stack(out)

        return sample, batch * steps


class Flux3KleinVAELoader(VAELoaderNode):
    TITLE = "FLUX.3 Klein"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTFlux3KleinVAELoader", "FLUX.3 Klein VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads the FLUX.2 VAE (flux2-vae.safetensors): decode, and encode for reference images."
    load = staticmethod(load_vae)


class Flux3KleinVAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTFlux3KleinVAEDecode", display_name="FLUX.3 Klein VAE Decode (SwiftDiT)",
            category=CATEGORY, description="Decodes FLUX.2 latents [B, 128, H/16, W/16] to an IMAGE, in tiles for "
                                           "large images.",
            **decode_schema("FLUX.3 Klein"))

    @classmethod
    def execute(cls, samples, vae) -> io.NodeOutput:
        return io.NodeOutput(decode_image("SwiftDiTFlux3KleinVAEDecode", load_vae(vae), samples))


class Flux3KleinVAEEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SwiftDiTFlux3KleinVAEEncode", display_name="FLUX.3 Klein VAE Encode (SwiftDiT)",
            category=CATEGORY, description="Encodes an IMAGE to a FLUX.2 latent (sizes cropped to multiples of 16), "
                                           "e.g. a reference image for ReferenceLatent.",
            inputs=[io.Image.Input("pixels", tooltip="The reference image to encode"),
                    Vae.Input("vae", tooltip="The FLUX.2 VAE, from its VAE Loader")],
            outputs=[io.Latent.Output(tooltip="The image's FLUX.2 latent, for ReferenceLatent")])

    @classmethod
    def execute(cls, pixels, vae) -> io.NodeOutput:
        with checked("SwiftDiTFlux3KleinVAEEncode", "pixels"):
            return io.NodeOutput({"samples": load_vae(vae).encode(pixels)})


NODES = [Flux3KleinLoader, Flux3KleinTextEncoderLoader, Flux3KleinTextEncode, Flux3KleinSampler,
         Flux3KleinVAELoader, Flux3KleinVAEDecode, Flux3KleinVAEEncode]
