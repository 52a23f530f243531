"""MiniMax H3's VAE nodes (video and audio loaders and decodes), the AV latent (its parts, as the conditioning nodes
make it, with their canvas inputs and outputs, and the sampler and decodes read it) and the conditions the sampler
reads from the positive (keyframes, references); nodes/minimax_h3.py registers the nodes with the family's other
nodes."""
from __future__ import annotations

import comfy.model_management
import comfy.utils
import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.codecs.h3_audio_vae import LATENT_CHANNELS as AUDIO_CHANNELS  # 32
from ..dit_core.codecs.h3_audio_vae import AudioDecoder, AudioEncoder
from ..dit_core.codecs.h3_video_vae import LATENT_CHANNELS as VIDEO_CHANNELS  # 24
from ..dit_core.codecs.h3_video_vae import VideoDecoder, VideoEncoder
from ..dit_core.families.minimax_h3 import CANVAS_MULTIPLE, Reference
from ..dit_core.weights import Checkpoint, WeightsError
from .base import FileHandle, SwiftDiTError, cancellable, checked, decode_image, interrupt_check
from .family_nodes import VAELoaderNode
from .memory import on_device
from .types import Vae

CATEGORY = "SwiftDiT/MiniMax H3"
FAMILY = "minimax_h3"
FPS, AUDIO_LATENTS_PER_S = 24, 40  # the template's CreateVideo fps; the audio VAE's 32 kHz / hop 800


def video_length(node: str, length: int) -> int:
    """Pixel frames 17n + 5 (the video VAE's clips) -> latent frames 5n + 2; others refused, naming the nearest."""
    if length < 5 or length % 17 != 5:
        below, above = max(5, length - (length - 5) % 17), length + (5 - length % 17) % 17
        valid = f"{below} or {above}" if below < above and length > 5 else f"{max(5, above)}"
        raise SwiftDiTError(f"{node} · length: {length} frames is not 17n + 5 (the video VAE's clips of 17 frames, "
                            f"as the template's length expression snaps it); use {valid}")
    return (length - 5) // 17 * 5 + 2


def empty_av_latent(node: str, width: int, height: int, length: int) -> NestedTensor:
    """The empty AV latent of a width x height canvas and length frames at 24 fps: video zeros [1, 24, 5n + 2, H/16,
    W/16] and audio zeros [1, 32, 2, round(length / 24 x 40)] (diffusers' audio_latent_num_frames)."""
    for name, value in (("width", width), ("height", height)):
        if value < CANVAS_MULTIPLE or value % CANVAS_MULTIPLE:
            raise SwiftDiTError(f"{node} · {name}: {value} is not a multiple of 32 (16-pixel cells, 2x2 patches)")
    frames, audio = video_length(node, length), round(length / FPS * AUDIO_LATENTS_PER_S)
    where = comfy.model_management.intermediate_device()
    return NestedTensor([torch.zeros(1, VIDEO_CHANNELS, frames, height // 16, width // 16, device=where),
                         torch.zeros(1, AUDIO_CHANNELS, 2, audio, device=where)])


def empty_image_latent(node: str, samples: torch.Tensor) -> NestedTensor:
    """EmptyLatentImage's zeros [1, 4, H/8, W/8] as ComfyUI hands them to H3 (fix_empty_latent_channels, then
    MiniMaxH3AV.fix_empty_latent): one video frame of H/16 x W/16 cells (each side halved and rounded, as its
    nearest-exact rescale sizes it) and the audio of that frame (round(5/3) = 2 latents a channel)."""
    if samples.shape[0] != 1 or samples.any():
        raise SwiftDiTError(f"{node} · latent_image: an image latent {tuple(samples.shape)} that is not one empty "
                            f"image (EmptyLatentImage, batch 1); MiniMax H3 samples video from its Image To Video "
                            f"node and one image from an empty latent")
    h, w = round(samples.shape[-2] * 0.5), round(samples.shape[-1] * 0.5)
    return NestedTensor([samples.new_zeros(1, VIDEO_CHANNELS, 1, h, w), samples.new_zeros(1, AUDIO_CHANNELS, 2, 2)])


def canvas_inputs(width: int, height: int) -> list:
    """The prompt and the canvas (width x height, length frames at 24 fps) of the conditioning nodes."""
    side = "The video's {} in pixels, a multiple of 32"
    return [io.String.Input("prompt", multiline=True, dynamic_prompts=True, tooltip="The prompt"),
            io.Int.Input("width", default=width, min=32, max=4096, step=32, tooltip=side.format("width")),
            io.Int.Input("height", default=height, min=32, max=4096, step=32, tooltip=side.format("height")),
            io.Int.Input("length", default=124, min=5, max=1024,
                         tooltip="Pixel frames at 24 fps, of the form 17n + 5 (124: about 5 s)")]


CONDITIONING_OUTPUTS = [io.Conditioning.Output(tooltip="The prompt's text rows (and its conditions), for the "
                                                       "sampler's positive"),
                        io.Latent.Output(tooltip="The empty AV latent: video [1, 24, 5n + 2, H/16, W/16] and audio "
                                                 "[1, 32, 2, 40 per second] parts, for the sampler")]


def keyframes_of(node: str, conditioning: list, length: int) -> tuple[tuple[str, torch.Tensor], ...]:
    """The positive's keyframes (Image To Video's `minimax_keyframes`) as the engine's ("first" | "last", latent)."""
    found = []
    for kf in conditioning[0][1].get("minimax_keyframes", ()) if conditioning else ():
        index = kf["resolved_frame_index"]
        if index not in (0, length - 1):
            raise SwiftDiTError(f"{node} · positive: a keyframe at frame {index}; SwiftDiT runs first (0) and last "
                                f"({length - 1}) frames only, as MiniMax H3 Image To Video makes them")
        found.append(("first" if index == 0 else "last", kf["latent"]))
    return tuple(found)


def references_of(node: str, conditioning: list) -> tuple[Reference, ...]:
    """The positive's ref2va blocks (Reference To Video's `minimax_refs`, ComfyUI's dicts) as the engine's."""
    kinds = {"image": "image", "video": "video", "video_audio": "video", "audio": "audio"}
    blocks = conditioning[0][1].get("minimax_refs", ()) if conditioning else ()
    with checked(node, "positive"):
        return tuple(Reference(kinds.get(b["kind"], b["kind"]), b.get("latent"), b.get("audio_latent"))
                     for b in blocks)


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


def vae_loader(coder, what: str, config: str, gpu_dtype: torch.dtype | None, part: str = ""):
    """A VAE loader's load(handle): the decoder (or encoder) in LOADED's ("vae", handle.role + part) slot, f32 on
    the CPU (gpu_dtype None: a coder that keeps its own f32 everywhere)."""
    def place(vae, where):
        return vae.to(where) if gpu_dtype is None else vae.to(where, gpu_dtype if where.type == "cuda" else
                                                                torch.float32)

    def load(handle: FileHandle):
        read = lambda ckpt: read_vae(coder.load, ckpt, what, config)  # noqa: E731
        return on_device("vae", handle, lambda: cancellable(read, handle.path), FAMILY, role=handle.role + part,
                         place=place)
    return load


load_video_vae = vae_loader(VideoDecoder, "video VAE", "vae", torch.bfloat16)
load_video_encoder = vae_loader(VideoEncoder, "video VAE", "vae", torch.float32, " encoder")  # f32, as diffusers'
load_audio_vae = vae_loader(AudioDecoder, "audio VAE", "audio_vae", torch.float32)  # BigVGAN degrades in bf16
load_audio_encoder = vae_loader(AudioEncoder, "audio VAE", "audio_vae", None, " encoder")  # f32, as diffusers'


def vae_for(node: str, name: str, vae, role: str):
    """The VAE handle wired to `name` when it is the `role` one (None: none wired)."""
    if vae is not None and vae.role != role:
        raise SwiftDiTError(f"{node} · {name}: a MiniMax H3 {vae.role} VAE where the {role} VAE goes")
    return vae


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
