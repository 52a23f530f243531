"""The extension: the one registry of SwiftDiT's node classes, grouped by family."""
from comfy_api.latest import ComfyExtension, io

from . import flux3_klein, krea2, z_image
from .memory import install_memory_hook

NODES_BY_FAMILY = {"z_image": z_image.NODES, "flux3_klein": flux3_klein.NODES, "krea2": krea2.NODES}


class SwiftDiTExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        # ComfyUI v0.3.75 calls get_node_list once at load (on_load is not called there): hook memory here.
        install_memory_hook()
        return [node for nodes in NODES_BY_FAMILY.values() for node in nodes]


async def comfy_entrypoint() -> SwiftDiTExtension:
    return SwiftDiTExtension()
