"""What every family's nodes share: model handles, file lookup, errors, progress, cancel, schema pieces (the
loaded-model cache, its memory and the engine's device: nodes/memory.py)."""
from __future__ import annotations

import contextvars
import functools
import logging
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import comfy.model_management
import comfy.utils
import folder_paths
import torch
from comfy_api.latest import io

from ..dit_core.sampling.ksampler import SamplingCancelled
from ..dit_core.gpu.builds import AheadBuilds
from ..dit_core.gpu.streaming import BudgetError
from ..dit_core.parallel import RankFailed, RanksDoNotFit
from ..dit_core.weights import Checkpoint, WeightsError
from .family_settings import PassSize, Schedule
from .memory import (LOADED, MAIN, RequestTooLarge, dit_on_device, engine_device, file_key, fits_on_card, place_dit,
                     ranked_dit, room_for)
from .model_bytes import GIB, describe
from .queued_builds import QUEUED, beside_dit_load, build_key, stand_in_builds_here
from .types import DiTModel, Vae

log = logging.getLogger("SwiftDiT")

# ComfyUI ships Qwen's tokenizer files with its text encoders (comfy/text_encoders/z_image.py uses them); Qwen3
# and Qwen3-VL share that vocabulary.
TOKENIZER_DIR = Path(comfy.model_management.__file__).parent / "text_encoders" / "qwen25_tokenizer"
LINEAR_MODES = {"as stored": "stored", "int8 convrot": "int8", "bf16": "bf16"}
WEIGHT_DTYPES = ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]
GPU_CHOICES = ["1", "2", "4", "8", "all"]


class SwiftDiTError(Exception):
    """A user-facing error, shown on the node: names the node, the input and the fix."""


@contextmanager
def checked(node_id: str, input_name: str):
    """Turns the engine's errors about an input into one message naming the node and that input. Running out of
    GPU memory stays torch's OutOfMemoryError, so that ComfyUI still frees its models and shows its hint; the
    message says which node and what to change."""
    try:
        yield
    except RequestTooLarge as e:  # the image's size is what to change, whichever step found it too large
        raise SwiftDiTError(f"{node_id} · latent_image: {e}") from e
    except RankFailed as e:  # every rank was stopped, and the model goes: the next run starts its ranks afresh
        raise SwiftDiTError(f"{node_id} · {input_name}: {e}; the other ranks were stopped (run again to start them "
                            f"afresh, or set the loader's gpus to 1)") from e
    except (WeightsError, ValueError, FileNotFoundError) as e:
        raise SwiftDiTError(f"{node_id} · {input_name}: {e}") from e
    except torch.cuda.OutOfMemoryError as e:
        raise torch.cuda.OutOfMemoryError(
            f"{node_id} · {input_name}: out of GPU memory ({str(e).splitlines()[0] if str(e) else 'no detail'}); "
            f"use a smaller image or batch, or a lower gpu_budget_gb on the loader (more blocks stream from host "
            f"memory, leaving room for the pass)") from e


def finite(node_id: str, input_name: str, value, low: float | None = None, high: float | None = None) -> float:
    """A float widget's value where it enters the node: a finite number within [low, high], else an error naming the
    node and the widget (NaN passes ComfyUI's own min/max checks)."""
    value = float(value)
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        bounds = "" if low is None and high is None else \
            f" in [{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
        raise SwiftDiTError(f"{node_id} · {input_name}: must be a finite number{bounds}, got {value}")
    return value


def positive_shift(node_id: str, shift) -> float:
    """A ModelSampling node's shift: finite and above 0 (a flow schedule at shift 0 is all zeros)."""
    value = finite(node_id, "shift", shift)
    if value <= 0:
        raise SwiftDiTError(f"{node_id} · shift: must be greater than 0, got {value}")
    return value


def sampler_widgets(node_id: str, cfg, denoise, sampler_name: str, samplers, scheduler: str, schedulers) -> None:
    """KSampler's widgets checked before any work, each error naming its widget: cfg and denoise finite (denoise in
    [0, 1]), a sampler and a scheduler this sampler has."""
    finite(node_id, "cfg", cfg, 0.0)
    finite(node_id, "denoise", denoise, 0.0, 1.0)
    for name, value, allowed in (("sampler_name", sampler_name, samplers), ("scheduler", scheduler, schedulers)):
        if value not in allowed:
            raise SwiftDiTError(f"{node_id} · {name}: {value!r} is not supported here; use one of "
                                f"{', '.join(allowed)}")


def not_listed(folder: str, name: str) -> str | None:
    """Why `name` cannot be read from ComfyUI's folder list `folder` (None when it is listed): names outside those
    folders are refused."""
    if name in folder_paths.get_filename_list(folder):
        return None
    return f"'{name}' is not in ComfyUI's models/{folder} folders; put the file there and refresh"


def file_checked(node_cls, folder: str, name: str, input_name: str) -> bool | str:
    """A loader's validate_inputs: ComfyUI v0.3.75 checks no V3 combo against its list before a run, so each loader
    does, and a graph with several missing files is refused at once, each named with its node's display name."""
    why = not_listed(folder, name)
    return True if why is None else f"{node_cls.DISPLAY} · {input_name}: {why}"


def model_file(node_id: str, folder: str, name: str, input_name: str) -> str:
    """The full path of `name` from ComfyUI's folder list `folder`; names outside those folders are refused."""
    why = not_listed(folder, name)
    if why is not None:
        raise SwiftDiTError(f"{node_id} · {input_name}: {why}")
    return folder_paths.get_full_path_or_raise(folder, name)


# Whether the node running now is a loader (loading_shown): its file reads show a progress bar. A sampler or encode
# node that loads a model again (ComfyUI took the memory back) shows only its own steps, as stock ones do.
_LOADER_RUNNING = contextvars.ContextVar("swiftdit_loader_running", default=False)


@contextmanager
def loading_shown():
    """Within it (a loader node's load), the files read show ComfyUI progress (cancellable)."""
    token = _LOADER_RUNNING.set(True)
    try:
        yield
    finally:
        _LOADER_RUNNING.reset(token)


def cancellable(load: Callable[[Checkpoint], object], path: str):
    """load(the file at path as a Checkpoint), Cancel honoured as each tensor is read (ComfyUI's interrupt check), and
    in a loader node (loading_shown) a ComfyUI progress bar over the file's bytes (a 33 B model takes a while); the
    hooks and the file's memory map go with the load, not with the model that keeps the file (Checkpoint.release)."""
    checkpoint = Checkpoint(path)
    checkpoint.check = interrupt_check
    if _LOADER_RUNNING.get():
        checkpoint.read = read_progress(checkpoint.total_bytes())
    try:
        return load(checkpoint)
    finally:
        checkpoint.check = checkpoint.read = None
        checkpoint.release()


def read_progress(total_bytes: int) -> Callable[[int], None]:
    """A ComfyUI progress bar over total_bytes in percent: read(nbytes) after each tensor, the bar moved when a percent
    more is read (a file of thousands of tensors sends a hundred updates, not thousands)."""
    bar, done, shown = comfy.utils.ProgressBar(100), 0, -1

    def read(nbytes: int) -> None:
        nonlocal done, shown
        done += nbytes
        percent = min(100, done * 100 // max(total_bytes, 1))
        if percent > shown:
            shown = percent
            bar.update_absolute(percent, 100)
    return read


def dit_loader(engine, pass_size: PassSize) -> Callable:
    """A family's load_dit(handle, rows, check): engine.load of the loader's file with its linears and LoRAs, Cancel
    honoured, where ComfyUI computes (memory.dit_on_device: on a CUDA device its blocks run through kernels/ within
    the loader's GPU budget, fitted for a pass over `rows` rows, the family's default pass (pass_size) when None;
    elsewhere the float32 host path), or in handle.gpus ranks (memory.ranked_dit). On a GPU the load's quantizations
    and LoRA merges run there (seconds where a CPU takes minutes; the linears come back to the host as the file is
    read). check(model): memory.check_request's refusal, before any block moves."""
    def load_dit(handle: ModelHandle, rows: int | None = None, check=None):
        device = engine_device()
        on_gpu = device.type == "cuda"
        if handle.gpus > 1:  # each rank on its own GPU ("cuda": a rank's current device)
            return ranked_dit(handle, functools.partial(engine.load, linears=handle.linears, loras=handle.loras,
                                                        compute_on=torch.device("cuda") if on_gpu else None,
                                                        blocks_on_use=on_gpu),
                              engine, pass_size, check)
        # On a GPU the blocks are read as they are placed (blocks_on_use: no host copy of the model), within the
        # file's Cancel and progress.
        load = lambda f: place_dit(engine.load(f, handle.linears, handle.loras,  # noqa: E731
                                               compute_on=device if on_gpu else None, blocks_on_use=on_gpu),
                                   device, handle.gpu_budget_gb, pass_size.default_rows)
        beside = []

        def load_file():
            # The first step's kernels build beside the load (or since the prompt was queued: queued_builds), from a
            # stand-in of one block a stack, where the recipe has a dry pass and the card has room for it with the
            # model and its pass.
            queued = QUEUED.take(build_key(handle.path, handle.linears)) if on_gpu else None
            if queued is not None:
                beside.append(queued)
            elif stand_in_builds_here(engine, handle.path, device):
                beside.append(beside_dit_load(engine, handle.path, handle.linears, device))
            return cancellable(load, handle.path)
        dit = dit_on_device(handle, load_file, pass_size, rows, check, places=True)
        if beside:
            ahead_builds("dit").beside = beside[0]
        return dit
    return load_dit


def ahead_builds(model_kind: str) -> AheadBuilds:
    """The loaded model's AheadBuilds (a LOADED companion: made on first use, dropped with the model)."""
    return LOADED.attached(model_kind, "builds", lambda: AheadBuilds(
        cancels=(comfy.model_management.InterruptProcessingException,)))


LAYER_KEY = re.compile(r"\.layers\.(\d+)\.")  # a text model's decoder layer (not a vision tower's blocks)


def room_before(path: str | Checkpoint, device: torch.device, int8_kept: bool = False,
                streams: bool = False) -> bool:
    """memory.room_for the file's tensors loaded in BF16 (an INT8 file's linears double, an NVFP4 file's quadruple:
    two codes a byte), or with its INT8 codes kept as stored (int8_kept: the INT8 path), before they load onto
    device. A model larger than the card itself (less ComfyUI's reserve) streams its decoder layers where the
    loader can (streams; room then for the rest and the largest layer: returns True), else is refused first,
    saying so (ValueError: the loader names itself and its input), rather than failing out of memory half loaded."""
    if device.type != "cuda":
        return False
    ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
    per_byte = {torch.int8: 1 if int8_kept else 2, torch.uint8: 2 if int8_kept else 4}
    on_card, host, layers = 0, 0, defaultdict(int)  # host: float32 on the host, the refusal's fix
    for k in ckpt.keys():
        elements, dtype = math.prod(ckpt.shape(k)), ckpt.dtype(k)
        nbytes = elements * per_byte.get(dtype, 2)
        on_card += nbytes
        host += elements * (8 if dtype == torch.uint8 else 4)
        layer = LAYER_KEY.search(k)
        if layer:
            layers[int(layer.group(1))] += nbytes
    card = comfy.model_management.get_total_memory(device) - comfy.model_management.extra_reserved_memory()
    streamed = on_card - sum(layers.values()) + max(layers.values(), default=0)
    if on_card <= card or (streams and streamed <= card):
        room_for(device, on_card if on_card <= card else streamed)
        return on_card > card
    raise ValueError(f"{ckpt.path.name} takes about {(streamed if streams else on_card) / GIB:.1f} GiB on the card"
                     f"{' with its layers streamed' if streams else ''}, more than this card's {card / GIB:.1f} GiB "
                     f"(less ComfyUI's reserve); set the loader's device to cpu to run it on the host in float32 "
                     f"(about {host / GIB:.0f} GiB of RAM), or use a smaller file")


def text_encoder_loader(encoder, family: str, int8_kept: bool = False) -> Callable:
    """A family's load_text_encoder(handle): encoder.load of the loader's file with ComfyUI's Qwen tokenizer, Cancel
    honoured, kept in LOADED per file, device and family (a file two families read differently) in the loader's
    role. On a CUDA GPU in BF16, each tensor read straight to the card (the DiT's room takes it back when short:
    memory.make_room), its INT8 ConvRot linears dequantized there, or with int8_kept kept INT8 on the INT8 kernels
    (the file's precision: half the memory, slower at a 4B encoder's launch-bound prompts, so only H3's 32B keeps
    them); an encoder larger than the card loads on the host and streams its layers to the card
    (dit_core/gpu/text_streaming.py). Elsewhere the float32 host reference."""
    def load_text_encoder(handle: FileHandle):
        device = torch.device("cpu") if handle.device == "cpu" else engine_device()
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

        def load(f):
            if not room_before(f, device, int8_kept, streams=True):
                return encoder.load(f, TOKENIZER_DIR, dtype=dtype, device=device,
                                    int8_linears=int8_kept and device.type == "cuda")
            from ..dit_core.gpu.text_streaming import stream_layers
            loaded = encoder.load(f, TOKENIZER_DIR, dtype=dtype, device=torch.device("cpu"), int8_linears=int8_kept,
                                  convert_on=device)
            slot = stream_layers(loaded.text_model, device)
            vision = getattr(loaded, "vision", None)  # H3's and Krea 2's towers, beside their text model
            if vision is not None:
                vision.to(device)
            log.info("SwiftDiT: %s is larger than the card: its layers stream from host memory (%.2f GiB a layer "
                     "on the card)", f.path.name, slot / GIB)
            return loaded
        loaded = LOADED.get("text", (*handle.key(), str(device), family), lambda: cancellable(load, handle.path),
                            device, handle.role)
        if device.type == "cuda":  # its replayed encodes' graphs go before it moves or goes (TextEncoder.clear)
            LOADED.attached("text", "graphs", lambda: loaded, handle.role)
        return loaded
    return load_text_encoder


@dataclass(frozen=True)
class ModelHandle:
    """What travels on a SWIFTDIT_MODEL wire: which model to run and how, not the weights themselves.
    The sampler fetches the weights from LOADED, so a LoRA or shift node never copies a model."""
    family: str
    path: str
    linears: str
    loras: tuple[tuple[str, float], ...] = ()
    schedule: Schedule | None = None  # the sampling schedule's shift and its kind: the family's loader sets it
    gpu_budget_gb: float = 0.0  # the loader's budget for the blocks on a GPU (0: automatic); not in the key:
    # a new budget re-plans the loaded model (memory.fit_blocks) without reading the file again
    gpus: int = 1  # ranks the model runs in (the loader's gpus: sequence parallel over that many GPUs)

    @property
    def shift(self) -> float | None:
        """The schedule's shift, a number whose meaning schedule.kind gives."""
        return None if self.schedule is None else self.schedule.shift

    def key(self) -> tuple:
        return (self.family, file_key(self.path), self.linears,
                tuple((file_key(p), s) for p, s in self.loras), self.gpus)

    def with_(self, **changes) -> ModelHandle:
        return replace(self, **changes)


@dataclass(frozen=True)
class FileHandle:
    """What travels on a SWIFTDIT_TEXT_ENCODER or SWIFTDIT_VAE wire: a file, its kind and its role (which of the
    family's models of that kind: its slot in LOADED with the kind, so e.g. an audio VAE stays beside a video VAE)."""
    kind: str
    path: str
    role: str = MAIN
    device: str = "default"  # a text encoder loader's `device` widget: "cpu" keeps it on the host, as stock's

    def key(self) -> tuple:
        return (self.kind, file_key(self.path))


def show_on_node(node_cls, text: str) -> None:
    """text on the node that runs (a V3 node class with the hidden unique_id, as ComfyUI's executor prepares it) in
    ComfyUI's editor: its progress text, as the stock GetImageSize shows a size. Nothing outside a running server
    (the module `server` is ComfyUI's, imported by its main.py) or for a node called directly."""
    prompt_server = getattr(getattr(sys.modules.get("server"), "PromptServer", None), "instance", None)
    node_id = getattr(node_cls.hidden, "unique_id", None)
    if prompt_server is not None and node_id is not None:
        prompt_server.send_progress_text(text, node_id)


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


def build_ahead_of_sampling(model_kind: str, key, sampling: Callable[[], tuple[Callable, int] | None],
                            say: Callable[[str], None] = lambda text: None) -> None:
    """Where the engine runs on a GPU: the first step of a fresh sampling() run once with its Triton kernels held back
    and then built side by side (dit_core/gpu/builds.py), once per key (the request's shapes) for the loaded model;
    then the model's companions are cleared, since that step's rows, kept or captured, are garbage. say(text): what
    the node shows meanwhile."""
    device = engine_device()
    if device.type != "cuda":
        return
    builds = ahead_builds(model_kind)

    ran = []

    def first_step():
        ran.append(True)
        say("building the GPU kernels for this size (once)")
        run = sampling()
        if run is None:
            return
        stepped = []
        try:
            run[0](lambda *_: stepped.append(True), lambda: bool(stepped))
        except SamplingCancelled:
            pass

    try:
        builds.once(key, first_step, device)
    finally:  # also after a Cancel within it
        if ran:
            LOADED.clear_companions(model_kind)


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


# --- schema pieces and steps that every family's nodes share ------------------------------------------------

def loader_inputs(family: str) -> list:
    """UNETLoader's widgets (unet_name, weight_dtype), then ours (linears, gpu_budget_gb)."""
    return [io.Combo.Input("unet_name", options=folder_paths.get_filename_list("diffusion_models"),
                           tooltip=f"A {family} file from models/diffusion_models"),
            io.Combo.Input("weight_dtype", options=WEIGHT_DTYPES, default="default",
                           tooltip="Kept for workflow compatibility: fp8 values quantize at load to INT8 ConvRot"),
            io.Combo.Input("linears", options=list(LINEAR_MODES), default="as stored",
                           tooltip="How the linears run: the file's own format, INT8 ConvRot, or BF16"),
            io.Float.Input("gpu_budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                           tooltip="GPU memory the model's blocks may take, in GB; the others stream from "
                                   "host memory. 0: automatic (the free memory less what a pass needs)")]


def gpus_input():
    """The video families' loaders' gpus widget (optional: workflows saved before it keep loading)."""
    return io.Combo.Input("gpus", options=GPU_CHOICES, default="1", optional=True,
                          tooltip="GPUs that share each step (sequence parallel: a process a GPU, the rows split "
                                  "between them); all: every GPU ComfyUI sees. Without a GPU, that many host "
                                  "processes")


def rank_count(node_id: str, gpus: str) -> int:
    """The gpus widget as a number of ranks: GPUs where ComfyUI computes on one (at most those it sees), else host
    processes (at most the cores; all: one)."""
    if gpus not in GPU_CHOICES:
        raise SwiftDiTError(f"{node_id} · gpus: {gpus!r} is not one of {', '.join(GPU_CHOICES)}")
    on_gpu = engine_device().type == "cuda"
    have = torch.cuda.device_count() if on_gpu else os.cpu_count() or 1
    n = (have if on_gpu else 1) if gpus == "all" else int(gpus)
    if n > have:
        what = "GPUs (CUDA_VISIBLE_DEVICES and --cuda-device decide which)" if on_gpu else "CPU cores and no GPU"
        raise SwiftDiTError(f"{node_id} · gpus: {n} asked, and ComfyUI sees {have} {what}; set gpus to {have} or "
                            f"fewer")
    if on_gpu and n > 1 and not torch.distributed.is_nccl_available():
        raise SwiftDiTError(f"{node_id} · gpus: the GPUs share a step through NCCL, which this PyTorch lacks (its "
                            f"Windows builds do); set gpus to 1")
    return n


def linear_mode(node_id: str, weight_dtype: str, linears: str) -> str:
    """The engine's linears mode for the loader's widgets: fp8 weight_dtype means quantize at load."""
    if linears not in LINEAR_MODES:
        raise SwiftDiTError(f"{node_id} · linears: {linears!r} is not one of {', '.join(LINEAR_MODES)}")
    mode = LINEAR_MODES[linears]
    return "int8" if weight_dtype.startswith("fp8") and mode == "stored" else mode


def load_model(node_id: str, handle: ModelHandle, load: Callable[[ModelHandle], object]) -> str:
    """A loader's step: handle's model loaded (errors name unet_name, or gpu_budget_gb when the blocks cannot
    stream within it), and where its bytes are: the loader's text output (the log has it at load too)."""
    try:
        with loading_shown():
            model = load(handle)
    except BudgetError as e:
        raise SwiftDiTError(f"{node_id} · gpu_budget_gb: {e}") from e
    except RanksDoNotFit as e:
        raise SwiftDiTError(f"{node_id} · gpus: {e}") from e
    except (WeightsError, ValueError, FileNotFoundError, RankFailed) as e:
        raise SwiftDiTError(f"{node_id} · unet_name: {e}") from e
    return f"{os.path.basename(handle.path)}: {describe(model, engine_device())}"


def check_family(node_id: str, model: ModelHandle, family: str, loader: str) -> None:
    if model.family != family:
        raise SwiftDiTError(f"{node_id} · model: a {model.family} model; connect a {loader}")


def text_conditioning(rows: torch.Tensor) -> list:
    """Stock CLIPTextEncode's entry for a Qwen text model: rows [1, L, width] on ComfyUI's intermediate device (the
    CPU by default, where stock text encoders leave theirs), no pooled output, an all-ones attention mask (every row
    is attended)."""
    rows = rows.to(comfy.model_management.intermediate_device())
    return [[rows, {"pooled_output": None, "attention_mask": torch.ones(rows.shape[:2], dtype=torch.long)}]]


def ksampler_inputs(model_input, steps: int, samplers: list[str], sampler: str, schedulers: list[str],
                    scheduler: str) -> list:
    """KSampler's inputs in KSampler's order, with a family's defaults and the choices its sampler has."""
    return [model_input,
            io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                         tooltip="The noise's seed: the same seed gives stock KSampler's image"),
            io.Int.Input("steps", default=steps, min=1, max=10000, tooltip="Denoising steps"),
            io.Float.Input("cfg", default=1.0, min=0.0, max=100.0, step=0.1, round=0.01,
                           tooltip="Classifier-free guidance scale; 1 runs the positive prompt alone (one pass a "
                                   "step)"),
            io.Combo.Input("sampler_name", options=samplers, default=sampler, tooltip="The sampling method"),
            io.Combo.Input("scheduler", options=schedulers, default=scheduler,
                           tooltip="How the noise levels are spaced over the steps"),
            io.Conditioning.Input("positive", tooltip="The prompt's conditioning, from the Text Encode node"),
            io.Conditioning.Input("negative", tooltip="What to steer away from (ConditioningZeroOut at cfg 1)"),
            io.Latent.Input("latent_image", tooltip="The latent to denoise: an empty latent for text to image"),
            io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01,
                           tooltip="How much of the latent is renoised: 1 for text to image")]


def model_input(family: str):
    return DiTModel.Input("model", tooltip=f"The {family} model from its loader (or a LoRA or ModelSampling node)")


def model_output(family: str):
    return DiTModel.Output(tooltip=f"The {family} model, for a LoRA or ModelSampling node or the KSampler (SwiftDiT)")


def decode_schema(family: str) -> dict:
    """A VAE decode node's inputs and output."""
    return {"inputs": [io.Latent.Input("samples", tooltip="The latent from the KSampler"),
                       Vae.Input("vae", tooltip=f"The {family} VAE, from its VAE Loader")],
            "outputs": [io.Image.Output(tooltip="The decoded image")]}


def decode_image(node_id: str, decoder, samples: dict) -> torch.Tensor:
    """A VAE decode with a ComfyUI progress bar over its tiles and Cancel honoured within them (after each of the
    decoder's blocks); the decoder's errors name the samples input."""
    bar = comfy.utils.ProgressBar(1)
    latents = samples["samples"].float()
    decode = lambda **tiles: decoder.decode(latents, check=interrupt_check, **tiles,  # noqa: E731
                                            progress=lambda done, total: bar.update_absolute(done, total))
    with checked(node_id, "samples"):
        # In one piece where the card has room for it, as stock VAEDecode does (tiles repeat their overlaps' work);
        # in tiles where the estimate fell short, as stock falls back too.
        if hasattr(decoder, "whole_bytes") and fits_on_card(decoder.whole_bytes(latents)):
            try:
                return decode(tile=None)
            except torch.OutOfMemoryError:
                comfy.model_management.soft_empty_cache()
        return decode()
