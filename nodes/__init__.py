"""The extension: the one registry of SwiftDiT's node classes, grouped by family. The families are the rows of the
one family table (dit_core/families/__init__.py, FAMILIES); each row's `nodes/<name>.py` ends with its NODES. Nodes
of no family (Save Image) are SHARED_NODES."""
from importlib import import_module

from comfy_api.latest import ComfyExtension, io

from ..dit_core.families import FAMILIES
from .memory import install_memory_hook
from .save_image import NODES as SHARED_NODES

NODES_BY_FAMILY = {name: import_module(f".{name}", __package__).NODES for name in FAMILIES}
NODE_CLASSES = [node for nodes in (*NODES_BY_FAMILY.values(), SHARED_NODES) for node in nodes]


class SwiftDiTExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        # ComfyUI v0.3.75 calls get_node_list once at load (on_load is not called there): hook memory here.
        install_memory_hook()
        return NODE_CLASSES


async def comfy_entrypoint() -> SwiftDiTExtension:
    return SwiftDiTExtension()
