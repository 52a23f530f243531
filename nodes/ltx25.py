"""LTX-2.5 nodes, text and images to video + audio as the templates run it: the DiT and text encoder loaders, text
encode and a sampler per stage (one SamplerCustomAdvanced group of a template); with the VAE, audio and latent nodes
of nodes/ltx25_codecs.py and the frame nodes of nodes/ltx25_frames.py, all in NODES. Stock EmptyLTXVLatentVideo,
LTXVConcat/SeparateAVLatent and LTXVConditioning stay in the graph. The DiT, its text connectors and the text encoder
run where ComfyUI computes (a CUDA GPU: the DiT's layers through kernels/ within the loader's budget, the encoder in
the file's precision; else the f32 host path); the codecs on the host for now."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.families.ltx25 import LTX25
from ..dit_core.parallel import RankedModel
from ..dit_core.sampling.ltx25 import STAGE_1_SIGMAS, Prompt, Stage, manual_sigmas, packed_model, sample_stage
from ..dit_core.text.gemma4 import Gemma4TextEncoder, LTX25TextConnectors
from .base import (FileHandle, ModelHandle, SwiftDiTError, cancellable, finite, interrupt_check, room_before,
                   text_conditioning)
from .family_nodes import DiTLoaderNode, SamplerNode, TextEncodeNode, TextEncoderLoaderNode
from .family_settings import FamilySettings, PassSize
from .ltx25_codecs import CODEC_NODES
from .ltx25_frames import CATEGORY, FAMILY, FRAME_NODES, HOST, host_model, sampler_frames
from .memory import LOADED, dit_on_device, engine_device, graphed_dit_step, make_room, ranked_dit

FRAME_RATE = 25  # the RoPE's fps where no LTXVConditioning set one (ComfyUI's LTXV extra_conds default)
SETTINGS = FamilySettings(
    schedule=None,  # no shift: each stage samples ManualSigmas' list as typed
    # a video row is one 32x32-pixel latent cell of 8 frames; the template's stage 2 (1280x704, 121 frames):
    # 16 x 22 x 40 video rows, 127 audio rows and the connectors' 1024 text rows
    pass_size=PassSize(image_row_pixels=32 * 32, default_rows=16 * 22 * 40 + 127 + 1024, video=True))


@dataclass(frozen=True)
class LoadedDiT:
    """The DiT file's two models: the transformer, and the text connectors that turn the text encoder's features
    into its prompt rows (ComfyUI's LTX-AV model runs them inside the model too)."""
    transformer: LTX25
    connectors: LTX25TextConnectors

    @property
    def arch(self):  # the video stream's: what sizes a pass (nodes/memory.py)
        return self.transformer.arch

    @property
    def blocks(self):  # the transformer's layers: what streams (nodes/memory.py fit_blocks)
        return self.transformer.blocks

    def to(self, device: torch.device, budget_bytes=None) -> LoadedDiT:
        """The transformer where it runs (LTX25.to); the connectors stay where read_dit read them (there already)."""
        return LoadedDiT(self.transformer.to(device, budget_bytes=budget_bytes), self.connectors)

    @property
    def alive(self) -> bool:  # a transformer in ranks (the loader's gpus) whose ranks failed is not
        return getattr(self.transformer, "alive", True)

    def close(self) -> None:  # its ranks stop, where it has some
        if isinstance(self.transformer, RankedModel):
            self.transformer.close()


def read_connectors(ckpt, device: torch.device) -> LTX25TextConnectors:
    """The connectors read straight to device. On a GPU their linears are BF16 (residual, norms and attention f32):
    2.0 B parameters at the release's 8 blocks a stream, 8 GB in f32 against 4 in BF16 beside a DiT on a 16 GB
    budget, run once a prompt, and the DiT's GPU path reads its text rows through BF16/INT8 linears anyway. Room is
    made for them first (memory.make_room: ComfyUI's models, then our text encoders, go), so they are there before
    the DiT's block budget is taken."""
    if device.type != "cuda":
        return LTX25TextConnectors.load(ckpt)
    make_room(device, 2 * sum(math.prod(ckpt.shape(k)) for k in ckpt.keys() if "_embeddings_connector." in k))
    return LTX25TextConnectors.load(ckpt, device=device, dtype=torch.bfloat16)


def read_dit(ckpt, device: torch.device = HOST) -> LoadedDiT:
    """The transformer on the host (LoadedDiT.to places it; read first: a file of another model is named as such) and
    the connectors (read_connectors)."""
    transformer = LTX25.load(ckpt)
    return LoadedDiT(transformer, read_connectors(ckpt, device))


def load_dit(handle: ModelHandle, rows: int | None = None, check=None) -> LoadedDiT:
    """The DiT where ComfyUI computes: on a CUDA GPU within the loader's gpu_budget_gb, fitted for a pass over rows
    (memory.dit_on_device; check: SamplerNode's memory check), else on the host (f32); with the loader's gpus, the
    transformer in that many ranks (memory.ranked_dit) and the connectors here. check runs on each path."""
    device = engine_device()
    if handle.gpus > 1:
        connectors = lambda ranked: LoadedDiT(  # noqa: E731
            ranked, cancellable(lambda f: read_connectors(f, device), handle.path))
        return ranked_dit(handle, LTX25.load, LTX25, SETTINGS.pass_size, check, wrap=connectors)
    if device.type == "cuda":
        return dit_on_device(handle, lambda: cancellable(lambda f: read_dit(f, device), handle.path),
                             SETTINGS.pass_size, rows, check)
    dit = host_model("dit", handle, read_dit)
    if check is not None:  # the host's memory checked as dit_on_device checks the card's, before any step
        check(dit)
    return dit


def load_text_encoder(handle: FileHandle) -> Gemma4TextEncoder:
    """The loader's Gemma-4 (its tokenizer the file's own), kept in LOADED's "text" slot per file, device and family,
    Cancel honoured. On a CUDA GPU (unless the loader's device is cpu) in the file's precision, each tensor read
    straight to the card: BF16, its INT8 ConvRot linears as stored on the INT8 kernels (12 B: 24 GB in BF16, about
    half as INT8); the DiT's room takes it back when short (memory.make_room gives back kind "text"). Elsewhere the
    f32 host reference."""
    device = HOST if handle.device == "cpu" else engine_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    load = lambda f: room_before(f, device, int8_kept=True) or Gemma4TextEncoder.load(  # noqa: E731
        f, dtype=dtype, device=device)  # on CUDA its INT8 linears stay INT8 (load's default there)
    return LOADED.get("text", (*handle.key(), str(device), FAMILY), lambda: cancellable(load, handle.path), device,
                      handle.role)


class LTX25Loader(DiTLoaderNode):
    NODE_ID, DISPLAY, CATEGORY, FAMILY, TITLE = ("SwiftDiTLTX25Loader", "LTX-2.5 Loader (SwiftDiT)", CATEGORY, FAMILY,
                                                 "LTX-2.5")
    DESCRIPTION = ("Loads the LTX-2.5 audio-video model file (INT8 ConvRot or BF16) and its text connectors (on one "
                   "GPU or several: gpus).")
    SETTINGS, load = SETTINGS, staticmethod(load_dit)

    @classmethod
    def execute(cls, unet_name, weight_dtype, linears, gpu_budget_gb=0.0, gpus="1") -> io.NodeOutput:
        for name, value, kept in (("weight_dtype", weight_dtype, "default"), ("linears", linears, "as stored")):
            if value != kept:
                raise SwiftDiTError(f"{cls.NODE_ID} · {name}: LTX-2.5's linears run as the file stores them (INT8 "
                                    f"ConvRot or BF16) for now; set {name} to {kept!r}")
        return super().execute(unet_name, weight_dtype, linears, gpu_budget_gb, gpus)


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
                                        "2: 0.85, 0.7250, 0.4219, 0.0)"),
                # optional: workflows saved before them keep loading (1, 1: KSamplerSelect's euler_ancestral)
                io.Float.Input("eta", default=1.0, min=0.0, max=100.0, step=0.01, optional=True,
                               tooltip="SamplerEulerAncestral's eta: the noise added back each step (0: plain "
                                       "Euler; the first/last frame template: 0)"),
                io.Float.Input("s_noise", default=1.0, min=0.0, max=100.0, step=0.01, optional=True,
                               tooltip="SamplerEulerAncestral's s_noise: the scale of that noise")]

    @classmethod
    def checked_extra(cls, audio_cfg=1.0, sigmas=STAGE_1_SIGMAS, eta=1.0, s_noise=1.0) -> dict:
        values = manual_sigmas(sigmas)
        if len(values) < 2 or values[0] > 1 or values[-1] < 0 or (values[1:] >= values[:-1]).any():
            raise SwiftDiTError(f"{cls.NODE_ID} · sigmas: {sigmas!r} is not a falling list of noise levels within "
                                f"[0, 1] (ManualSigmas' text, e.g. {STAGE_1_SIGMAS!r})")
        return {"audio_cfg": finite(cls.NODE_ID, "audio_cfg", audio_cfg, 0.0), "sigmas": values,
                "eta": finite(cls.NODE_ID, "eta", eta, 0.0), "s_noise": finite(cls.NODE_ID, "s_noise", s_noise, 0.0)}

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
        # the sampler's state where the transformer runs, as ComfyUI's (its ancestral noise drawn there too)
        video, audio = (t.to(dit.transformer.device) for t in r.latent)
        stage = Stage(r.extra["sigmas"], r.seed, r.cfg, r.extra["audio_cfg"])
        fps = float(r.conditioning[0][1].get("frame_rate", FRAME_RATE))  # LTXVConditioning's
        positive = prompt_rows(dit.connectors, r.positive)
        one_pass = math.isclose(stage.video_cfg, 1.0) and math.isclose(stage.audio_cfg, 1.0)
        negative = None if one_pass else prompt_rows(dit.connectors, r.negative)
        mask, frames = sampler_frames(cls.NODE_ID, r.latent_image, r.conditioning, video, audio)
        # (while every layer is resident; stage 1's step waits on the host: 404 ms eager, 197 graphed)
        t = dit.transformer
        step = graphed_dit_step(t, t.device) if isinstance(t, LTX25) else None
        net = packed_model(t, [video.shape, audio.shape], fps, step=step, check=interrupt_check, **frames)
        return (lambda callback, should_stop: NestedTensor(sample_stage(
            net, video, audio, stage, positive, negative, mask, r.extra["eta"], r.extra["s_noise"], callback=callback,
            should_stop=should_stop))), \
            len(stage.sigmas) - 1


NODES = [LTX25Loader, LTX25TextEncoderLoader, LTX25TextEncode, LTX25Sampler, *CODEC_NODES, *FRAME_NODES]
