"""What a rank of a RankPool runs: a family's model loaded from its file into the rank's state (on the rank's GPU
where the ranks have them), then its methods called on every rank (its steps sequence-parallel across them) and its
attributes read (ranked.RankedModel, in the parent, stands in for the model)."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch

from .launch import moved
from .shards import Ranks

GIB = 2**30


def load_placed(ranks: Ranks, state: dict, load: Callable, path: str, budget_gb: float = 0.0, rows: int = 0,
                keep_free: int = 0) -> dict:
    """load(path) into this rank's state. On a CUDA rank (NCCL: the rank's current device) the model goes to its GPU
    (Model.to), its blocks within budget_gb GB (0: the GPU's free memory less a pass over this rank's share of
    `rows` rows, and on rank 0 less keep_free bytes: its GPU is the parent's too), the rest streaming from host
    memory; elsewhere it stays on the host as read. Returns what the parent keeps of it: its arch and the bytes this
    rank holds on its GPU."""
    model = load(path)
    on_gpu = torch.cuda.is_available() and torch.distributed.get_backend(ranks.group) == "nccl"
    if on_gpu:
        from ..gpu.streaming import pass_bytes  # the GPU path: imported where used
        device = torch.device("cuda", torch.cuda.current_device())
        reserve = pass_bytes(model.arch, -(-rows // ranks.world)) + (keep_free if ranks.rank == 0 else 0)

        def budget(total: int) -> int:
            available = max(0, torch.cuda.mem_get_info(device)[0] - reserve)
            return available if budget_gb <= 0 else min(int(budget_gb * GIB), available)

        model = model.to(device, budget_bytes=budget)
    state["model"] = model
    return {"arch": model.arch, "device_bytes": torch.cuda.memory_allocated() if on_gpu else 0}


def _plain(value) -> bool:
    """Whether value is data a rank can hand over as it is (numbers, names, shapes, configs), not a part of the
    model (tensors, modules, weights)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.Size)):
        return True
    if isinstance(value, (tuple, list)):
        return all(map(_plain, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def attribute(ranks: Ranks, state: dict, path: tuple[str, ...]) -> tuple[str, object]:
    """The loaded model's attribute at path (names, one after another): ("value", it) when plain data, ("method",
    None) when a method, else ("object", None): a part of the model, read further by a longer path."""
    value = state["model"]
    for name in path:
        value = getattr(value, name)
    if inspect.ismethod(value) or inspect.isfunction(value):
        return "method", None
    return ("value", value) if _plain(value) else ("object", None)


def method_call(ranks: Ranks, state: dict, name: str, args: tuple, kwargs: dict):
    """The loaded model's method `name` on args' tensors moved to the model's device, given this rank's ranks and the
    pool's check where it takes them (MiniMaxH3.velocity / denoised, LTX25.forward: its blocks across the ranks, the
    check after each block: the pool's cancel and progress)."""
    model = state["model"]
    method = getattr(model, name)
    takes = inspect.signature(method).parameters
    device = getattr(model, "device", None)
    args, kwargs = moved(args, device), moved(kwargs, device)
    if "ranks" in takes:
        kwargs["ranks"] = ranks
    if "check" in takes:
        kwargs["check"] = state.get("check")
    return method(*args, **kwargs)
