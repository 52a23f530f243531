"""SwiftDiT's workflow tools (the `swiftdit` command): swap stock nodes for ours (optionally reduced for the
ComfyUI v0.3.75 test host first), UI -> API format."""
from .families import FAMILIES
from .for_host import reduce_for_host, swap_for_host
from .swap import Report, swap, swap_api, swap_ui
from .ui_graph import problems
from .workflow_api import to_api

__all__ = ["FAMILIES", "Report", "problems", "reduce_for_host", "swap", "swap_api", "swap_for_host", "swap_ui",
           "to_api"]
