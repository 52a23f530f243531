"""MiniMax H3's MiniMaxH3SigmaShift (newer ComfyUI's comfy_extras/nodes_minimax_h3.py; v0.3.75 lacks it): the video
grid's shift and the audio grid's own, on a SWIFTDIT_MODEL handle (the r2v and FastH3 templates set 12/3 and
10/3)."""
from __future__ import annotations

from comfy_api.latest import io

from ..dit_core.sampling.minimax_h3 import AUDIO_SHIFT, VIDEO_SHIFT
from .base import finite, model_input, model_output
from .minimax_h3_codecs import CATEGORY

NODE_ID = "SwiftDiTMiniMaxH3SigmaShift"


class MiniMaxH3SigmaShift(io.ComfyNode):  # MiniMaxH3SigmaShift's inputs and output
    @classmethod
    def define_schema(cls):
        shift = dict(min=0.01, max=100.0, step=0.01)
        return io.Schema(
            node_id=NODE_ID, display_name="MiniMax H3 Sigma Shift (SwiftDiT)", category=CATEGORY,
            description="The shifts of H3's two sigma grids, as MiniMaxH3SigmaShift: the video grid's (the sampler's "
                        "steps) and the audio grid's (the audio rows' own noise level at each step).",
            inputs=[model_input("MiniMax H3"),
                    io.Float.Input("shift_video", default=VIDEO_SHIFT, **shift,
                                   tooltip="The video grid's shift: higher spends more steps at high noise"),
                    io.Float.Input("shift_audio", default=AUDIO_SHIFT, **shift, tooltip="The audio grid's shift")],
            outputs=[model_output("MiniMax H3")])

    @classmethod
    def execute(cls, model, shift_video, shift_audio) -> io.NodeOutput:
        video = finite(NODE_ID, "shift_video", shift_video, 0.01, 100.0)
        audio = finite(NODE_ID, "shift_audio", shift_audio, 0.01, 100.0)
        return io.NodeOutput(model.with_(schedule=model.schedule.at(video, audio)))
