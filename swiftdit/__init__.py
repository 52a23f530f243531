"""SwiftDiT's workflow tools (the `swiftdit` command): swap stock nodes for ours, UI -> API format."""
from .families import FAMILIES
from .swap import Report, swap, swap_api, swap_ui
from .ui_graph import problems
from .workflow_api import to_api

__all__ = ["FAMILIES", "Report", "problems", "swap", "swap_api", "swap_ui", "to_api"]
