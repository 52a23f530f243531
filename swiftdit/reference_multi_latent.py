"""ReferenceMultiLatent (absent on ComfyUI v0.3.75) spelled out with nodes v0.3.75 has, for `--for-host`."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .for_host import Reducer


class ReferenceSpelling:
    """ReferenceMultiLatent as v0.3.75 nodes: per reference image ImageScaleToTotalPixels (its megapixels) ->
    VAEEncode -> ReferenceLatent chained on the positive and on the negative; its empty_latent is the first
    reference's latent times 0 (LatentMultiply): the same size, all zeros."""

    def __init__(self, reducer: Reducer, scope, node):
        self.r, self.ed, self.scope, self.node = reducer, reducer.ed, scope, node
        self.where = reducer.where(scope, node)

    def fail(self, why: str):
        return ValueError(f"node {self.where} (ReferenceMultiLatent): {why}")

    def run(self) -> None:
        ed, scope, node = self.ed, self.scope, self.node
        mode = self.r.constant(scope, node, "resolution")
        megapixels = self.r.constant(scope, node, "resolution.megapixels")
        if mode != "resize":
            raise self.fail(f"resolution {mode!r}: only 'resize' (each reference scaled to megapixels) is known")
        vae = ed.origin(scope, node, "vae")
        images = sorted((int(e["name"].rsplit("image", 1)[1]), ed.origin(scope, node, e["name"]))
                        for e in node.get("inputs", []) if re.fullmatch(r"images\.image\d+", e.get("name", ""))
                        and e.get("link") is not None)
        if vae is None or not images:
            raise self.fail("it needs a vae and at least one image wired")
        x, y = node.get("pos", [0, 0])[:2]
        latents = []
        for k, (_, image) in enumerate(images):
            # lanczos: our workflows/flux3_klein_edit.json spells the template's "scaled to ~1 MP" out with it
            scale = ed.add_node(scope, "ImageScaleToTotalPixels", (x, y + 120 * k), [("image", "IMAGE")],
                                ["IMAGE"], ["lanczos", megapixels])
            encode = ed.add_node(scope, "VAEEncode", (x + 290, y + 120 * k),
                                 [("pixels", "IMAGE"), ("vae", "VAE")], ["LATENT"], [])
            ed.add_link(scope, *image, scale["id"], 0)
            ed.add_link(scope, scale["id"], 0, encode["id"], 0)
            ed.add_link(scope, *vae, encode["id"], 1)
            latents.append(encode)
        for slot, name in enumerate(("positive", "negative")):
            readers = ed.consumers(scope, node["id"], slot)
            cond = ed.origin(scope, node, name)
            if readers and cond is None:
                raise self.fail(f"its {name} output is used but its {name} input is not wired")
            for k, encode in enumerate(latents if readers else []):
                ref = ed.add_node(scope, "ReferenceLatent", (x + 580, y + 120 * (k + len(latents) * slot)),
                                  [("conditioning", "CONDITIONING"), ("latent", "LATENT")], ["CONDITIONING"], [])
                ed.add_link(scope, *cond, ref["id"], 0)
                ed.add_link(scope, encode["id"], 0, ref["id"], 1)
                cond = (ref["id"], 0)
            for link_id in readers:
                ed.reorigin(scope, link_id, cond)
        readers = ed.consumers(scope, node["id"], 2)
        if readers:
            zero = ed.add_node(scope, "LatentMultiply", (x + 580, y - 120), [("samples", "LATENT")], ["LATENT"],
                               [0.0])
            ed.add_link(scope, latents[0]["id"], 0, zero["id"], 0)
            for link_id in readers:
                ed.reorigin(scope, link_id, (zero["id"], 0))
        self.r.note(scope, node, f"-> {len(images)} x (ImageScaleToTotalPixels lanczos {megapixels} MP -> "
                    f"VAEEncode -> ReferenceLatent on positive and negative), empty_latent -> LatentMultiply 0",
                    f"{self.r.host} has no ReferenceMultiLatent; ReferenceLatent puts the same "
                    f"reference_latents")
        self.r.drop(scope, node)
