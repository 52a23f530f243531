"""LoraLoaderModelOnly for the families whose loaders merge LoRAs: the LoRA joins the model handle (no weights
copied) and merges as the family's loader reads the file."""
from __future__ import annotations

import folder_paths
from comfy_api.latest import io

from .base import ModelHandle, checked, model_file
from .types import DiTModel


class LoraLoaderNode(io.ComfyNode):
    """LoraLoaderModelOnly's inputs (model, lora_name, strength_model); a family's node sets the constants and
    `load` (its load_dit: the merge is checked at once, so a LoRA of another model fails on this node)."""
    NODE_ID = DISPLAY = CATEGORY = DESCRIPTION = ""

    @staticmethod
    def load(handle: ModelHandle):
        raise NotImplementedError

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=cls.CATEGORY, description=cls.DESCRIPTION,
            inputs=[DiTModel.Input("model"),
                    io.Combo.Input("lora_name", options=folder_paths.get_filename_list("loras")),
                    io.Float.Input("strength_model", default=1.0, min=-100.0, max=100.0, step=0.01)],
            outputs=[DiTModel.Output()])

    @classmethod
    def execute(cls, model, lora_name, strength_model) -> io.NodeOutput:
        if strength_model == 0:
            return io.NodeOutput(model)
        path = model_file(cls.NODE_ID, "loras", lora_name, "lora_name")
        handle = model.with_(loras=(*model.loras, (path, float(strength_model))))
        with checked(cls.NODE_ID, "lora_name"):
            cls.load(handle)
        return io.NodeOutput(handle)
