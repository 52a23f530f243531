"""The extension: the one registry of SwiftDiT's node classes, grouped by family. The families are the rows of the
one family table (dit_core/families/__init__.py, FAMILIES); each row's `nodes/<name>.py` ends with its NODES. Nodes
of no family (Save Image) are SHARED_NODES."""
import sys
from importlib import import_module

from comfy_api.latest import ComfyExtension, io

from ..dit_core.families import FAMILIES
from .family_nodes import DiTLoaderNode
from .memory import install_memory_hook
from .queued_builds import on_prompt
from .save_image import NODES as SHARED_NODES

NODES_BY_FAMILY = {name: import_module(f".{name}", __package__).NODES for name in FAMILIES}
NODE_CLASSES = [node for nodes in (*NODES_BY_FAMILY.values(), SHARED_NODES) for node in nodes]


class SwiftDiTExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        # ComfyUI v0.3.75 calls get_node_list once at load (on_load is not called there): hook memory here, and
        # the DiT loaders' builds into the queueing of prompts (the server is made before the extensions load).
        install_memory_hook()
        server = getattr(sys.modules.get("server"), "PromptServer", None)  # (ComfyUI's, imported before us)
        if getattr(server, "instance", None) is not None:
            server.instance.add_on_prompt_handler(
                on_prompt({c.NODE_ID: c for c in NODE_CLASSES if issubclass(c, DiTLoaderNode)},
                          {c.NODE_ID: c for c in NODE_CLASSES if hasattr(c, "queued_builds")}))
        return NODE_CLASSES


async def comfy_entrypoint() -> SwiftDiTExtension:
    return SwiftDiTExtension()
