"""The node classes every family specializes by class constants and a few methods (the GGUF habit: a variant overrides
only what differs): the DiT loader, LoraLoaderModelOnly, the text encoder loader, text encode, the VAE loader and the
KSampler."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import comfy.model_management
import folder_paths
import torch
from comfy_api.latest import io

from ..dit_core.families import FAMILIES
from ..dit_core.weights.lora import LoraMismatch
from .base import (FileHandle, ModelHandle, SwiftDiTError, build_ahead_of_sampling, check_family, checked,
                   conditioning_rows, file_checked, finite, gpus_input, ksampler_inputs, linear_mode, load_model,
                   loader_inputs, loading_shown, model_file, model_input, model_output, rank_count, run_sampler,
                   sampler_widgets, show_on_node)
from .family_settings import FamilySettings
from .memory import MAIN, check_request
from .types import TextEncoder, Vae


class DiTLoaderNode(io.ComfyNode):
    """UNETLoader's widgets (unet_name, weight_dtype), then ours (linears, gpu_budget_gb; gpus where the family
    table's loader_extra has it: its steps sequence-parallel): the model handle, the model loaded at once (its errors
    name unet_name) and where its bytes went as the node's text. SETTINGS: the family's (its default schedule goes
    on the handle)."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = FAMILY = TITLE = ""
    SETTINGS: FamilySettings

    @staticmethod
    def load(handle: ModelHandle):
        raise NotImplementedError

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY,
                         description=cls.DESCRIPTION,
                         inputs=[*loader_inputs(cls.TITLE),
                                 *([gpus_input()] if "gpus" in dict(FAMILIES[cls.FAMILY].loader_extra) else [])],
                         outputs=[model_output(cls.TITLE)], hidden=[io.Hidden.unique_id])

    @classmethod
    def validate_inputs(cls, unet_name) -> bool | str:
        return file_checked(cls, "diffusion_models", unet_name, "unet_name")

    @classmethod
    def queued_load(cls, inputs: dict) -> tuple[str, str] | None:
        """(file, linears mode) of a queued prompt's inputs for this node (nodes/queued_builds.py), as execute reads
        them; None where it would refuse them, where they are links rather than values, or for several GPUs."""
        values = [inputs.get(k) for k in ("unet_name", "weight_dtype", "linears")]
        if not all(isinstance(v, str) for v in values) or str(inputs.get("gpus", "1")) != "1":
            return None
        try:
            return (model_file(cls.NODE_ID, "diffusion_models", values[0], "unet_name"),
                    linear_mode(cls.NODE_ID, values[1], values[2]))
        except (SwiftDiTError, FileNotFoundError):
            return None

    @classmethod
    def execute(cls, unet_name, weight_dtype, linears, gpu_budget_gb=0.0, gpus="1") -> io.NodeOutput:
        budget = finite(cls.NODE_ID, "gpu_budget_gb", gpu_budget_gb, 0.0)
        path = model_file(cls.NODE_ID, "diffusion_models", unet_name, "unet_name")
        handle = ModelHandle(cls.FAMILY, path, linear_mode(cls.NODE_ID, weight_dtype, linears),
                             schedule=cls.SETTINGS.schedule, gpu_budget_gb=budget, gpus=rank_count(cls.NODE_ID, gpus))
        where = load_model(cls.NODE_ID, handle, cls.load)
        show_on_node(cls, where)
        return io.NodeOutput(handle, ui={"text": [where]})


class LoraLoaderNode(io.ComfyNode):
    """LoraLoaderModelOnly's inputs (model, lora_name, strength_model); a family's node sets the constants and
    `load` (its load_dit: the merge is checked at once, so a LoRA of another model fails on this node)."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = TITLE = ""

    @staticmethod
    def load(handle: ModelHandle):
        raise NotImplementedError

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY, description=cls.DESCRIPTION,
            inputs=[model_input(cls.TITLE),
                    io.Combo.Input("lora_name", options=folder_paths.get_filename_list("loras"),
                                   tooltip=f"A {cls.TITLE} LoRA from models/loras (merged into the weights at load)"),
                    io.Float.Input("strength_model", default=1.0, min=-100.0, max=100.0, step=0.01,
                                   tooltip="How strongly the LoRA changes the model; 0 leaves it off")],
            outputs=[model_output(cls.TITLE)])

    @classmethod
    def validate_inputs(cls, lora_name) -> bool | str:
        return file_checked(cls, "loras", lora_name, "lora_name")

    @classmethod
    def execute(cls, model, lora_name, strength_model) -> io.NodeOutput:
        strength = finite(cls.NODE_ID, "strength_model", strength_model)
        if strength == 0:
            return io.NodeOutput(model)
        path = model_file(cls.NODE_ID, "loras", lora_name, "lora_name")
        handle = model.with_(loras=(*model.loras, (path, strength)))
        with checked(cls.NODE_ID, "lora_name"), loading_shown():
            try:
                cls.load(handle)
            except LoraMismatch as e:  # the engine's message names the file and what is wrong; the fix names the family
                raise LoraMismatch(f"{e}; pick a {cls.TITLE} LoRA (one trained on this model) or bypass this node") \
                    from e
        return io.NodeOutput(handle)


class TextEncodeNode(io.ComfyNode):
    """CLIPTextEncode's inputs (text, clip): the family's `conditioning(clip handle, text)`, its errors naming text."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = TITLE = ""

    @staticmethod
    def conditioning(clip: FileHandle, text: str) -> list:
        raise NotImplementedError

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY, description=cls.DESCRIPTION,
            inputs=[io.String.Input("text", multiline=True, dynamic_prompts=True, tooltip="The prompt"),
                    TextEncoder.Input("clip", tooltip=f"The {cls.TITLE} text encoder, from its Text Encoder Loader")],
            outputs=[io.Conditioning.Output(tooltip="The prompt's text rows, as CLIPTextEncode gives them, for the "
                                                    "KSampler's positive (or ConditioningZeroOut's input)")])

    @classmethod
    def execute(cls, text, clip) -> io.NodeOutput:
        with checked(cls.NODE_ID, "text"):
            return io.NodeOutput(cls.conditioning(clip, text))


class FileLoaderNode(io.ComfyNode):
    """Base of the loaders of one file from a ComfyUI models folder (text encoders, VAEs). ROLE: which of the
    family's models of KIND the file is (its handle's role, its slot in LOADED with KIND): MAIN where a family has
    one, e.g. "video" and "audio" for a family's two VAEs so that both stay loaded."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = TITLE = ""
    FOLDER = INPUT = KIND = ""
    ROLE = MAIN

    @staticmethod
    def load(handle: FileHandle):
        raise NotImplementedError

    @classmethod
    def extra_inputs(cls) -> list:
        return []

    @classmethod
    def output(cls):
        raise NotImplementedError

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY,
                         description=cls.DESCRIPTION,
                         inputs=[io.Combo.Input(cls.INPUT, options=folder_paths.get_filename_list(cls.FOLDER),
                                                tooltip=f"A {cls.TITLE} file from models/{cls.FOLDER}"),
                                 *cls.extra_inputs()],
                         outputs=[cls.output()])

    @classmethod
    def execute(cls, **inputs) -> io.NodeOutput:
        handle = FileHandle(cls.KIND, model_file(cls.NODE_ID, cls.FOLDER, inputs[cls.INPUT], cls.INPUT), cls.ROLE,
                            inputs.get("device", "default"))
        with checked(cls.NODE_ID, cls.INPUT):
            with loading_shown():
                cls.load(handle)
        return io.NodeOutput(handle)


class TextEncoderLoaderNode(FileLoaderNode):
    """CLIPLoader's widgets (clip_name, type with the family's value, optional device)."""
    FOLDER, INPUT, KIND = "text_encoders", "clip_name", "text"
    TYPE = ""

    @classmethod
    def validate_inputs(cls, clip_name) -> bool | str:  # its one input by name: ComfyUI passes those it names
        return file_checked(cls, cls.FOLDER, clip_name, cls.INPUT)

    @classmethod
    def extra_inputs(cls) -> list:
        return [io.Combo.Input("type", options=[cls.TYPE], default=cls.TYPE,
                               tooltip="CLIPLoader's type for this model (kept for workflow compatibility)"),
                io.Combo.Input("device", options=["default", "cpu"], default="default", optional=True,
                               tooltip="default: where ComfyUI runs models (on a GPU, in BF16); cpu: on the "
                                       "host in float32, as CLIPLoader's cpu")]

    @classmethod
    def output(cls):
        return TextEncoder.Output(tooltip=f"The {cls.TITLE} text encoder, for its Text Encode node")


class VAELoaderNode(FileLoaderNode):
    """VAELoader's widget (vae_name)."""
    FOLDER, INPUT, KIND = "vae", "vae_name", "vae"

    @classmethod
    def validate_inputs(cls, vae_name) -> bool | str:
        return file_checked(cls, cls.FOLDER, vae_name, cls.INPUT)

    @classmethod
    def output(cls):
        return Vae.Output(tooltip=f"The {cls.TITLE} VAE, for its VAE Decode node")


@dataclass(frozen=True)
class SamplerRequest:
    """What a sampler node was asked, its widgets checked: the conditionings' rows, the family's view of the latent
    (`latent`) and the LATENT as given (`latent_image`: batch_index, what the output keeps), and the family's own
    widgets (`extra`, e.g. FLUX.3 Klein's cache and refresh)."""
    model: ModelHandle
    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    denoise: float
    positive: torch.Tensor
    negative: torch.Tensor
    conditioning: list  # the positive CONDITIONING as given (FLUX.3 Klein reads its reference latents)
    latent: torch.Tensor
    latent_image: dict
    extra: dict


class SamplerNode(io.ComfyNode):
    """KSampler's inputs in KSampler's order (then the family's extra widgets) and the one body every family's
    sampler runs: widgets checked before any work, the conditionings' rows, the request's memory checked as the
    model loads (memory.check_request), then the family's sampling with ComfyUI's progress and cancel. A family
    sets the constants (SETTINGS: its pass-size estimate for the memory check) and overrides what differs: latent
    (its latent's checks and view), rows (a pass's image and text rows), loaded (checks that need the model) and
    sampling (its loop, on the handle's schedule)."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = FAMILY = TITLE = ""
    SETTINGS: FamilySettings
    STEPS, SAMPLERS, SAMPLER, SCHEDULERS, SCHEDULER = 8, ("euler",), "euler", ("simple",), "simple"
    OUTPUT_TOOLTIP = "The denoised latent, for the VAE Decode node"
    NOISE_MASK = False  # whether the family's sampling reads latent_image's noise_mask (else it is refused)

    @staticmethod
    def load(handle: ModelHandle, rows: int, check: Callable):
        raise NotImplementedError

    @classmethod
    def extra_inputs(cls) -> list:
        return []

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY, description=cls.DESCRIPTION,
            inputs=[*ksampler_inputs(model_input(cls.TITLE), cls.STEPS, list(cls.SAMPLERS), cls.SAMPLER,
                                     list(cls.SCHEDULERS), cls.SCHEDULER), *cls.extra_inputs()],
            outputs=[io.Latent.Output(tooltip=cls.OUTPUT_TOOLTIP)], hidden=[io.Hidden.unique_id])

    @classmethod
    def checked_extra(cls, **extra) -> dict:
        """The family's own widgets, checked where they enter (finite, in range), as the request carries them."""
        return extra

    @classmethod
    def latent(cls, samples: torch.Tensor) -> torch.Tensor:
        """The family's view of latent_image["samples"]; SwiftDiTError naming latent_image when it is not one."""
        return samples

    @classmethod
    def rows(cls, r: SamplerRequest) -> tuple[int, int, int]:
        """(image rows, text rows, the rows the model is fitted for) of one image's pass."""
        raise NotImplementedError

    @classmethod
    def loaded(cls, dit, r: SamplerRequest) -> None:
        """Checks that need the loaded model (SwiftDiTError naming the input)."""

    @classmethod
    def sampling(cls, dit, r: SamplerRequest) -> tuple[Callable, int] | None:
        """(sample(callback, should_stop) -> the latents, its progress steps), or None: the latent as it is."""
        raise NotImplementedError

    @classmethod
    def output(cls, samples: torch.Tensor) -> torch.Tensor:
        return samples

    @classmethod
    def execute(cls, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise,
                **extra) -> io.NodeOutput:
        node = cls.NODE_ID
        check_family(node, model, cls.FAMILY, f"{cls.TITLE} loader")
        sampler_widgets(node, cfg, denoise, sampler_name, cls.SAMPLERS, scheduler, cls.SCHEDULERS)
        extra = cls.checked_extra(**extra)
        if "noise_mask" in latent_image and not cls.NOISE_MASK:
            raise SwiftDiTError(f"{node} · latent_image: masked latents (inpainting) are not supported yet")
        latent = cls.latent(latent_image["samples"])
        pos, neg = conditioning_rows(node, "positive", positive), conditioning_rows(node, "negative", negative)
        r = SamplerRequest(model, seed, steps, float(cfg), sampler_name, scheduler, float(denoise), pos, neg,
                           positive, latent, latent_image, extra)
        image_rows, text_rows, pass_rows = cls.rows(r)
        passes = 1 if cfg == 1 else 2  # the negative's pass beside the positive's
        with checked(node, "model"):
            dit = cls.load(model, pass_rows, lambda dit: check_request(dit, cls.SETTINGS.pass_size, image_rows,
                                                                       text_rows, steps, passes,
                                                                       say=lambda text: show_on_node(cls, text)))
        cls.loaded(dit, r)
        # Keyed on the image's shape, not the prompt's length: a new prompt should not pay a dry step (a kernel a new
        # length might still need builds as the step reaches it). Ranks build their own as they step.
        shape = tuple(latent.shape) if isinstance(latent, torch.Tensor) else tuple(tuple(t.shape) for t in latent)
        if model.gpus == 1:
            build_ahead_of_sampling("dit", (cls.FAMILY, shape, passes), lambda: cls.sampling(dit, r),
                                    say=lambda text: show_on_node(cls, text))
        run = cls.sampling(dit, r)
        if run is None:
            return io.NodeOutput(latent_image)
        sample, total = run
        with checked(node, "latent_image"):
            samples = run_sampler(sample, total)
        # the sampler ran where the model does; the LATENT goes where ComfyUI keeps its own (the CPU by default)
        samples = samples.to(comfy.model_management.intermediate_device())
        return io.NodeOutput({**latent_image, "samples": cls.output(samples)})
