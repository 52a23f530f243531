"""FAMILIES: the one family table, family name -> its row (the named-config table). The engine loads a family's
model through its row's recipe; the nodes' registry (nodes/__init__.py) imports `nodes.<name>` for every row; the
`swiftdit swap` tool builds each family's swap rules from the row's plain facts (swiftdit/families.py), so adding a
family here makes it known to all three. Plain data only: no node or ComfyUI imports here."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..sampling.ksampler import SAMPLERS
from ..sampling.ltx25 import STAGE_1_SIGMAS
from ..sampling.schedules import SCHEDULERS, TABLE_SCHEDULERS
from .flux3_klein import Flux3Klein
from .krea2 import Krea2
from .ltx25 import LTX25
from .minimax_h3 import MiniMaxH3
from .omnivoice import OmniVoice
from .z_image import ZImage

LTX25_GUIDE_EXTRAS = ("LTX-2.5's Add Guide with an attention mask or IC-LoRA parameters wired (LTXVAddGuide's "
                      "attention_mask / iclora_parameters) is not yet supported by SwiftDiT (issue 36): disconnect "
                      "them or keep the stock graph")

H3_MORE_VIDEOS = ("MiniMax H3's Reference To Video takes ref_video_0..2 (and their ref_video_audio_0..2) in SwiftDiT: "
                  "a graph wiring more reference videos is not swapped (issue 35)")
H3_MORE_IMAGES = ("MiniMax H3's Reference To Video takes ref_image_0..8 in SwiftDiT: a graph wiring more reference "
                  "images is not swapped (issue 35)")
H3_MORE_AUDIOS = ("MiniMax H3's Reference To Video takes ref_audio_0..2 in SwiftDiT: a graph wiring more reference "
                  "audios is not swapped (issue 35)")


@dataclass(frozen=True)
class Family:
    """One family: its recipe, and the facts about its official templates that the swap tool needs."""
    name: str                     # dit_core/families/<name>.py, nodes/<name>.py, `swiftdit swap --family <name>`
    title: str                    # what users read
    recipe: type                  # the model class: recipe.load(path, **options)
    node_prefix: str              # our node ids: node_prefix + role ("SwiftDiTKrea2" + "Loader")
    text_types: tuple[str, ...]   # CLIPLoader `type` values its official templates load its text encoder with
    replaces: tuple[str, ...]     # the stock nodes ours replace (docs/nodes.md: one node of ours for each)
    samplers: tuple[str, ...]     # KSampler sampler_name values our sampler runs
    schedulers: tuple[str, ...]   # KSampler scheduler values our sampler runs
    sampler_extra: tuple[tuple[str, object], ...] = ()  # our sampler's own widgets after KSampler's, with defaults
    # our DiT loader's own widgets after linears and gpu_budget_gb (gpus: its steps sequence-parallel over GPUs)
    loader_extra: tuple[tuple[str, object], ...] = ()
    # stock nodes of its templates' model path that pass our model on unchanged (ComfySwitchNode: the LoRA switch)
    switches: tuple[str, ...] = ()
    # stock nodes of its templates the swap cannot take yet, and why ("Type.input": that node with `input` wired)
    not_yet: tuple[tuple[str, str], ...] = ()
    # its templates sample with SamplerCustomAdvanced: the swap spells that group as a KSampler with the group's
    # sampler and scheduler (swiftdit/custom_sampler.py)
    custom_sampler: bool = False
    # stock MODEL -> MODEL nodes of its templates that our engine has no use for: the swap removes them from the
    # model path, saying why (node type, why)
    dropped: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not self.node_prefix.startswith("SwiftDiT") or bool(self.text_types) != bool(self.replaces):
            raise ValueError(f"family {self.name}: a SwiftDiT node prefix is needed, and text types and replaced "
                             f"nodes together (a family with official templates) or neither (OmniVoice)")

    def load(self, path, **options):
        """The family's model from its checkpoint file (dit_core.load_family)."""
        return self.recipe.load(path, **options)


FAMILIES = MappingProxyType({f.name: f for f in (
    Family("z_image", "Z-Image", ZImage, "SwiftDiTZImage", ("lumina2",),
           ("UNETLoader", "ModelSamplingAuraFlow", "LoraLoaderModelOnly", "CLIPLoader", "CLIPTextEncode",
            "KSampler", "VAELoader", "VAEDecode", "SaveImage"), tuple(SAMPLERS), tuple(SCHEDULERS)),
    Family("flux3_klein", "FLUX.3 Klein", Flux3Klein, "SwiftDiTFlux3Klein", ("flux3",),
           ("UNETLoader", "CLIPLoader", "CLIPTextEncode", "KSampler", "VAELoader", "VAEDecode", "VAEEncode",
            "SaveImage"),
           ("euler",), ("simple",), sampler_extra=(("cache", 0.3), ("refresh", 0))),
    # Krea 2's t2i templates and its style reference (TextEncodeQwenImageEditPlus -> ours; its SamplerCustomAdvanced
    # group with CFGGuider -> our sampler; VAEDecode -> ours on the stock VAELoader's qwen_image_vae)
    Family("krea2", "Krea 2", Krea2, "SwiftDiTKrea2", ("krea2",),
           ("UNETLoader", "ModelSamplingFlux", "LoraLoaderModelOnly", "CLIPLoader", "CLIPTextEncode",
            "TextEncodeQwenImageEditPlus", "KSampler", "VAEDecode", "SaveImage"),
           tuple(SAMPLERS), TABLE_SCHEDULERS, switches=("ComfySwitchNode",), custom_sampler=True),
    # H3's text to video, image to video, references to video and text to image templates: MiniMaxH3ImageToVideo
    # and MiniMaxH3ReferenceToVideo -> ours, MiniMaxH3SigmaShift -> ours, its SamplerCustomAdvanced group -> our
    # sampler (its sampler and scheduler, cfg 1), the audio VAE's loader -> ours for audio. FastH3's templates
    # (block-sparse attention) stay as they are.
    Family("minimax_h3", "MiniMax H3", MiniMaxH3, "SwiftDiTMiniMaxH3", ("minimax",),
           ("UNETLoader", "MiniMaxH3SigmaShift", "LoraLoaderModelOnly", "CLIPLoader", "CLIPTextEncode",
            "MiniMaxH3ImageToVideo",
            "MiniMaxH3ReferenceToVideo", "KSampler", "VAELoader", "VAEDecode", "VAEDecodeAudio", "SaveImage"),
           tuple(SAMPLERS),
           tuple(SCHEDULERS), switches=("ComfySwitchNode",), custom_sampler=True, loader_extra=(("gpus", "1"),),
           dropped=(("ModelAttentionBackend", "SwiftDiT runs MiniMax H3's attention itself (BF16 scores), not the "
                                              "attention this node picks"),),
           not_yet=(*((f"MiniMaxH3ReferenceToVideo.{kind}_{i}", H3_MORE_VIDEOS) for i in range(3, 8)
                      for kind in ("ref_videos.ref_video", "ref_video_audios.ref_video_audio")),
                    *((f"MiniMaxH3ReferenceToVideo.ref_images.ref_image_{i}", H3_MORE_IMAGES) for i in range(9, 16)),
                    *((f"MiniMaxH3ReferenceToVideo.ref_audios.ref_audio_{i}", H3_MORE_AUDIOS) for i in range(3, 8)),
                    ("BlockSparseAttention", "MiniMax H3's templates with BlockSparseAttention (FastH3's "
                                             "block-sparse attention) are not yet supported (issue 35)"))),
    # LTX-2.5's templates (video_ltx2_5_t2v, _i2v, _flf2v): each SamplerCustomAdvanced group (LTXVDualCFGGuider,
    # ManualSigmas, KSamplerSelect or SamplerEulerAncestral) -> our sampler (euler_ancestral, scheduler 'manual' = its
    # sigmas widget, cfg / audio_cfg the guider's, eta / s_noise SamplerEulerAncestral's), one node of ours for each
    # LTX model node and frame node (Img To Video Inplace, Add Guide, Crop Guides); the stock latent plumbing stays.
    Family("ltx25", "LTX-2.5", LTX25, "SwiftDiTLTX25", ("ltxv",),
           ("UNETLoader", "CLIPLoader", "CLIPTextEncode", "KSampler", "VAELoader", "VAEDecodeTiled",
            "LTXVAudioVAEDecode", "LTXVEmptyLatentAudio", "LTXVLatentUpsampler", "LatentUpscaleModelLoader",
            "LTXVImgToVideoInplace", "LTXVAddGuide", "LTXVCropGuides"),
           ("euler_ancestral",), ("manual",),
           sampler_extra=(("audio_cfg", 1.0), ("sigmas", STAGE_1_SIGMAS), ("eta", 1.0), ("s_noise", 1.0)),
           loader_extra=(("gpus", "1"),), custom_sampler=True,
           not_yet=tuple((f"LTXVAddGuide.{name}", LTX25_GUIDE_EXTRAS) for name in ("attention_mask",
                                                                                   "iclora_parameters"))),
    # OmniVoice: no stock nodes and no official template (a third-party pack wraps the package in one node), so
    # nothing to swap: only its nodes and its loader's recipe.
    Family("omnivoice", "OmniVoice", OmniVoice, "SwiftDiTOmniVoice", (), (), (), ()),
)})
