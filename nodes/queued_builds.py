"""A DiT's first-step Triton kernels built from the moment its prompt is queued: each DiT loader of ours in a queued
prompt starts its file's stand-in builds (dit_core/gpu/builds.built_beside) at once, so they run beside the text
encoder's load and encode too, not only beside the DiT's own load (on the H100 server a new machine's first Z-Image
sampler still waited 2.4 s for builds that began with the DiT's load). The loader takes the builds started for its
file (dit_loader); a file's are started once a process (later prompts find its kernels built)."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import torch

from ..dit_core.families import FAMILIES
from ..dit_core.families.loading import stand_in
from ..dit_core.gpu.builds import STAND_IN_ROOM, built_beside
from .memory import engine_device, file_key, fits_on_card

log = logging.getLogger("SwiftDiT")


def stand_in_builds_here(engine, path: str, device: torch.device) -> bool:
    """Whether engine's file builds its first step's kernels from a stand-in on device: a recipe with a dry pass, a
    CUDA GPU with room for the stand-in beside the file."""
    return (device.type == "cuda" and hasattr(engine, "dry_pass")
            and fits_on_card(os.path.getsize(path) + STAND_IN_ROOM))


def beside_dit_load(engine, path: str, linears: str, device: torch.device) -> threading.Thread:
    """The stand-in's builds of engine's file (its one-block stand-in's dry pass) on a thread of their own."""
    return built_beside(lambda: stand_in(engine, path, linears, device), lambda model: model.dry_pass(), device)


def build_key(path: str, linears: str) -> tuple:
    """The builds' key: the file as a loaded model's key names it (a replaced file is another), and its mode."""
    return file_key(path), linears


class QueuedBuilds:
    """The builds started for queued prompts, by build_key, until a loader takes them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: dict[tuple, threading.Thread] = {}
        self.started: set[tuple] = set()

    def start(self, key: tuple, begin: Callable[[], threading.Thread]) -> bool:
        """begin() unless builds for key were started already in this process; whether it began."""
        with self.lock:
            if key in self.started:
                return False
            self.started.add(key)
        thread = begin()
        with self.lock:
            self.threads[key] = thread
        return True

    def take(self, key: tuple) -> threading.Thread | None:
        with self.lock:
            return self.threads.pop(key, None)


QUEUED = QueuedBuilds()  # one for the process, as LOADED


def on_prompt(loaders: dict[str, type], decoders: dict[str, type] | None = None) -> Callable[[dict], dict]:
    """ComfyUI's on-prompt handler (PromptServer.add_on_prompt_handler): for each node of the queued prompt whose
    class is one of loaders (node id -> DiTLoaderNode subclass) and whose inputs it reads as its loader would
    (queued_load: the file and linears mode, None where it would refuse them or run several GPUs), its stand-in's
    builds started where they can help: on a CUDA GPU with room for them, a family with a dry pass; for a node of
    decoders (node id -> a class with queued_builds(device) -> (key, begin)), begin() once a key a process (a decoder
    made from a stock VAE at its own node, whose kernels would build only then). The prompt goes on unchanged; a
    node it cannot read is left to its own validation."""
    decoders = decoders or {}
    def handler(json_data: dict) -> dict:
        device = engine_device()
        prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
        if device.type != "cuda" or not isinstance(prompt, dict):
            return json_data
        for node in prompt.values():
            decoder = decoders.get(node.get("class_type")) if isinstance(node, dict) else None
            if decoder is not None:
                QUEUED.start(*decoder.queued_builds(device))
                continue
            cls = loaders.get(node.get("class_type")) if isinstance(node, dict) else None
            engine = FAMILIES[cls.FAMILY].recipe if cls is not None else None
            load = cls.queued_load(node.get("inputs", {})) if hasattr(engine, "dry_pass") else None
            if load is None or not stand_in_builds_here(engine, load[0], device):
                continue
            path, linears = load
            if QUEUED.start(build_key(path, linears), lambda: beside_dit_load(engine, path, linears, device)):
                log.info("SwiftDiT: %s's first-step kernels build from the queued prompt on", os.path.basename(path))
        return json_data
    return handler
