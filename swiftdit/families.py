"""The swap tool's rules, built from the one family table (dit_core/families/__init__.py, FAMILIES): the stock
nodes' sockets and widgets are the same for every family and are written once here; a family's row says which of
them ours replace, its CLIPLoader types and the sampler values ours runs (docs/nodes.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from dit_core.families import FAMILIES as TABLE


@dataclass(frozen=True)
class Role:
    """One stock node and ours that replaces it: same widgets in the same order, then `extra_widgets`."""
    ours: str
    sockets: tuple[tuple[str, str], ...] = ()  # the stock node's linked inputs: (name, stock wire type)
    outputs: tuple[str, ...] = ()              # stock output types, in order
    widgets: tuple[str, ...] = ()              # stock widget names in UI order (rules read them by name)
    extra_widgets: tuple[tuple[str, object], ...] = ()  # ours only, appended after the stock widgets
    accepts: tuple[tuple[str, tuple], ...] = ()  # widget values ours runs; other values leave the node stock
    renames: tuple[tuple[str, str], ...] = ()  # stock input name -> ours where they differ (autogrow groups)
    lacks: tuple[str, ...] = ()  # prefixes of stock input names ours has not: unwired ones go (wired: not_yet)


@dataclass(frozen=True)
class Stock:
    """A stock node as every family's swap sees it; `role` names ours: the family's node prefix + role, or
    "SwiftDiT" + role for a node of no family (`shared`)."""
    role: str
    sockets: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()
    widgets: tuple[str, ...] = ()
    extra_widgets: tuple[tuple[str, object], ...] = ()
    accepts: tuple[tuple[str, tuple], ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    lacks: tuple[str, ...] = ()
    shared: bool = False


MODEL_IN = (("model", "MODEL"),)
# our H3 Reference To Video's ref_image_0..8, ref_video_0..2 (and ref_video_audio_0..2) and ref_audio_0..2
H3_REFERENCE_IMAGES, H3_REFERENCE_VIDEOS, H3_REFERENCE_AUDIOS = 9, 3, 3
# The stock nodes ours replace (reference/templates.md section 5), with ComfyUI's input names and widget order.
# Every DiT loader of ours appends `linears` and `gpu_budget_gb` (0: automatic), then its family's loader_extra;
# every text encoder loader runs on the host or the default device only.
STOCK = MappingProxyType({
    "UNETLoader": Stock("Loader", outputs=("MODEL",), widgets=("unet_name", "weight_dtype"),
                        extra_widgets=(("linears", "as stored"), ("gpu_budget_gb", 0))),
    "ModelSamplingAuraFlow": Stock("ModelSamplingAuraFlow", MODEL_IN, ("MODEL",), ("shift",)),
    "ModelSamplingFlux": Stock("ModelSamplingFlux", MODEL_IN, ("MODEL",),
                               ("max_shift", "base_shift", "width", "height")),
    "LoraLoaderModelOnly": Stock("LoraLoaderModelOnly", MODEL_IN, ("MODEL",), ("lora_name", "strength_model")),
    "MiniMaxH3SigmaShift": Stock("SigmaShift", MODEL_IN, ("MODEL",), ("shift_video", "shift_audio")),
    "CLIPLoader": Stock("TextEncoderLoader", outputs=("CLIP",), widgets=("clip_name", "type", "device"),
                        accepts=(("device", ("default", "cpu")),)),
    "CLIPTextEncode": Stock("TextEncode", (("clip", "CLIP"),), ("CONDITIONING",), ("text",)),
    # Krea 2's style reference: the prompt and pictures on our text encoder, the stock VAE encoding the references
    "TextEncodeQwenImageEditPlus": Stock("TextEncodeQwenImageEditPlus",
                                         (("clip", "CLIP"), ("vae", "VAE"), ("image1", "IMAGE"), ("image2", "IMAGE"),
                                          ("image3", "IMAGE")), ("CONDITIONING",), ("prompt",)),
    "KSampler": Stock("Sampler", (("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                                  ("latent_image", "LATENT")), ("LATENT",),
                      ("seed", "control_after_generate", "steps", "cfg", "sampler_name", "scheduler", "denoise")),
    "VAELoader": Stock("VAELoader", outputs=("VAE",), widgets=("vae_name",)),
    "VAEDecode": Stock("VAEDecode", (("samples", "LATENT"), ("vae", "VAE")), ("IMAGE",)),
    "VAEEncode": Stock("VAEEncode", (("pixels", "IMAGE"), ("vae", "VAE")), ("LATENT",)),
    # MiniMax H3: the audio decode reads the audio VAE, so the VAELoader that feeds it becomes the family's
    # AudioVAELoader (Family.audio_vae_loader)
    "MiniMaxH3ImageToVideo": Stock("ImageToVideo", (("clip", "CLIP"), ("vae", "VAE"), ("first_frame", "IMAGE"),
                                                    ("last_frame", "IMAGE")), ("CONDITIONING", "LATENT"),
                                   ("prompt", "width", "height", "length")),
    # MiniMax H3's r2v: the stock node's autogrow inputs ("ref_images.ref_image_0") are plain inputs on ours
    # ("ref_image_0"; nodes/minimax_h3_references.py); more than ours takes: the row's not_yet
    "MiniMaxH3ReferenceToVideo": Stock(
        "ReferenceToVideo", (("clip", "CLIP"), ("vae", "VAE"), ("audio_vae", "VAE"),
                             *((f"ref_images.ref_image_{i}", "IMAGE") for i in range(H3_REFERENCE_IMAGES)),
                             *((f"ref_videos.ref_video_{i}", "IMAGE") for i in range(H3_REFERENCE_VIDEOS)),
                             *((f"ref_video_audios.ref_video_audio_{i}", "AUDIO") for i in range(H3_REFERENCE_VIDEOS)),
                             *((f"ref_audios.ref_audio_{i}", "AUDIO") for i in range(H3_REFERENCE_AUDIOS))),
        ("CONDITIONING", "LATENT"), ("prompt", "width", "height", "length", "ref_image_size"),
        renames=(*((f"ref_images.ref_image_{i}", f"ref_image_{i}") for i in range(H3_REFERENCE_IMAGES)),
                 *((f"ref_videos.ref_video_{i}", f"ref_video_{i}") for i in range(H3_REFERENCE_VIDEOS)),
                 *((f"ref_video_audios.ref_video_audio_{i}", f"ref_video_audio_{i}")
                   for i in range(H3_REFERENCE_VIDEOS)),
                 *((f"ref_audios.ref_audio_{i}", f"ref_audio_{i}") for i in range(H3_REFERENCE_AUDIOS))),
        lacks=("ref_images.", "ref_audios.", "ref_videos.", "ref_video_audios.")),
    # any family's images: the stock node's files on every core (nodes/save_image.py); newer ComfyUI's passes them on
    "SaveImage": Stock("SaveImage", (("images", "IMAGE"),), ("IMAGE",), ("filename_prefix",), shared=True),
    "VAEDecodeAudio": Stock("VAEDecodeAudio", (("samples", "LATENT"), ("vae", "VAE")), ("AUDIO",)),
    # LTX-2.5 (reference/templates.md section 3, video_ltx2_5_t2v): the tiled video decode, the audio decode and
    # the empty audio latent read the audio VAE's loader, the upsampler reads the video VAE and the upscale model
    "VAEDecodeTiled": Stock("VAEDecodeTiled", (("samples", "LATENT"), ("vae", "VAE")), ("IMAGE",),
                            ("tile_size", "overlap", "temporal_size", "temporal_overlap")),
    "LTXVAudioVAEDecode": Stock("AudioVAEDecode", (("samples", "LATENT"), ("audio_vae", "VAE")), ("AUDIO",)),
    "LTXVEmptyLatentAudio": Stock("EmptyLatentAudio", (("audio_vae", "VAE"),), ("LATENT",),
                                  ("frames_number", "frame_rate", "batch_size")),
    "LTXVLatentUpsampler": Stock("LatentUpsampler", (("samples", "LATENT"),
                                                     ("upscale_model", "LATENT_UPSCALE_MODEL"), ("vae", "VAE")),
                                 ("LATENT",)),
    "LatentUpscaleModelLoader": Stock("LatentUpscaleModelLoader", outputs=("LATENT_UPSCALE_MODEL",),
                                      widgets=("model_name",)),
    # LTX-2.5's i2v and flf2v (nodes/ltx25_frames.py): the frames encoded by the video VAE's loader; Add Guide's
    # attention mask and IC-LoRA inputs are not ours (unwired they go; wired: the row's not_yet)
    "LTXVImgToVideoInplace": Stock("ImgToVideoInplace", (("vae", "VAE"), ("image", "IMAGE"), ("latent", "LATENT")),
                                   ("LATENT",), ("strength", "bypass")),
    "LTXVAddGuide": Stock("AddGuide", (("positive", "CONDITIONING"), ("negative", "CONDITIONING"), ("vae", "VAE"),
                                       ("latent", "LATENT"), ("image", "IMAGE")),
                          ("CONDITIONING", "CONDITIONING", "LATENT"), ("frame_idx", "strength"),
                          lacks=("attention_mask", "iclora_parameters")),
    "LTXVCropGuides": Stock("CropGuides", (("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                                           ("latent", "LATENT")), ("CONDITIONING", "CONDITIONING", "LATENT")),
})
# Nodes that put frames into a sampler's latent and conditioning (upstream of it), and those that take guide frames
# off its result (downstream)
FRAME_ENCODERS = ("LTXVImgToVideoInplace", "LTXVAddGuide")
GUIDE_CROPPERS = ("LTXVCropGuides",)
AUDIO_DECODERS = ("VAEDecodeAudio", "LTXVAudioVAEDecode")  # their VAELoader becomes the family's audio VAE loader
# Other readers of the audio VAE: ours when that loader is, and they never make it a video VAE's.
AUDIO_VAE_READERS = (*AUDIO_DECODERS, "LTXVEmptyLatentAudio")
AUDIO_VAE_INPUTS = {"MiniMaxH3ReferenceToVideo": ("audio_vae",)}  # inputs of other nodes that read the audio VAE
VIDEO_DECODERS = ("VAEDecode", "VAEDecodeTiled")
# Nodes that read a sampler's latent and hand a latent on to the next stage, and the loader of their model file
UPSAMPLERS = MappingProxyType({"LTXVLatentUpsampler": ("upscale_model", "LatentUpscaleModelLoader")})
# MODEL -> MODEL nodes
MODEL_PATCHES = ("ModelSamplingAuraFlow", "ModelSamplingFlux", "MiniMaxH3SigmaShift", "LoraLoaderModelOnly")
# Stock nodes that pass any wire type on unchanged (ComfyUI's MatchType), and their inputs that do: ours flow
# through those a family's row names in `switches`.
PASS_THROUGH = MappingProxyType({"ComfySwitchNode": ("on_false", "on_true")})
# Stock nodes that need ComfyUI's own CLIP (its .generate): a text encoder loader that feeds one of them and our
# text encodes too stays stock for them, and one of ours is added beside it for the encode path.
STOCK_CLIP_USERS = ("TextGenerate", "TextGenerateLTX2Prompt")
WIRE_TYPES = MappingProxyType({"MODEL": "SWIFTDIT_MODEL", "CLIP": "SWIFTDIT_TEXT_ENCODER", "VAE": "SWIFTDIT_VAE",
                               "LATENT_UPSCALE_MODEL": "SWIFTDIT_LATENT_UPSCALE_MODEL"})


@dataclass(frozen=True)
class Family:
    """How a family's graph is recognised (structure and widget values, never file names), and its roles."""
    name: str
    title: str
    roles: MappingProxyType                  # stock class_type -> Role
    wire_types: MappingProxyType             # stock wire type -> ours (only engine models change type)
    sampler: str                             # the anchor: a sampler conditioned by this family's encoders
    model_loader: str
    model_patches: tuple[str, ...]           # MODEL -> MODEL nodes allowed on the sampler's model path
    text_loader: str
    text_loader_types: tuple[str, ...]       # the loader's `type` widget values that mean this family
    text_encoders: tuple[str, ...]
    vae_loader: str | None                   # None: the family's latents decode with stock nodes (Krea 2)
    decoders: tuple[str, ...]
    savers: tuple[str, ...] = ()             # image savers: ours where their images come from its sampler
    # VAE encodes whose LATENT reaches a sampler's conditioning (reference images, e.g. through ReferenceLatent)
    vae_encoders: tuple[str, ...] = ()
    upsamplers: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # UPSAMPLERS it replaces
    frame_encoders: tuple[str, ...] = ()       # FRAME_ENCODERS it replaces: on a sampler's latent or conditioning
    guide_croppers: tuple[str, ...] = ()       # GUIDE_CROPPERS it replaces: on a sampler's result
    audio_latents: tuple[str, ...] = ()        # readers of the audio VAE that make an empty latent
    not_yet: tuple[tuple[str, str], ...] = ()  # stock nodes the swap cannot take yet, and why
    switches: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # pass-through -> inputs
    audio_vae_loader: str | None = None        # ours for a VAELoader that feeds an audio decode
    # SamplerCustomAdvanced groups (RandomNoise, BasicGuider or LTXVDualCFGGuider, KSamplerSelect, BasicScheduler or
    # ManualSigmas) spelled as a KSampler before the swap (swiftdit/custom_sampler.py), with the group's sampler and
    # scheduler ('manual' for ManualSigmas, whose text and the guider's audio_cfg go to our sampler's own widgets)
    custom_sampler: bool = False
    dropped: tuple[tuple[str, str], ...] = ()  # MODEL -> MODEL nodes removed before the swap: (type, why)
    ours_roles: MappingProxyType = field(init=False)  # our node id -> the stock class it replaces

    def __post_init__(self):
        named = (self.sampler, self.model_loader, self.text_loader, *self.model_patches, *self.text_encoders,
                 *self.decoders, *self.savers, *self.vae_encoders, *([self.vae_loader] if self.vae_loader else []),
                 *self.audio_latents, *self.upsamplers, *(loader for _, loader in self.upsamplers.values()),
                 *self.frame_encoders, *self.guide_croppers)
        for stock in named:
            if stock not in self.roles:
                raise ValueError(f"family {self.name}: {stock} is named in a rule but has no role")
        ours = {r.ours: stock for stock, r in self.roles.items()}
        if self.audio_vae_loader:
            ours[self.audio_vae_loader] = "VAELoader"
        object.__setattr__(self, "ours_roles", MappingProxyType(ours))

    def _role(self, class_type: str) -> tuple[Role | None, bool]:
        """The role of a stock node or of ours, and whether `class_type` is ours."""
        if class_type in self.roles:
            return self.roles[class_type], False
        stock = self.ours_roles.get(class_type)
        return (self.roles[stock], True) if stock else (None, False)

    def output_type(self, class_type: str, slot: int) -> str | None:
        """The wire type a known node (stock or ours) gives on `slot`; None for nodes the family lacks."""
        role, ours = self._role(class_type)
        if role is None or slot >= len(role.outputs):
            return None
        wire = role.outputs[slot]
        return self.wire_types.get(wire, wire) if ours else wire

    def socket_type(self, class_type: str, name: str) -> str | None:
        """The wire type a known node takes on input `name`; None when unknown."""
        role, ours = self._role(class_type)
        wire = dict(role.sockets).get(name) if role else None
        return self.wire_types.get(wire, wire) if ours and wire else wire

    def is_engine_wire(self, wire_type: str | None) -> bool:
        return wire_type in self.wire_types or wire_type in self.wire_types.values()



def rules(row) -> Family:
    """A family's swap rules from its row of the family table: our node for each stock node it replaces
    (row.node_prefix + the stock node's role), the sampler values ours runs and its own widgets."""
    roles = {}
    for stock in row.replaces:
        s = STOCK[stock]
        extra, accepts = s.extra_widgets, s.accepts
        if stock == "UNETLoader":
            extra = extra + tuple(row.loader_extra)
        if stock == "KSampler":
            extra = extra + tuple(row.sampler_extra)
            accepts = accepts + (("sampler_name", tuple(row.samplers)), ("scheduler", tuple(row.schedulers)))
        ours = ("SwiftDiT" if s.shared else row.node_prefix) + s.role
        roles[stock] = Role(ours, s.sockets, s.outputs, s.widgets, extra, accepts, s.renames, s.lacks)
    has = set(row.replaces)
    # the engine wires are those our nodes give: a stock VAE read by ours (Krea 2's style reference) stays stock
    wires = {t for r in roles.values() for t in r.outputs}
    return Family(
        name=row.name,
        title=row.title,
        roles=MappingProxyType(roles),
        wire_types=MappingProxyType({k: v for k, v in WIRE_TYPES.items() if k in wires}),  # those its roles carry
        sampler="KSampler",
        model_loader="UNETLoader",
        model_patches=tuple(p for p in MODEL_PATCHES if p in has),
        text_loader="CLIPLoader",
        text_loader_types=tuple(row.text_types),
        text_encoders=tuple(e for e in ("CLIPTextEncode", "TextEncodeQwenImageEditPlus", "MiniMaxH3ImageToVideo",
                                        "MiniMaxH3ReferenceToVideo") if e in has),
        vae_loader="VAELoader" if "VAELoader" in has else None,
        decoders=tuple(d for d in (*VIDEO_DECODERS, *AUDIO_DECODERS) if d in has),
        savers=tuple(s for s in ("SaveImage",) if s in has),
        vae_encoders=tuple(e for e in ("VAEEncode",) if e in has),
        upsamplers=MappingProxyType({u: v for u, v in UPSAMPLERS.items() if u in has}),
        frame_encoders=tuple(e for e in FRAME_ENCODERS if e in has),
        guide_croppers=tuple(c for c in GUIDE_CROPPERS if c in has),
        audio_latents=tuple(r for r in AUDIO_VAE_READERS if r in has and r not in AUDIO_DECODERS),
        not_yet=tuple(row.not_yet),
        switches=MappingProxyType({kind: PASS_THROUGH[kind] for kind in row.switches}),
        audio_vae_loader=row.node_prefix + "AudioVAELoader" if has & set(AUDIO_DECODERS) else None,
        custom_sampler=row.custom_sampler,
        dropped=tuple(row.dropped),
    )


FAMILIES = MappingProxyType({name: rules(row) for name, row in TABLE.items() if row.replaces})  # rows with templates
