"""What every family's nodes share: model handles, the loaded-model cache, file lookup, errors, progress, cancel."""
from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

import comfy.model_management
import comfy.utils
import folder_paths
import torch

from ..dit_core.sampling import SamplingCancelled
from ..dit_core.weights import WeightsError

log = logging.getLogger("SwiftDiT")

LINEAR_MODES = {"as stored": "stored", "int8 convrot": "int8", "bf16": "bf16"}
WEIGHT_DTYPES = ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]


class SwiftDiTError(Exception):
    """A user-facing error, shown on the node: names the node, the input and the fix."""


@contextmanager
def checked(node_id: str, input_name: str):
    """Turns the engine's errors about an input into one message naming the node and that input."""
    try:
        yield
    except (WeightsError, ValueError, FileNotFoundError) as e:
        raise SwiftDiTError(f"{node_id} · {input_name}: {e}") from e


def model_file(node_id: str, folder: str, name: str, input_name: str) -> str:
    """The full path of `name` from ComfyUI's folder list `folder`; names outside those folders are refused."""
    if name not in folder_paths.get_filename_list(folder):
        raise SwiftDiTError(f"{node_id} · {input_name}: '{name}' is not in ComfyUI's models/{folder} folders; "
                            f"put the file there and refresh")
    return folder_paths.get_full_path_or_raise(folder, name)


def file_key(path: str) -> tuple:
    """A cache key that changes when the file is replaced."""
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


@dataclass(frozen=True)
class ModelHandle:
    """What travels on a SWIFTDIT_MODEL wire: which model to run and how, not the weights themselves.
    The sampler fetches the weights from LOADED, so a LoRA or shift node never copies a model."""
    family: str
    path: str
    linears: str
    loras: tuple[tuple[str, float], ...] = ()
    shift: float = 3.0

    def key(self) -> tuple:
        return (self.family, file_key(self.path), self.linears,
                tuple((file_key(p), s) for p, s in self.loras))

    def with_(self, **changes) -> ModelHandle:
        return replace(self, **changes)


@dataclass(frozen=True)
class FileHandle:
    """What travels on a SWIFTDIT_TEXT_ENCODER or SWIFTDIT_VAE wire: a file and its kind."""
    kind: str
    path: str

    def key(self) -> tuple:
        return (self.kind, file_key(self.path))


class LoadedModels:
    """Engine models the nodes loaded, at most one of each kind (DiT, text encoder, VAE), kept across prompts
    and emptied when ComfyUI frees memory for another model or the user unloads models."""

    def __init__(self):
        self._held: dict[str, tuple[tuple, object]] = {}

    def get(self, kind: str, key: tuple, load: Callable[[], object]):
        held = self._held.get(kind)
        if held is not None and held[0] == key:
            return held[1]
        if held is not None:  # one model of a kind at a time: drop the old one before loading the new
            del self._held[kind], held
            gc.collect()
        model = load()
        self._held[kind] = (key, model)
        log.info("SwiftDiT: loaded %s (%s)", os.path.basename(key[1][0]), kind)
        return model

    def free(self) -> int:
        n = len(self._held)
        self._held.clear()
        gc.collect()
        if n:
            log.info("SwiftDiT: freed %d models", n)
        return n


LOADED = LoadedModels()


def install_memory_hook() -> None:
    """Empty LOADED whenever ComfyUI unloads all models (POST /free, the Unload Models button) or frees memory
    it lacks for another model: ComfyUI's unload_all_models calls free_memory, so one wrapper covers both."""
    original = comfy.model_management.free_memory
    if getattr(original, "swiftdit_hook", False):
        return

    def free_memory(memory_required, device, keep_loaded=()):
        result = original(memory_required, device, list(keep_loaded))
        if memory_required >= 1e29 or comfy.model_management.get_free_memory(device) < memory_required:
            LOADED.free()
        return result

    free_memory.swiftdit_hook = True
    comfy.model_management.free_memory = free_memory


def engine_device() -> torch.device:
    """Where the DiT runs: ComfyUI's torch device when it is a CUDA GPU, else the CPU (the host path)."""
    device = comfy.model_management.get_torch_device()
    return device if device.type == "cuda" else torch.device("cpu")


def interrupt_check() -> None:
    """Raises ComfyUI's interrupt inside a step (called between blocks): Cancel takes effect within a step."""
    comfy.model_management.throw_exception_if_processing_interrupted()


def run_sampler(sample: Callable, steps: int):
    """Runs sample(callback, should_stop) with a ComfyUI progress bar per step; a cancel between steps
    becomes ComfyUI's interrupt (the server reports execution_interrupted and stays usable)."""
    bar = comfy.utils.ProgressBar(steps)
    try:
        return sample(lambda step, total, x, x0: bar.update_absolute(step, total),
                      comfy.model_management.processing_interrupted)
    except SamplingCancelled as e:
        raise comfy.model_management.InterruptProcessingException() from e


def conditioning_rows(node_id: str, input_name: str, conditioning) -> list:
    """The [1, L, width] text rows of each entry of a CONDITIONING, masked rows dropped. Several entries
    (Conditioning Combine, areas) are not supported by this sampler: refused with the fix."""
    if not conditioning:
        raise SwiftDiTError(f"{node_id} · {input_name}: empty conditioning; connect a text encode node")
    if len(conditioning) != 1:
        raise SwiftDiTError(f"{node_id} · {input_name}: {len(conditioning)} conditioning entries (Conditioning "
                            f"Combine or areas) are not supported; encode one prompt")
    rows, extra = conditioning[0]
    mask = extra.get("attention_mask")
    if mask is not None and rows.shape[0] == 1:
        rows = rows[:, mask[0].bool()]
    return rows
