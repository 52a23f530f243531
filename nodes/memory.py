"""Memory of the nodes' models (issue 5): the engine's device, the loaded-model cache (one model a (kind, role) slot)
and its models there, the DiT's block budget from the loader's gpu_budget_gb, a pass's memory checked against the
family's pass-size estimate, and GPU memory given back when ComfyUI frees memory (and taken again on the next use);
the report of where a model's bytes are is nodes/model_bytes.py."""
from __future__ import annotations

import functools
import gc
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager

import comfy.model_management
import torch

from ..dit_core.gpu.streaming import StreamedBlocks, host_pass_bytes, pass_bytes, step_flops
from ..dit_core.parallel import RankedModel
from .family_settings import PassSize
from .model_bytes import GIB, describe, placement

log = logging.getLogger("SwiftDiT")

UNLOAD_ALL = 1e29  # ComfyUI's unload_all_models (POST /free, Unload Models) asks free_memory for 1e30 bytes


def same_device(a: torch.device | None, b: torch.device | str | None) -> bool:
    """a and b are one device ('cuda' and 'cuda:0' on a one-GPU host; ComfyUI names its device cuda:N)."""
    if a is None or b is None:
        return False
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index or 0) == (b.index or 0)


MAIN = "main"  # the role of a family's one model of a kind


def slot_name(slot: tuple[str, str]) -> str:
    """A (kind, role) slot as the log says it: the kind alone for the main role."""
    kind, role = slot
    return kind if role == MAIN else f"{role} {kind}"


class LoadedModels:
    """Engine models the nodes loaded, at most one of each (kind, role), kept across prompts: kind DiT ("dit"), text
    encoder ("text") or VAE ("vae"); role which of a family's models of that kind ("main", or e.g. "video", "audio",
    "vocoder" where a family runs several), so a family's models of one kind stay loaded together and a new file
    replaces only the one in its slot. ComfyUI's unload (POST /free, Unload Models) empties it; when ComfyUI lacks
    memory for another model, the models give back what it lacks (give_back). asking: our own request for room is
    being made (the hook then takes nothing from ours). Each model holds its companions by name (attached). A model
    with close() (one whose ranks are processes: RankedModel) is closed when it goes; one no longer `alive` (its
    ranks failed) is loaded again."""

    def __init__(self):
        self._held: dict[tuple[str, str], tuple[tuple, object, torch.device | None, dict[str, object]]] = {}
        self.asking = False

    def get(self, kind: str, key: tuple, load: Callable[[], object], device: torch.device | None = None,
            role: str = MAIN):
        slot = (kind, role)
        held = self._held.get(slot)
        if held is not None and held[0] == key and getattr(held[1], "alive", True):
            return held[1]
        if held is not None:  # one model a slot: drop the old one before loading the new
            del held
            self._drop(slot)
            gc.collect()
        started = time.perf_counter()
        model = load()
        self._held[slot] = (key, model, device, {})
        log.info("SwiftDiT: loaded %s (%s): %s; %.2f s", os.path.basename(key[1][0]), slot_name(slot),
                 describe(model, device), time.perf_counter() - started)
        return model

    def attached(self, kind: str, name: str, make: Callable[[], object], role: str = MAIN):
        """The companion `name` of the model in slot (kind, role) now (e.g. its graphed step), made by make() on
        first use and dropped with the model. A companion has clear(): give_back and free call it before the
        model's memory moves or goes (a CUDA graph reads the weights where they were, and holds a pool)."""
        companions = self._held[kind, role][3]
        if name not in companions:
            companions[name] = make()
        return companions[name]

    def clear_companions(self, kind: str) -> None:
        """clear() on the companions of the models of `kind` (e.g. the graphed step after a step whose rows are not
        to be kept)."""
        self._clear_companions(kinds=(kind,))

    def _clear_companions(self, device: torch.device | None = None, kinds: tuple[str, ...] | None = None) -> None:
        """clear() on the companions of the models (of `kinds`) on device (of all models when None)."""
        for (kind, _), (_, _, where, companions) in self._held.items():
            if (device is None or same_device(where, device)) and (kinds is None or kind in kinds):
                for companion in companions.values():
                    companion.clear()

    def _drop(self, slot: tuple[str, str]) -> None:
        """The model in slot goes (its processes stop, where it has some)."""
        close = getattr(self._held.pop(slot)[1], "close", None)
        if callable(close):
            close()

    def free(self) -> int:
        n = len(self._held)
        self._clear_companions()
        for slot in list(self._held):
            self._drop(slot)
        gc.collect()
        if n:
            log.info("SwiftDiT: freed %d models", n)
        return n

    def give_back(self, nbytes: int, device: torch.device, kinds: tuple[str, ...] | None = None) -> int:
        """At least nbytes of device's memory back where our models (of `kinds`, all when None) hold that much: the
        companions there are cleared (CUDA graphs: their pools go, and none outlives the blocks it reads), streamed
        blocks leave first (their staged copies stay; the next use brings them back), then whole models go (loaded
        again from their files when next used). Returns the bytes given back."""
        self._clear_companions(device, kinds)
        mine = lambda slot, where: same_device(where, device) and (kinds is None or slot[0] in kinds)  # noqa: E731
        freed, moved, dropped = 0, 0, []
        for slot, (_, model, where, _) in self._held.items():
            blocks = getattr(model, "blocks", None)
            if freed < nbytes and mine(slot, where) and isinstance(blocks, StreamedBlocks):
                before = sum(blocks.resident)
                freed += blocks.free(nbytes - freed)
                moved += before - sum(blocks.resident)
        for slot, (_, model, where, _) in list(self._held.items()):
            if freed < nbytes and mine(slot, where):
                freed += placement(model).device
                self._drop(slot)
                dropped.append(slot_name(slot))
        if dropped:
            gc.collect()
        if freed:
            log.info("SwiftDiT: gave back %.2f GiB of %s memory: %d DiT blocks to host memory (back on their "
                     "next use)%s", freed / GIB, device, moved,
                     f", dropped the {' and '.join(dropped)}" if dropped else "")
        return freed


LOADED = LoadedModels()


def install_memory_hook() -> None:
    """Wraps ComfyUI's free_memory, which unload_all_models (POST /free, the Unload Models button) and every
    model load (load_models_gpu) call: after ComfyUI has unloaded its own models, an unload empties LOADED and
    a shortfall is given back by ours (streamed blocks first)."""
    original = comfy.model_management.free_memory
    if getattr(original, "swiftdit_hook", False):
        return

    def free_memory(memory_required, device, keep_loaded=()):
        result = original(memory_required, device, list(keep_loaded))
        if memory_required >= UNLOAD_ALL:
            if LOADED.free():  # ComfyUI emptied its cache before ours went: what ours held goes back too
                comfy.model_management.soft_empty_cache()
        elif not LOADED.asking:
            short = memory_required - comfy.model_management.get_free_memory(device)
            if short > 0 and LOADED.give_back(int(short), device):
                comfy.model_management.soft_empty_cache()
        return result

    free_memory.swiftdit_hook = True
    comfy.model_management.free_memory = free_memory


# --- the DiT's block budget --------------------------------------------------------------------------------

def streams_on(device: torch.device) -> bool:
    """Whether a DiT's blocks stream within a budget there: on a CUDA GPU; the CPU's host path keeps its
    blocks in RAM."""
    return device.type == "cuda"


def budget_bytes(gpu_budget_gb: float, free: int, held: int, reserve: int) -> int:
    """The bytes a DiT's blocks may take on the device: the free memory plus what the blocks hold there
    already, less `reserve` (a pass's need); at most the loader's gpu_budget_gb GB when set (0: automatic)."""
    available = max(0, free + held - reserve)
    return available if gpu_budget_gb <= 0 else min(int(gpu_budget_gb * GIB), available)


def reserve_bytes(model, rows: int) -> int:
    """What a pass over `rows` rows needs besides the weights, plus what ComfyUI keeps free for other
    programs (--reserve-vram)."""
    return pass_bytes(model.arch, rows) + int(comfy.model_management.extra_reserved_memory())


@contextmanager
def _asking():
    LOADED.asking = True
    try:
        yield
    finally:
        LOADED.asking = False


def make_room(device: torch.device, nbytes: int) -> None:
    """ComfyUI unloads its own models until nbytes are free on device, as it does before loading one of its
    own (load_models_gpu); then, where that is not enough, our text encoders there go (their prompts are
    encoded; an encode loads one again). The DiT's own blocks stay: its budget is what is left."""
    with _asking():
        comfy.model_management.free_memory(nbytes, device)
    short = nbytes - comfy.model_management.get_free_memory(device)
    if short > 0 and LOADED.give_back(short, device, kinds=("text",)):
        comfy.model_management.soft_empty_cache()


def place_dit(model, device: torch.device, gpu_budget_gb: float, rows: int):
    """model (on the host) where it runs; on a CUDA GPU its blocks take the budget less a pass over `rows` rows
    (the rest stream from page-locked host memory), asked once its other parts are there."""
    if not streams_on(device):
        return model.to(device)
    reserve = reserve_bytes(model, rows)

    def budget(total: int) -> int:
        make_room(device, (total if gpu_budget_gb <= 0 else min(total, int(gpu_budget_gb * GIB))) + reserve)
        return budget_bytes(gpu_budget_gb, comfy.model_management.get_free_memory(device), 0, reserve)

    return model.to(device, budget_bytes=budget)


def fit_blocks(model, device: torch.device, gpu_budget_gb: float, rows: int) -> None:
    """Before a pass over `rows` rows: the streamed blocks re-planned for the budget now (Model.fill and
    Model.room of seed 001): blocks given back to ComfyUI come back while there is room, and blocks leave
    where the pass needs their room."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, StreamedBlocks):
        return
    reserve, held = reserve_bytes(model, rows), blocks.device_bytes()
    target = blocks.total_bytes() if gpu_budget_gb <= 0 else min(blocks.total_bytes(), int(gpu_budget_gb * GIB))
    if target + reserve > held:
        make_room(device, target + reserve - held)
    blocks.refill(budget_bytes(gpu_budget_gb, comfy.model_management.get_free_memory(device), held, reserve))


def room_for(device: torch.device, nbytes: int) -> None:
    """Before a model of about nbytes loads onto a CUDA device (a text encoder after the DiT, on a small card):
    ComfyUI unloads its own models, and what is still short ours give back through the free_memory hook (streamed
    DiT blocks first, then whole models; they come back on their next use)."""
    if device.type == "cuda":
        comfy.model_management.free_memory(nbytes, device)


def fits_on_card(nbytes: int) -> bool:
    """Whether the engine runs on a GPU with nbytes free there now (ComfyUI's count: the driver's free memory and its
    allocator's cached blocks)."""
    device = engine_device()
    return device.type == "cuda" and comfy.model_management.get_free_memory(device) >= nbytes


def graphed_dit_step(dit, device: torch.device):
    """On a CUDA device, the loaded DiT's step replayed from CUDA graphs for the shapes whose eager step waits on the
    host (GraphedStep's "host_bound": a graph pays there only), kept with the model across prompts and cleared when
    ComfyUI takes its memory back (LoadedModels.attached); elsewhere None (the sampler runs the step itself)."""
    if device.type != "cuda":
        return None
    return LOADED.attached("dit", "graphed_step", lambda: dit.graphed(capture="host_bound"))


def file_key(path: str) -> tuple:
    """A cache key that changes when the file is replaced."""
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


def engine_device() -> torch.device:
    """Where the DiT runs: ComfyUI's torch device when it is a CUDA GPU, else the CPU (the host path)."""
    device = comfy.model_management.get_torch_device()
    return device if device.type == "cuda" else torch.device("cpu")


def on_device(kind: str, handle, load: Callable[[], object], family: str = "",
              place: Callable[[object, torch.device], object] | None = None, role: str = MAIN):
    """LOADED's model in slot (kind, role) for handle (nodes/base.py's ModelHandle or FileHandle), moved to
    engine_device() (by place(model, device) when given). The device is part of the cache key, and so is the family
    for files that two families read differently (a VAE, a text encoder)."""
    device = engine_device()
    place = place or (lambda model, where: model.to(where))
    return LOADED.get(kind, (*handle.key(), str(device), family), lambda: place(load(), device), device, role)


def on_device_as(kind: str, handle, load: Callable[[], object], gpu_dtype: torch.dtype, family: str = "",
                 role: str = MAIN):
    """on_device for a model moved by its .to(device, dtype): in gpu_dtype on a CUDA GPU, f32 on the CPU."""
    return on_device(kind, handle, load, family, role=role,
                     place=lambda model, where: model.to(where, gpu_dtype if where.type == "cuda" else torch.float32))


def vae_on_device(handle, load: Callable[[], object], family: str = "", role: str = MAIN):
    """on_device for an image VAE's decoder (dit_core/codecs: FLUX.1's, FLUX.2's, Qwen-Image's): in BF16 on a CUDA
    GPU, as stock ComfyUI decodes there, its activations channels last (a 1024x1024 FLUX.1 decode 28.2 ms against
    35.4 laid out [B, C, H, W] and 0.9 GB less at its peak, H100: bench_image_decode.py); f32 on the CPU."""
    def place(model, where: torch.device):
        cuda = where.type == "cuda"
        return model.to(where, torch.bfloat16 if cuda else torch.float32, channels_last=cuda)
    return on_device("vae", handle, load, family, role=role, place=place)


def dit_on_device(handle, load: Callable[[], object], pass_size: PassSize, rows: int | None = None,
                  check: Callable[[object], None] | None = None, places: bool = False):
    """LOADED's DiT for handle on engine_device(): on a GPU its blocks within the loader's gpu_budget_gb (placed at
    load for the family's default pass: place_dit, or by load itself when it places (places: a load that reads its
    blocks as it places them)), and fitted for a pass over `rows` rows (the default pass's when None; blocks ComfyUI
    took back return while there is room). check(model) runs first (check_request: a pass that cannot fit is refused
    before any block moves)."""
    device = engine_device()
    place = (lambda model, where: model) if places else \
        (lambda model, where: place_dit(model, where, handle.gpu_budget_gb, pass_size.default_rows))
    dit = on_device("dit", handle, load, place=place)
    if check is not None:
        check(dit)
    fit_blocks(dit, device, handle.gpu_budget_gb, pass_size.default_rows if rows is None else rows)
    return dit


RANK0_LEAVES = 4 * GIB  # of rank 0's GPU, for ComfyUI's process: decodes, a text encoder's activations


def ranked_dit(handle, load: Callable, recipe: type, pass_size: PassSize, check: Callable[[object], None] | None = None,
               wrap: Callable[[RankedModel], object] | None = None):
    """LOADED's DiT for handle in handle.gpus ranks (dit_core/parallel RankedModel: on a CUDA GPU one process a GPU,
    each placing its copy of load(path) within the loader's gpu_budget_gb; else host processes), wrap(it) what the
    slot keeps (a family's pair of models). The first GPU is rank 0's and this process's: ComfyUI's models there make
    room for the file first, and rank 0's automatic budget leaves ComfyUI's reserve and RANK0_LEAVES for this
    process's work (a rank's blocks cannot be given back block by block: freeing memory there drops the ranks).
    Cancel honoured while the ranks load; check(model) as dit_on_device's."""
    device = engine_device()

    def start():
        keep_free = 0
        if device.type == "cuda":
            make_room(device, os.path.getsize(handle.path))
            keep_free = int(comfy.model_management.extra_reserved_memory()) + RANK0_LEAVES
        model = RankedModel.start(handle.gpus, load, handle.path, recipe, device, handle.gpu_budget_gb,
                                  pass_size.default_rows,
                                  check=comfy.model_management.throw_exception_if_processing_interrupted,
                                  keep_free=keep_free)
        return model if wrap is None else wrap(model)

    dit = LOADED.get("dit", (*handle.key(), str(device)), start, device)
    if check is not None:
        check(dit)
    return dit


class RequestTooLarge(Exception):
    """A sampler's request that cannot run in the memory there is (nodes/base.checked names latent_image)."""


SLOW_STEP_S = 20.0  # a step estimated longer than this on the CPU is said in the log


def check_request(model, pass_size: PassSize, image_rows: int, text_rows: int, steps: int, passes: int = 1,
                  say: Callable[[str], None] | None = None) -> None:
    """Before any work: a pass over image_rows + text_rows rows that cannot fit in the memory it would run in (the
    card less ComfyUI's reserve and what of the model never streams; on the CPU the host's available memory) raises
    RequestTooLarge with what it needs and the largest image that fits (megapixels: image rows times the family's
    pass_size.image_row_pixels). On the CPU, a request that fits but will take long is said in the log and to
    say(text) (the sampler shows it on its node), with the time this machine's matrix products give it."""
    a, device, rows, where_now = model.arch, engine_device(), image_rows + text_rows, placement(model)
    world = where_now.ranks  # ranks (the loader's gpus) each hold their share of the rows
    if device.type == "cuda":
        blocks, on_card = getattr(model, "blocks", None), where_now.device
        streamed = isinstance(blocks, StreamedBlocks)
        never_streamed = on_card - blocks.device_bytes() if streamed else on_card
        slots = blocks.slot_count * blocks.slot_bytes if streamed else 0  # where streamed blocks run
        available = card_bytes(device) - never_streamed - slots - int(comfy.model_management.extra_reserved_memory())
        need, where = (lambda r: pass_bytes(a, -(-r // world))), "GPU"
    else:
        available = comfy.model_management.get_free_memory(device)
        need, where = (lambda r: host_pass_bytes(a, -(-r // world))), "host"
    if need(rows) > available:
        row_pixels = pass_size.image_row_pixels
        fit = 0  # the most image rows whose pass fits (need grows with rows)
        hi = image_rows
        while fit < hi:
            mid = (fit + hi + 1) // 2
            fit, hi = (mid, hi) if need(mid + text_rows) <= available else (fit, mid - 1)
        if pass_size.video:  # its megapixels are summed over the latent frames: no one image size to name
            raise RequestTooLarge(
                f"{image_rows * row_pixels / 1e6:.1f} megapixels of video (width x height over its latent frames) "
                f"need about {need(rows) / GIB:.1f} GiB of {where} memory for a pass and {max(available, 0) / GIB:.1f}"
                f" GiB is there for it; about {fit / max(image_rows, 1):.0%} of it fits: use a smaller width and "
                f"height or fewer frames")
        side = int((fit * row_pixels) ** 0.5) // 64 * 64
        raise RequestTooLarge(
            f"{image_rows * row_pixels / 1e6:.1f} megapixels need about {need(rows) / GIB:.1f} GiB of {where} "
            f"memory for a pass and {max(available, 0) / GIB:.1f} GiB is there for it; the largest image that fits "
            f"is about {fit * row_pixels / 1e6:.2f} megapixels ({side}x{side} at 1:1): use a smaller size")
    if device.type == "cpu":
        seconds = passes * step_flops(a, rows, a.layers + a.refiner) / host_flops_per_s()
        if seconds > SLOW_STEP_S:
            text = (f"on the CPU: about {seconds:.0f} s a step, {seconds * steps / 60:.1f} min for {steps} steps (a "
                    f"GPU takes a fraction of that)")
            log.warning("SwiftDiT: %s", text)
            if say is not None:
                say(text)


@functools.cache
def card_bytes(device: torch.device) -> int:
    """The card's memory, as model_management.get_total_memory gives it, read once: that asks the driver and the
    allocator each time (a sampler's check before every prompt, the GPU idle meanwhile)."""
    return torch.cuda.get_device_properties(device).total_memory


@functools.cache
def host_flops_per_s() -> float:
    """This machine's f32 matrix-product rate, measured once a process (a 1024^3 product, the best of three)."""
    x, best = torch.randn(1024, 1024), math.inf
    for _ in range(3):
        start = time.perf_counter()
        x @ x
        best = min(best, time.perf_counter() - start)
    return 2 * 1024 ** 3 / best
