"""MiniMax H3's VAE nodes (video and audio loaders and decodes) and the AV latent's parts they and the sampler
read; nodes/minimax_h3.py registers them with the family's other nodes."""
from __future__ import annotations

import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.codecs.h3_audio_vae import AudioDecoder
from ..dit_core.codecs.h3_video_vae import VideoDecoder, VideoEncoder
from ..dit_core.weights import Checkpoint, WeightsError
from .base import FileHandle, SwiftDiTError, cancellable, checked, decode_image, interrupt_check
from .family_nodes import VAELoaderNode
from .memory import on_device
from .types import Vae

CATEGORY = "SwiftDiT/MiniMax H3"
FAMILY = "minimax_h3"


def av_parts(node: str, name: str, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """(video [1, C, F, LH, LW], audio [1, C_a, 2, Na]) of an H3 AV latent (comfy.nested_tensor.NestedTensor)."""
    parts = getattr(samples, "tensors", None)
    if not isinstance(samples, NestedTensor) or [t.dim() for t in parts] != [5, 4] or parts[1].shape[2] != 2 or \
            parts[0].shape[0] != 1 or parts[1].shape[0] != 1:
        got = [tuple(t.shape) for t in parts] if parts else tuple(getattr(samples, "shape", ()))
        raise SwiftDiTError(f"{node} · {name}: not MiniMax H3's AV latent (video [1, C, F, H/16, W/16] and audio "
                            f"[1, C, 2, Na], got {got}); make it with the H3 Image To Video node or EmptyLatentImage")
    return parts[0], parts[1]


def video_part(node: str, name: str, samples) -> torch.Tensor:
    """The video [1, C, F, LH, LW] of an AV latent, or the video latent itself (LTXVSeparateAVLatent's output)."""
    if isinstance(samples, torch.Tensor) and samples.dim() == 5:
        return samples
    return av_parts(node, name, samples)[0]


def read_vae(reader, ckpt: Checkpoint, what: str, config: str):
    """reader(ckpt); a file without latents_mean/std is refused before any weight is read (docs/nodes.md, H3)."""
    if not all(any(k.endswith(s) for k in ckpt.keys()) for s in ("latents_mean", "latents_std")):  # noqa: SIM118
        raise WeightsError(f"{ckpt.path.name}: no latents_mean/latents_std tensors; the {what} de-normalizes H3's "
                           f"latents with them (MiniMaxAI/MiniMax-H3's {config}/config.json), and SwiftDiT does not "
                           f"guess them; use a file that holds them")
    return reader(ckpt)


def vae_loader(coder, what: str, config: str, gpu_dtype: torch.dtype, part: str = ""):
    """A VAE loader's load(handle): the decoder (or encoder) in LOADED's ("vae", handle.role + part) slot, f32 on
    the CPU."""
    def load(handle: FileHandle):
        read = lambda ckpt: read_vae(coder.load, ckpt, what, config)  # noqa: E731
        return on_device("vae", handle, lambda: cancellable(read, handle.path), FAMILY, role=handle.role + part,
                         place=lambda vae, where: vae.to(where, gpu_dtype if where.type == "cuda" else torch.float32))
    return load


load_video_vae = vae_loader(VideoDecoder, "video VAE", "vae", torch.bfloat16)
load_video_encoder = vae_loader(VideoEncoder, "video VAE", "vae", torch.float32, " encoder")  # f32, as diffusers'
load_audio_vae = vae_loader(AudioDecoder, "audio VAE", "audio_vae", torch.float32)  # BigVGAN degrades in bf16


class MiniMaxH3VAELoader(VAELoaderNode):
    TITLE, ROLE = "MiniMax H3 video", "video"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTMiniMaxH3VAELoader", "MiniMax H3 VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads H3's video VAE decoder (INT8 ConvRot or fp16), kept loaded beside the audio VAE."
    load = staticmethod(load_video_vae)


class MiniMaxH3AudioVAELoader(VAELoaderNode):
    TITLE, ROLE = "MiniMax H3 audio", "audio"
    NODE_ID, DISPLAY, CATEGORY = "SwiftDiTMiniMaxH3AudioVAELoader", "MiniMax H3 Audio VAE Loader (SwiftDiT)", CATEGORY
    DESCRIPTION = "Loads H3's audio VAE decoder (minimax_h3_audio_vae_fp32), kept beside the video VAE."
    load = staticmethod(load_audio_vae)


class DecodeNode(io.ComfyNode):  # VAEDecode's / VAEDecodeAudio's inputs: one part of the AV latent, the ROLE VAE
    NODE_ID = DISPLAY = DESCRIPTION = ROLE = LOADER = ""
    OUTPUT: io.Output

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=CATEGORY, description=cls.DESCRIPTION,
            inputs=[io.Latent.Input("samples", tooltip="The AV latent from the MiniMax H3 KSampler"),
                    Vae.Input("vae", tooltip=f"The MiniMax H3 {cls.ROLE} VAE, from the {cls.LOADER}")],
            outputs=[cls.OUTPUT])

    @classmethod
    def execute(cls, samples, vae) -> io.NodeOutput:
        if vae.role != cls.ROLE:
            raise SwiftDiTError(f"{cls.NODE_ID} · vae: a MiniMax H3 {vae.role} VAE; connect the {cls.LOADER}")
        return io.NodeOutput(cls.decode(samples["samples"], vae))


class MiniMaxH3VAEDecode(DecodeNode):
    NODE_ID, DISPLAY, ROLE, LOADER = ("SwiftDiTMiniMaxH3VAEDecode", "MiniMax H3 VAE Decode (SwiftDiT)", "video",
                                      "MiniMax H3 VAE Loader")
    DESCRIPTION = "Decodes the video part of H3's AV latent to IMAGE frames (clips and tiles as diffusers)."
    OUTPUT = io.Image.Output(tooltip="The video's frames, for CreateVideo")

    @classmethod
    def decode(cls, samples, vae):
        video = video_part(cls.NODE_ID, "samples", samples)
        return decode_image(cls.NODE_ID, load_video_vae(vae), {"samples": video})


class MiniMaxH3VAEDecodeAudio(DecodeNode):
    NODE_ID, DISPLAY, ROLE, LOADER = ("SwiftDiTMiniMaxH3VAEDecodeAudio", "MiniMax H3 VAE Decode Audio (SwiftDiT)",
                                      "audio", "MiniMax H3 Audio VAE Loader")
    DESCRIPTION = "Decodes the audio part of H3's AV latent to stereo AUDIO at 32 kHz."
    OUTPUT = io.Audio.Output(tooltip="The clip's sound, for CreateVideo")

    @classmethod
    def decode(cls, samples, vae):
        audio = av_parts(cls.NODE_ID, "samples", samples)[1]  # [B, C, 2, Na] -> the decoder's [B, 2, C, Na]
        decoder = load_audio_vae(vae)
        with checked(cls.NODE_ID, "samples"):
            return decoder.audio(decoder.raw_latents(audio.permute(0, 2, 1, 3).float()), interrupt_check)
