"""Where a loaded model's bytes are (on its GPU, in page-locked and other host memory), and the one line the
loader and the log show of it."""
from __future__ import annotations

import dataclasses

import torch

from ..dit_core.gpu.streaming import StreamedBlocks
from ..dit_core.gpu.text_streaming import StreamedLayer
from ..dit_core.parallel import RankedModel

GIB = 2**30  # the loader's GB, as ComfyUI's --reserve-vram counts them


@dataclasses.dataclass(frozen=True)
class Placement:
    """A model's bytes: on its device, in page-locked host memory (streamed blocks' staged copies), and in
    other host memory; for a model in ranks (the loader's gpus: processes of their own), how many, and what rank 0
    holds on its GPU (the device's, this process's too) is in `device`."""
    device: int = 0
    pinned: int = 0
    host: int = 0
    ranks: int = 1


def placement(model) -> Placement:
    """Where model's tensors are (each storage counted once): a walk of its dataclasses, containers, torch
    modules and our own objects; streamed blocks and streamed text encoder layers report their own."""
    device = pinned = host = 0
    ranks, seen, storages, todo = 1, set(), set(), [model]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, StreamedBlocks):
            device, pinned = device + obj.device_bytes(), pinned + obj.host_bytes()
        elif isinstance(obj, RankedModel):
            device, ranks = device + obj.device_bytes, max(ranks, obj.world)
        elif isinstance(obj, StreamedLayer):  # a text encoder's layer: staged on the host, its module on meta
            pinned += obj.staged.nbytes
            todo.append(obj.slot)  # the one slot its layers share (counted once)
        elif isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            storage = obj.untyped_storage()
            if (storage.data_ptr(), obj.device) not in storages:
                storages.add((storage.data_ptr(), obj.device))
                if obj.device.type == "cpu":
                    host += storage.nbytes()
                else:
                    device += storage.nbytes()
        elif isinstance(obj, torch.nn.Module):
            todo.extend([*obj.parameters(), *obj.buffers()])
            todo.extend(m for m in obj.modules() if isinstance(m, StreamedLayer))
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (tuple, list)):
            todo.extend(obj)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            todo.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
        elif "dit_core." in f".{type(obj).__module__}" and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return Placement(device, pinned, host, ranks)


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:.1f} MiB"


def describe(model, device: torch.device | None) -> str:
    """One line for the log and the loader's output: the memory the model takes on its GPU and on the host
    (page-locked: streamed blocks' staged copies), and for streamed blocks how many stay on the GPU."""
    p, blocks = placement(model), getattr(model, "blocks", None)
    streamed = isinstance(blocks, StreamedBlocks)
    parts = [f"{_size(p.device)} on {device}"] if device is not None and device.type != "cpu" else []
    if p.pinned or streamed:
        parts.append(f"{_size(p.pinned)} of page-locked host memory")
    parts.append(f"{_size(p.host)} of {'other ' if p.pinned or streamed else ''}host memory")
    if streamed:
        parts.append(f"{sum(blocks.resident)} of {len(blocks)} blocks resident (budget {_size(blocks.budget)})")
    if p.ranks > 1:
        return f"{p.ranks} ranks, a process each (sequence parallel): {', '.join(parts)}"
    return ", ".join(parts)
