"""A family's model loaded in the ranks of a RankPool, standing in for the model where a sampler runs it (the nodes'
`gpus` option): the sampler's arithmetic stays in this process, on its device, and each step's blocks run
sequence-parallel across the ranks, one process (and GPU) a rank."""
from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable

import torch

from .launch import RankPool, moved, on_host
from .shards import padded_heads
from .steps import attribute, load_placed, method_call

CALL_TIMEOUT_S = 3600.0  # a load or a step; a rank that stops answering within a collective is found sooner


class RanksDoNotFit(ValueError):
    """The model's attention heads cannot be shared out over the ranks asked for (shards.padded_heads)."""


class RankedModel:
    """The model of class `recipe` loaded in every rank. A method call runs on every rank (where the method takes
    `ranks`, its blocks across them; its `check`, e.g. ComfyUI's interrupt, is called here while they work, and the
    ranks stop together at their next block when it raises), its tensors' arguments sent from the host and its
    result rank 0's, on this process's `device`. Other attributes are read from rank 0: plain data (sizes, the
    arch) once, parts of the model (a linear) as further reads. close() stops the ranks; a rank's failure (RankFailed)
    stops them all and leaves the model closed (`alive` False)."""

    blocks = None  # the model's blocks are in the ranks: none here to stream or count

    def __init__(self, pool: RankPool, recipe: type, device: torch.device, facts: dict):
        self._pool, self._recipe, self._known = pool, recipe, {}
        self.device = torch.device(device)
        self.arch, self.device_bytes = facts["arch"], facts["device_bytes"]

    @staticmethod
    def start(world: int, load: Callable, path: str, recipe: type, device: torch.device, budget_gb: float = 0.0,
              rows: int = 0, check: Callable[[], None] | None = None, keep_free: int = 0,
              timeout_s: float = CALL_TIMEOUT_S) -> RankedModel:
        """`world` ranks, each running load(path) (picklable: e.g. a partial of recipe.load) and placing the model
        (steps.load_placed: on CUDA each rank on its GPU, NCCL, blocks within budget_gb for a pass over `rows` rows
        shared out, rank 0 leaving keep_free bytes of its GPU to this process; else on the host, gloo, the cores
        shared out). device: where the sampler's state lives here."""
        on_gpu = torch.device(device).type == "cuda"
        pool = RankPool(world, timeout_s, "nccl" if on_gpu else "gloo",
                        threads=0 if on_gpu else max(1, (os.cpu_count() or 1) // world))
        try:
            facts = pool(load_placed, load, str(path), budget_gb, rows, keep_free, check=check)
            try:
                padded_heads(facts["arch"].heads, facts["arch"].kv_heads or facts["arch"].heads, world)
            except ValueError as e:
                raise RanksDoNotFit(str(e)) from e
        except BaseException:
            pool.close()
            raise
        return RankedModel(pool, recipe, device, facts)

    @property
    def world(self) -> int:
        return self._pool.world

    @property
    def alive(self) -> bool:
        """Whether every rank is up and the pool open (a rank that failed or was killed closes it)."""
        return self._pool.open and len(self._pool.alive) == self.world

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RankedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str):
        if name.startswith("_"):  # pickle's and copy's probes, and this object's own fields before __init__
            raise AttributeError(name)
        return self._read((name,))

    def _read(self, path: tuple[str, ...]):
        if path in self._known:
            return self._known[path]
        kind, value = self._pool(attribute, path)
        if kind == "value":
            self._known[path] = value
            return value
        if kind == "object":
            return _Part(self, path)
        if len(path) > 1:
            raise AttributeError(f"sequence parallel: {'.'.join(path)} is a method of a part of the model, which "
                                 f"runs only in its ranks")
        return functools.partial(self._call, path[0])

    def _call(self, name: str, *args, **kwargs):
        bound = inspect.signature(getattr(self._recipe, name)).bind(None, *args, **kwargs)
        check = bound.arguments.pop("check", None)  # stays here: the ranks get the pool's agreed check
        bound.arguments.pop("ranks", None)
        result = self._pool(method_call, name, on_host(bound.args[1:]), on_host(bound.kwargs), check=check)
        return moved(result, self.device)


class _Part:
    """A part of a RankedModel's model (e.g. its audio input linear), whose attributes are read from rank 0."""

    def __init__(self, model: RankedModel, path: tuple[str, ...]):
        self._model, self._path = model, path

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._model._read((*self._path, name))
