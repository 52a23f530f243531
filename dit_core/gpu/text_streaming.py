"""A text encoder's decoder layers streamed from page-locked host memory (issue 34: a card smaller than the
encoder, as MiniMax H3's 32B on a 16 GB card): each layer's tensors staged once in host memory (staging.stage), and
copied into one slot on the device just before the layer runs on those views (torch.func.functional_call). An
encode runs each layer once and a prompt's compute is small beside a layer's copy, so copies do not run ahead."""
from __future__ import annotations

import torch
from torch.func import functional_call

from .staging import Staged, stage


class StreamedLayer(torch.nn.Module):
    """One decoder layer whose weights live staged on the host: its module on meta (no host copy beside the
    staged one), its tensors by name viewed in the shared device slot at each call."""

    def __init__(self, layer: torch.nn.Module, staged: Staged, names: tuple[str, ...], slot: torch.Tensor):
        super().__init__()
        self.layer, self.staged, self.names, self.slot = layer, staged, names, slot

    def __getattr__(self, name: str):
        # what the model's loop reads of a layer besides calling it (transformers' `attention_type`)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("layer"), name)

    def forward(self, *args, **kwargs):
        self.staged.copy_to(self.slot)  # on the current stream: the layer's kernels follow it there
        return functional_call(self.layer, dict(zip(self.names, self.staged.on(self.slot))), args, kwargs)


def stream_layers(model: torch.nn.Module, device: torch.device) -> int:
    """model (a transformers text model on the host, its `layers` a ModuleList) run with its layers streamed to
    device and the rest of it moved there; returns the slot's bytes (the largest layer's staged size). Each layer
    is staged and its host tensors dropped before the next, so the host holds the model once."""
    staged = []
    for i, layer in enumerate(model.layers):
        state = dict(layer.named_parameters()) | dict(layer.named_buffers())  # non-persistent buffers too
        staged.append((tuple(state), stage(tuple(t.detach() for t in state.values()))))
        model.layers[i] = layer.to("meta")
    slot = torch.empty(max(s.nbytes for _, s in staged), dtype=torch.uint8, device=device)
    layers = [StreamedLayer(layer, s, names, slot) for layer, (names, s) in zip(model.layers, staged)]
    for i, streamed in enumerate(layers):
        model.layers[i] = streamed
    for name, child in model.named_children():
        if name != "layers":
            child.to(device)
    return slot.numel()
