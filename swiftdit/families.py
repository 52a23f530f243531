"""Per-family swap tables: which stock nodes our nodes replace, their sockets and widgets (docs/nodes.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Role:
    """One stock node and ours that replaces it: same widgets in the same order, then `extra_widgets`."""
    ours: str
    sockets: tuple[tuple[str, str], ...] = ()  # the stock node's linked inputs: (name, stock wire type)
    outputs: tuple[str, ...] = ()              # stock output types, in order
    widgets: tuple[str, ...] = ()              # stock widget names in UI order (rules read them by name)
    extra_widgets: tuple[tuple[str, object], ...] = ()  # ours only, appended after the stock widgets
    accepts: tuple[tuple[str, tuple], ...] = ()  # widget values ours runs; other values leave the node stock


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
    vae_loader: str
    decoders: tuple[str, ...]
    # VAE encodes whose LATENT reaches a sampler's conditioning (reference images, e.g. through ReferenceLatent)
    vae_encoders: tuple[str, ...] = ()
    ours_roles: MappingProxyType = field(init=False)  # our node id -> the stock class it replaces

    def __post_init__(self):
        for stock in (self.sampler, self.model_loader, self.text_loader, self.vae_loader,
                      *self.model_patches, *self.text_encoders, *self.decoders, *self.vae_encoders):
            if stock not in self.roles:
                raise ValueError(f"family {self.name}: {stock} is named in a rule but has no role")
        object.__setattr__(self, "ours_roles",
                           MappingProxyType({r.ours: stock for stock, r in self.roles.items()}))

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


# docs/nodes.md, "Z-Image": every input name and widget order as the stock node's; the loader adds `linears` and
# `gpu_budget_gb` (0: automatic).
Z_IMAGE = Family(
    name="z_image",
    title="Z-Image",
    roles=MappingProxyType({
        "UNETLoader": Role("SwiftDiTZImageLoader", outputs=("MODEL",), widgets=("unet_name", "weight_dtype"),
                           extra_widgets=(("linears", "as stored"), ("gpu_budget_gb", 0))),
        "ModelSamplingAuraFlow": Role("SwiftDiTZImageModelSamplingAuraFlow", sockets=(("model", "MODEL"),),
                                      outputs=("MODEL",), widgets=("shift",)),
        "LoraLoaderModelOnly": Role("SwiftDiTZImageLoraLoaderModelOnly", sockets=(("model", "MODEL"),),
                                    outputs=("MODEL",), widgets=("lora_name", "strength_model")),
        "CLIPLoader": Role("SwiftDiTZImageTextEncoderLoader", outputs=("CLIP",),
                           widgets=("clip_name", "type", "device"),
                           accepts=(("device", ("default", "cpu")),)),
        "CLIPTextEncode": Role("SwiftDiTZImageTextEncode", sockets=(("clip", "CLIP"),),
                               outputs=("CONDITIONING",), widgets=("text",)),
        "KSampler": Role("SwiftDiTZImageSampler",
                         sockets=(("model", "MODEL"), ("positive", "CONDITIONING"),
                                  ("negative", "CONDITIONING"), ("latent_image", "LATENT")),
                         outputs=("LATENT",),
                         widgets=("seed", "control_after_generate", "steps", "cfg", "sampler_name",
                                  "scheduler", "denoise"),
                         accepts=(("sampler_name", ("euler", "res_multistep")),
                                  ("scheduler", ("simple", "normal", "sgm_uniform", "karras", "exponential",
                                                 "ddim_uniform", "beta", "linear_quadratic", "kl_optimal")))),
        "VAELoader": Role("SwiftDiTZImageVAELoader", outputs=("VAE",), widgets=("vae_name",)),
        "VAEDecode": Role("SwiftDiTZImageVAEDecode", sockets=(("samples", "LATENT"), ("vae", "VAE")),
                          outputs=("IMAGE",)),
    }),
    wire_types=MappingProxyType({"MODEL": "SWIFTDIT_MODEL", "CLIP": "SWIFTDIT_TEXT_ENCODER",
                                 "VAE": "SWIFTDIT_VAE"}),
    sampler="KSampler",
    model_loader="UNETLoader",
    model_patches=("ModelSamplingAuraFlow", "LoraLoaderModelOnly"),
    text_loader="CLIPLoader",
    # ComfyUI loads Z-Image's Qwen3-4B with CLIPLoader type lumina2 (all four official Z-Image templates).
    text_loader_types=("lumina2",),
    text_encoders=("CLIPTextEncode",),
    vae_loader="VAELoader",
    decoders=("VAEDecode",),
)

# docs/nodes.md, "FLUX.3 Klein": the same roles as Z-Image without model patches (the sampler applies shift 16
# itself), plus VAE encode for reference images. The sampler runs Euler / simple (any denoise) and appends
# `cache` and `refresh`. Stock ReferenceLatent / ReferenceMultiLatent / EmptyFlux2LatentImage stay: they take and give
# CONDITIONING and LATENT (ReferenceMultiLatent also takes a VAE, so a VAELoader feeding it stays stock).
FLUX3_KLEIN = Family(
    name="flux3_klein",
    title="FLUX.3 Klein",
    roles=MappingProxyType({
        "UNETLoader": Role("SwiftDiTFlux3KleinLoader", outputs=("MODEL",), widgets=("unet_name", "weight_dtype"),
                           extra_widgets=(("linears", "as stored"), ("gpu_budget_gb", 0))),
        "CLIPLoader": Role("SwiftDiTFlux3KleinTextEncoderLoader", outputs=("CLIP",),
                           widgets=("clip_name", "type", "device"),
                           accepts=(("device", ("default", "cpu")),)),
        "CLIPTextEncode": Role("SwiftDiTFlux3KleinTextEncode", sockets=(("clip", "CLIP"),),
                               outputs=("CONDITIONING",), widgets=("text",)),
        "KSampler": Role("SwiftDiTFlux3KleinSampler",
                         sockets=(("model", "MODEL"), ("positive", "CONDITIONING"),
                                  ("negative", "CONDITIONING"), ("latent_image", "LATENT")),
                         outputs=("LATENT",),
                         widgets=("seed", "control_after_generate", "steps", "cfg", "sampler_name",
                                  "scheduler", "denoise"),
                         extra_widgets=(("cache", 0.3), ("refresh", 0)),
                         accepts=(("sampler_name", ("euler",)), ("scheduler", ("simple",)))),
        "VAELoader": Role("SwiftDiTFlux3KleinVAELoader", outputs=("VAE",), widgets=("vae_name",)),
        "VAEDecode": Role("SwiftDiTFlux3KleinVAEDecode", sockets=(("samples", "LATENT"), ("vae", "VAE")),
                          outputs=("IMAGE",)),
        "VAEEncode": Role("SwiftDiTFlux3KleinVAEEncode", sockets=(("pixels", "IMAGE"), ("vae", "VAE")),
                          outputs=("LATENT",)),
    }),
    wire_types=MappingProxyType({"MODEL": "SWIFTDIT_MODEL", "CLIP": "SWIFTDIT_TEXT_ENCODER",
                                 "VAE": "SWIFTDIT_VAE"}),
    sampler="KSampler",
    model_loader="UNETLoader",
    model_patches=(),
    text_loader="CLIPLoader",
    # Both official distilled templates load Qwen3-VL-4B (and the 9B prompt upsampler) with CLIPLoader type flux3.
    text_loader_types=("flux3",),
    text_encoders=("CLIPTextEncode",),
    vae_loader="VAELoader",
    decoders=("VAEDecode",),
    vae_encoders=("VAEEncode",),
)

FAMILIES = MappingProxyType({f.name: f for f in (Z_IMAGE, FLUX3_KLEIN)})
