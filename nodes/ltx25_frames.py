"""LTX-2.5's frames given as images (issue 36), as the video_ltx2_5_i2v and _flf2v templates use them: Img To Video
Inplace (the first frame under a noise mask), Add Guide (guide frames appended; their positions and strengths in the
conditioning as newer ComfyUI's keyframe_idxs and guide_attention_entries), Crop Guides, and what the sampler reads
of them (sampler_frames). The latents stay ComfyUI's LATENT dicts with the noise_mask where ComfyUI puts one.
Also the family's constants, host-model slot and VAE role check, which nodes/ltx25.py imports from here with the
nodes it registers."""
from __future__ import annotations

import functools

import comfy.utils
import node_helpers
import torch
from comfy.nested_tensor import NestedTensor
from comfy_api.latest import io

from ..dit_core.codecs.ltx2_video_vae import SPACE_FACTOR, TIME_FACTOR, VideoEncoder
from ..dit_core.families.ltx25_positions import Guide
from ..dit_core.sampling.ltx25 import add_guide, crop_guides, guide_frame, image_to_video
from .base import FileHandle, SwiftDiTError, cancellable, checked, interrupt_check
from .memory import LOADED, MAIN, on_device_as
from .types import Vae

CATEGORY = "SwiftDiT/LTX-2.5"
FAMILY = "ltx25"
HOST = torch.device("cpu")


def host_model(kind: str, handle, read, role: str = MAIN):
    """LOADED's model in slot (kind, role) for handle: read(the file as a Checkpoint, Cancel honoured), f32 on the
    host."""
    return LOADED.get(kind, (*handle.key(), str(HOST), FAMILY), lambda: cancellable(read, handle.path), HOST, role)


def device_model(kind: str, handle, read, role: str = MAIN, gpu_dtype: torch.dtype = torch.float32):
    """LOADED's model in slot (kind, role) for handle, read as host_model's, on ComfyUI's device: in gpu_dtype on a
    GPU, f32 on the CPU."""
    return on_device_as(kind, handle, lambda: cancellable(read, handle.path), gpu_dtype, FAMILY, role)


def vae_role(node: str, name: str, vae: FileHandle, role: str) -> None:
    if getattr(vae, "role", None) != role:
        loader = {"video": "LTX-2.5 VAE Loader", "audio": "LTX-2.5 Audio VAE Loader"}[role]
        raise SwiftDiTError(f"{node} · {name}: not the LTX-2.5 {role} VAE; connect the {loader}")


load_video_encoder = functools.partial(device_model, "vae", read=VideoEncoder.load, role="video encoder")
VAE_TOOLTIP = "The LTX-2.5 video VAE, from its VAE Loader (its encoder encodes the image)"


def video_latent(node: str, name: str, latent: dict) -> torch.Tensor:
    """The video latent [B, C, F, H, W] of a LATENT; an AV latent is refused (ComfyUI's nodes refuse it too)."""
    samples = latent["samples"]
    if isinstance(samples, NestedTensor) or samples.dim() != 5:
        raise SwiftDiTError(f"{node} · {name}: not a video latent [B, C, F, H, W]; connect EmptyLTXVLatentVideo (or "
                            f"the upsampler), before LTXVConcatAVLatent")
    return samples


def encoded(node: str, vae, image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The image frames at the latent's pixel size (ComfyUI's common_upscale, bilinear, center crop, where the size
    differs), their first three channels, encoded by the video VAE: [1, C, (frames - 1) / 8 + 1, height, width]."""
    vae_role(node, "vae", vae, "video")
    size = (height * SPACE_FACTOR, width * SPACE_FACTOR)
    if tuple(image.shape[1:3]) != size:
        image = comfy.utils.common_upscale(image.movedim(-1, 1), size[1], size[0], "bilinear", "center").movedim(1, -1)
    with checked(node, "vae"):
        encoder = load_video_encoder(vae)
    with checked(node, "image"):
        return encoder.encode(image[..., :3], interrupt_check).to(image.device)


class LTX25ImgToVideoInplace(io.ComfyNode):  # LTXVImgToVideoInplace's inputs and output
    NODE_ID = "SwiftDiTLTX25ImgToVideoInplace"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Img To Video Inplace (SwiftDiT)", category=CATEGORY,
            description="The image, encoded by the video VAE, as the video latent's first frame, under a noise mask "
                        "of 1 - strength there (LTXVImgToVideoInplace): image to video.",
            inputs=[Vae.Input("vae", tooltip=VAE_TOOLTIP),
                    io.Image.Input("image", tooltip="The first frame (1 + 8k frames: their latent frames), resized to "
                                                    "the latent's size"),
                    io.Latent.Input("latent", tooltip="The video latent, from EmptyLTXVLatentVideo or the upsampler"),
                    io.Float.Input("strength", default=1.0, min=0.0, max=1.0,
                                   tooltip="How firmly the frame is kept: 1 kept whole, less lets the sampler move it "
                                           "(the template: 0.7 at stage 1, 1 at stage 2)"),
                    io.Boolean.Input("bypass", default=False, tooltip="Pass the latent on unchanged (text to video)")],
            outputs=[io.Latent.Output(display_name="latent", tooltip="The video latent with its noise mask, for "
                                                                     "LTXVConcatAVLatent")])

    @classmethod
    def execute(cls, vae, image, latent, strength, bypass=False) -> io.NodeOutput:
        if bypass:
            return io.NodeOutput(latent)
        node = cls.NODE_ID
        samples = video_latent(node, "latent", latent)
        frames = encoded(node, vae, image, *samples.shape[3:])
        if frames.shape[2] > samples.shape[2]:
            raise SwiftDiTError(f"{node} · image: {image.shape[0]} frames make {frames.shape[2]} latent frames, more "
                                f"than the latent's {samples.shape[2]}")
        video, mask = image_to_video(samples, latent.get("noise_mask"), frames, strength)
        return io.NodeOutput({"samples": video, "noise_mask": mask})


def guides_of(conditioning: list, height: int, width: int) -> tuple[Guide, ...]:
    """The Guides that keyframe_idxs [B, 3, rows, 2] (pixel [start, end) per axis) and guide_attention_entries of a
    CONDITIONING describe, a latent frame of height x width cells each (strength 1 without entries); ValueError where
    they do not fit the latent."""
    extra = conditioning[0][1]
    coords = extra.get("keyframe_idxs")
    if coords is None or coords.shape[2] == 0:
        return ()
    cells = height * width
    if coords.shape[2] % cells:
        raise ValueError(f"its guides hold {coords.shape[2]} rows, not whole frames of this latent's {height} x "
                         f"{width} cells; crop the guides (LTX-2.5 Crop Guides) before changing the latent's size")
    frames = coords[0].reshape(3, -1, cells, 2)
    if not torch.equal(frames[1:], guide_cells(frames.shape[1], height, width)[0, 1:].reshape(2, -1, cells, 2)):
        raise ValueError("its guides' cells are not the latent's (a guide of another size, e.g. an IC-LoRA's "
                         "reference, is not supported)")
    strengths = [e["strength"] for e in extra.get("guide_attention_entries") or ()
                 for _ in range(e["pre_filter_count"] // cells)] or [1.0] * frames.shape[1]
    if len(strengths) != frames.shape[1]:
        raise ValueError(f"its guide_attention_entries cover {len(strengths)} guide frames, its keyframe_idxs "
                         f"{frames.shape[1]}")
    return tuple(Guide(int(start), int(end), float(s)) for (start, end), s in zip(frames[0, :, 0].tolist(), strengths))


def guide_cells(frames: int, height: int, width: int) -> torch.Tensor:
    """keyframe_idxs of `frames` guide frames at time 0: [1, 3, frames x height x width, 2], each row's pixel
    [start, end) in time (0, 0), y and x (32-pixel cells), frame-major (the LTX patchifier's order)."""
    f, y, x = torch.meshgrid(torch.zeros(frames, dtype=torch.long), torch.arange(height), torch.arange(width),
                             indexing="ij")
    start = torch.stack([f, y * SPACE_FACTOR, x * SPACE_FACTOR]).flatten(1)
    return torch.stack([start, start + torch.tensor([0, SPACE_FACTOR, SPACE_FACTOR])[:, None]], dim=-1)[None]


def keyframe_idxs(guides: tuple[Guide, ...], height: int, width: int) -> torch.Tensor:
    """ComfyUI's keyframe_idxs of guides: their cells' pixel coordinates with each guide's time span."""
    coords = guide_cells(len(guides), height, width)
    spans = torch.tensor([[g.start, g.end] for g in guides], dtype=torch.long).repeat_interleave(height * width, 0)
    coords[0, 0] = spans
    return coords


class LTX25AddGuide(io.ComfyNode):  # LTXVAddGuide's inputs (not its optional attention_mask, iclora_parameters)
    NODE_ID = "SwiftDiTLTX25AddGuide"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Add Guide (SwiftDiT)", category=CATEGORY,
            description="The image, encoded by the video VAE, appended to the video latent as a guide frame at "
                        "frame_idx (LTXVAddGuide): first and last frame. Its place and strength go with the "
                        "conditioning; crop the guides after sampling.",
            inputs=[io.Conditioning.Input("positive", tooltip="The positive prompt (LTXVConditioning's)"),
                    io.Conditioning.Input("negative", tooltip="The negative prompt (LTXVConditioning's)"),
                    Vae.Input("vae", tooltip=VAE_TOOLTIP),
                    io.Latent.Input("latent", tooltip="The video latent, from EmptyLTXVLatentVideo or a guide"),
                    io.Image.Input("image", tooltip="The frame (or 8n + 1 frames; more are cut to that), resized to "
                                                    "the latent's size"),
                    io.Int.Input("frame_idx", default=0, min=-9999, max=9999,
                                 tooltip="The video frame it stands at; negative counts from the end (-1: the last)"),
                    io.Float.Input("strength", default=1.0, min=0.0, max=10.0, step=0.01,
                                   tooltip="How firmly the frame is kept (the template: 0.7)")],
            outputs=[io.Conditioning.Output(display_name="positive", tooltip="The positive with the guide's place"),
                     io.Conditioning.Output(display_name="negative", tooltip="The negative with the guide's place"),
                     io.Latent.Output(display_name="latent", tooltip="The video latent with the guide frames, for "
                                                                     "LTXVConcatAVLatent")])

    @classmethod
    def execute(cls, positive, negative, vae, latent, image, frame_idx, strength) -> io.NodeOutput:
        node = cls.NODE_ID
        samples = video_latent(node, "latent", latent)
        height, width = samples.shape[3:]
        with checked(node, "positive"):
            guides = guides_of(positive, height, width)
        frames = samples.shape[2] - len(guides)
        kept = (image.shape[0] - 1) // TIME_FACTOR * TIME_FACTOR + 1
        resolved = frame_idx if frame_idx >= 0 else max((frames - 1) * TIME_FACTOR + 1 + frame_idx, 0)
        # a clip placed mid-video: a copy of its first frame goes first and its latent is dropped (ComfyUI's), so
        # that the causal VAE's one-pixel-frame latent falls on the copy
        causal = resolved == 0 or kept == 1
        pixels = image if causal else torch.cat([image[:1], image])
        pixels = pixels[:(pixels.shape[0] - 1) // TIME_FACTOR * TIME_FACTOR + 1]
        guide = encoded(node, vae, pixels, height, width)
        if not causal:
            guide, pixels = guide[:, :, 1:], pixels[1:]
        frame, latent_frame = guide_frame(frame_idx, frames, pixels.shape[0])
        if latent_frame + guide.shape[2] > samples.shape[2]:
            raise SwiftDiTError(f"{node} · frame_idx: the guide's {guide.shape[2]} latent frames at frame {frame} run "
                                f"past the latent's {frames} frames")
        video, mask, guides = add_guide(samples, latent.get("noise_mask"), guides, guide, frame, strength, causal)
        entry = {"pre_filter_count": guide[0, 0].numel(), "strength": strength, "pixel_mask": None,
                 "latent_shape": list(guide.shape[2:])}
        values = {"keyframe_idxs": keyframe_idxs(guides, height, width)}
        conditionings = [node_helpers.conditioning_set_values(c, {
            **values, "guide_attention_entries": [*(c[0][1].get("guide_attention_entries") or ()), entry]})
            for c in (positive, negative)]
        return io.NodeOutput(*conditionings, {"samples": video, "noise_mask": mask})


class LTX25CropGuides(io.ComfyNode):  # LTXVCropGuides' inputs and outputs
    NODE_ID = "SwiftDiTLTX25CropGuides"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name="LTX-2.5 Crop Guides (SwiftDiT)", category=CATEGORY,
            description="The sampled video latent without its guide frames, and the conditioning without their "
                        "places (LTXVCropGuides; v0.3.75's stock node counts newer guides' frames wrongly).",
            inputs=[io.Conditioning.Input("positive", tooltip="The positive the guides were added to"),
                    io.Conditioning.Input("negative", tooltip="The negative the guides were added to"),
                    io.Latent.Input("latent", tooltip="The sampled video latent, from LTXVSeparateAVLatent")],
            outputs=[io.Conditioning.Output(display_name="positive", tooltip="The positive without guides"),
                     io.Conditioning.Output(display_name="negative", tooltip="The negative without guides"),
                     io.Latent.Output(display_name="latent", tooltip="The video latent, for the decode")])

    @classmethod
    def execute(cls, positive, negative, latent) -> io.NodeOutput:
        node = cls.NODE_ID
        samples = video_latent(node, "latent", latent)
        with checked(node, "positive"):
            guides = guides_of(positive, *samples.shape[3:])
        video, mask = crop_guides(samples.clone(), latent.get("noise_mask"), guides)
        if guides:
            cleared = {"keyframe_idxs": None, "guide_attention_entries": None}
            positive, negative = (node_helpers.conditioning_set_values(c, cleared) for c in (positive, negative))
        return io.NodeOutput(positive, negative, {"samples": video, "noise_mask": mask})


def sampler_frames(node: str, latent_image: dict, positive: list, video: torch.Tensor,
                   audio: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, dict]:
    """(sample_stage's denoise_mask, packed_model's video_mask and guides): the noise mask of an AV latent
    (LTXVConcatAVLatent's NestedTensor of the parts' masks, or the video's alone: the audio's ones), each part's
    reshaped to its latent's shape as ComfyUI's sampler does (comfy.utils.reshape_mask; None: no mask), and the
    positive's guides on the video's last frames."""
    with checked(node, "positive"):
        guides = guides_of(positive, *video.shape[3:])
    if len(guides) >= video.shape[2]:
        raise SwiftDiTError(f"{node} · latent_image: {len(guides)} guide frames and {video.shape[2]} latent frames; "
                            f"add the guides to this latent (LTX-2.5 Add Guide) before LTXVConcatAVLatent")
    mask = latent_image.get("noise_mask")
    if mask is None:
        return None, {"guides": guides}
    masks = mask.unbind() if isinstance(mask, NestedTensor) else (mask, torch.ones_like(audio))
    if [m.dim() for m in masks] != [5, 4] or masks[0].shape[2] != video.shape[2]:
        raise SwiftDiTError(f"{node} · latent_image: a noise mask of {[tuple(m.shape) for m in masks]} does not fit "
                            f"the latent's {video.shape[2]} video frames; make it with the LTX-2.5 frame nodes")
    video_mask, audio_mask = (comfy.utils.reshape_mask(m.float(), s.shape) for m, s in zip(masks, (video, audio)))
    return (video_mask, audio_mask), {"video_mask": video_mask[0, 0], "guides": guides}


FRAME_NODES = [LTX25ImgToVideoInplace, LTX25AddGuide, LTX25CropGuides]
