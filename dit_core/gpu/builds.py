"""The Triton kernels of a step built side by side before it first runs, instead of one after another as it reaches
each launch (a first Z-Image prompt on a new machine spent about 18 s there, serially).

A dry run of the step finds them: every launch of a kernel not yet built is held back (Triton's jit_cache_hook
answers that the build is handled, so nothing compiles or runs) and its specialization recorded; the step's values
are garbage and dropped, and the kernels already built run on them harmlessly. The recorded kernels are then built
by Triton's AsyncCompileMode on a thread pool into the kernel caches the real step launches from (their modules
loaded and launchers made on the same threads, which a first launch would otherwise do one by one), and into
Triton's on-disk cache, so a restart of the same machine builds nothing. ptxas runs outside the GIL; how much of
the compiler's front end overlaps on threads is bench/bench_first_step.py's question, and `processes=True` builds
the kernels in worker processes instead (kernels/process_builds.py), filling Triton's on-disk cache, from which this
process then loads them.

Only where every INT8 tile is fixed (Hopper): elsewhere the INT8 linears autotune on first use, and an autotuner
timing held-back launches would keep a wrong tile."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .block import kernels

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Built:
    """What build_ahead did: kernels built, seconds (dry run and builds), threads, why nothing was built when it
    could not run here, the error that stopped the dry step early (its kernels up to there were built), the built
    kernels' names, and the last one ready with its seconds from the start (what bounds a build on many threads);
    specialized: each built kernel's name with its specialization (_specialized: what a build missed differs there)."""
    kernels: int
    seconds: float
    threads: int = 0
    refused: str | None = None
    stopped: str | None = None
    names: tuple[str, ...] = ()
    last: str = ""
    specialized: tuple[str, ...] = ()


def not_built_here(device: torch.device) -> str | None:
    """Why kernels are not built ahead on device (None where they are: a GPU whose INT8 tiles are fixed)."""
    if device.type != "cuda" or not kernels().fixed_tiles_here(device):
        return "not a GPU whose INT8 tiles are fixed (Hopper)"
    return None


def build_ahead(step: Callable[[], object], device: torch.device, threads: int | None = None,
                cancels: tuple[type[BaseException], ...] = (), processes: bool = False) -> Built:
    """step()'s Triton kernels built at once on `threads` threads or worker processes (default: the machine's cores,
    at most 16), before step runs for real; step must depend on nothing but its shapes to run (its outputs are
    garbage). An error of the step is kept in `stopped`, except `cancels` (e.g. ComfyUI's interrupt), which are
    raised."""
    t0 = time.perf_counter()
    if (refused := not_built_here(device)) is not None:
        return Built(0, 0.0, refused=refused)
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError as e:
        return Built(0, 0.0, refused=f"this Triton cannot: {e}")
    held: dict[tuple, tuple] = {}
    stopped = None
    try:
        with HOLDS.holding(held), torch.no_grad():
            step()
            torch.cuda.synchronize(device)
    except cancels:
        raise
    except Exception as e:  # noqa: BLE001 - garbage values may trip a check of the step's own
        stopped = f"{type(e).__name__}: {e}"
    if not held:
        return Built(0, time.perf_counter() - t0, stopped=stopped)
    threads = max(1, min(len(held), threads or min(os.cpu_count() or 1, 16)))
    if processes:
        kernels().build_in_processes(list(held.values()), threads)
    # ignore_errors: a kernel this Triton cannot build is left unbuilt; its launch builds it again and reports
    # the error where the kernel's caller falls back (kernels/gluon_builds.py).
    with ThreadPoolExecutor(threads, thread_name_prefix="swiftdit-build") as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            built = [jit_function.preload(specialization) for jit_function, specialization in held.values()]
        # A kernel's first launch also loads its module and makes its launcher (a C launcher compiled for its
        # signature, in the Triton releases that have one): on the threads too, rather than one by one in the step.
        index = torch.cuda.current_device() if device.index is None else device.index  # (this thread's)
        ready = list(pool.map(lambda kernel: _loaded(kernel, index, t0), built))
    names = [name for _, name, _ in held]
    last = max(range(len(names)), key=ready.__getitem__)
    return Built(len(held), time.perf_counter() - t0, threads, stopped=stopped, names=tuple(sorted(names)),
                 last=f"{names[last]} at {ready[last]:.2f} s",
                 specialized=tuple(sorted(_specialized(data) for _, data in held.values())))


def _specialized(data: str) -> str:
    """A kernel's name, constexpr values, arguments Triton took as multiples of 16 and descriptors' types from its
    specialization data (Triton's JSON), else the data's first 400 characters."""
    try:
        spec = json.loads(data)
        names = list(spec["signature"])
        constexprs = ", ".join(f"{names[k[0]]}={v}" for k, v in zip(spec["constant_keys"], spec["constant_vals"])
                               if len(k) == 1 and spec["signature"][names[k[0]]] == "constexpr")
        aligned = " ".join(names[k[0]] for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])
                           if len(k) == 1 and any(a[0] == "tt.divisibility" for a in v))
        descriptors = " ".join(f"{n}:{t}" for n, t in spec["signature"].items() if str(t).startswith("tensordesc"))
        return f"{spec['name'].rsplit(':', 1)[-1]}({constexprs}; multiples of 16: {aligned}; {descriptors})"
    except (ValueError, KeyError, IndexError, TypeError):
        return data[:400]


SLOW_LAUNCH_S = 0.2  # a first launch that took this long built its kernel (a load from Triton's disk cache: less)


class Holds:
    """Triton's jit_cache_hook while any build_ahead runs, installed once: a launch from a thread whose dry step is
    running is held (its kernel and specialization recorded; "handled": nothing compiles or runs); every other
    thread's launch goes on as it would (to a hook installed before, if any). So a dry step on a thread of its own
    (a text encoder's stand-in while the file loads) leaves the loads and prompts beside it untouched. Such a
    launch (not a preload) that then builds its kernel (SLOW_LAUNCH_S or more until Triton's post-compile hook) is
    said in the log: a kernel the builds ahead missed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_thread: dict[int, dict[tuple, tuple]] = {}
        self.previous: Callable | None = None
        self.previous_post: Callable | None = None
        self.launching: dict[int, float] = {}  # thread -> when its launch's kernel began to build or load
        self.installed = False

    @contextmanager
    def holding(self, held: dict[tuple, tuple]):
        """Within, this thread's launches of kernels not yet built go into held (keyed by kernel and key)."""
        from triton import knobs
        with self.lock:
            if not self.installed:
                self.previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, self.hook
                if hasattr(knobs.runtime, "jit_post_compile_hook"):  # (Triton 3.4 on)
                    self.previous_post, knobs.runtime.jit_post_compile_hook = (
                        knobs.runtime.jit_post_compile_hook, self.post_compile)
                self.installed = True
            self.by_thread[threading.get_ident()] = held
        try:
            yield
        finally:
            with self.lock:
                del self.by_thread[threading.get_ident()]

    def hook(self, **launch) -> bool:
        held = self.by_thread.get(threading.get_ident())
        if held is None:
            if not launch.get("is_manual_warmup"):  # (a preload: build_ahead's own builds)
                self.launching[threading.get_ident()] = time.perf_counter()
            return bool(self.previous(**launch)) if self.previous is not None else False
        fn, compile = launch["fn"], launch["compile"]
        held.setdefault((fn.module, fn.name, str(launch["key"])), (fn.jit_function, compile["specialization_data"]))
        return True

    def post_compile(self, **launch) -> bool:
        began = self.launching.pop(threading.get_ident(), None)
        took = 0.0 if began is None else time.perf_counter() - began
        if took >= SLOW_LAUNCH_S:
            log.info("SwiftDiT: Triton built %s as it launched, in %.2f s (the builds ahead missed it): %s",
                     launch["fn"].name, took, str(launch.get("repr", ""))[:300])
        return bool(self.previous_post(**launch)) if self.previous_post is not None else False


HOLDS = Holds()  # one for the process: Triton has one hook


def _loaded(kernel, device: int, t0: float) -> float:
    """kernel's (preload's, maybe a future) module and launcher made now, on this thread; any failure is left for
    its launch, which makes them again and reports it there. The seconds from t0 when it was ready."""
    try:
        torch.cuda.set_device(device)  # the thread's current context: the one the step launches in
        kernel = kernel.result(ignore_errors=True) if hasattr(kernel, "result") else kernel
        if kernel is not None and hasattr(kernel, "_init_handles"):
            kernel._init_handles()
    except Exception:  # noqa: BLE001 - an optimization: the launch does it as before
        log.debug("build ahead: a kernel's module not loaded ahead", exc_info=True)
    return time.perf_counter() - t0


def on_own_thread(work: Callable[[], None], device: torch.device, name: str, failure: str) -> threading.Thread:
    """work() on a daemon thread of its own, started now, whose CUDA device and inference mode are the caller's (a
    new thread's are the first GPU and off: ComfyUI runs its nodes in inference mode, and the caller's tensors may
    be inference tensors). Such work is an optimization (what it leaves unbuilt builds where it is first launched):
    a failure is said in one line (`failure`, then the error), its traceback at debug level."""
    index = torch.cuda.current_device() if device.index is None else device.index
    inference = torch.is_inference_mode_enabled()

    def run() -> None:
        try:
            torch.cuda.set_device(index)
            with torch.inference_mode(inference):
                work()
        except Exception as e:  # noqa: BLE001 - see above; a bad file's error is its load's to tell
            log.info("SwiftDiT: %s (%s: %s)", failure, type(e).__name__, e)
            log.debug(failure, exc_info=True)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


# Free card memory a stand-in's load and dry pass ask for beyond its file (its block, a 1024x1024 pass, and room left
# so that the model's own placement beside it still finds all of its blocks a place).
STAND_IN_ROOM = 8 << 30


def built_beside(stand_in: Callable[[], object], dry_pass: Callable[[object], object],
                 device: torch.device) -> threading.Thread:
    """A thread, started, that makes stand_in() (a model of one block a stack, on device: its kernels are the whole
    model's) and builds what dry_pass(it) launches (build_ahead), while the model itself loads beside it: its
    launches are held for that thread alone (Holds); its Built is the thread's `built` once it has ended (None after
    a failure, which is logged and left for the first step)."""
    def build() -> None:
        threading.current_thread().built = None
        t0, model = time.perf_counter(), stand_in()
        built = threading.current_thread().built = build_ahead(lambda: dry_pass(model), device)
        if built.kernels:
            log.info("SwiftDiT: built %d Triton kernels beside the load in %.2f s (%d threads; the last ready: %s)%s",
                     built.kernels, time.perf_counter() - t0, built.threads, built.last,
                     f"; the dry step stopped early: {built.stopped}" if built.stopped else "")
    return on_own_thread(build, device, "swiftdit-dit-builds", "kernels not built beside the load")


@dataclass
class AheadBuilds:
    """build_ahead once per key (a step's input shapes) for a loaded model: later prompts of the same shapes find
    their kernels built and pay nothing. beside: built_beside's thread for this model, joined before the first."""
    threads: int | None = None
    cancels: tuple[type[BaseException], ...] = ()  # raised on (a Cancel); any other error leaves the step to build
    processes: bool = False
    done: dict[Hashable, Built] = field(default_factory=dict)
    beside: threading.Thread | None = None

    def clear(self) -> None:
        """Nothing to drop: built kernels stay valid wherever the model's memory goes (a LoadedModels companion)."""

    def once(self, key: Hashable, step: Callable[[], object], device: torch.device) -> Built | None:
        if key in self.done:
            return None
        beside, self.beside = self.beside, None
        if beside is not None:  # its kernels, not built twice
            beside.join()
        try:
            built = build_ahead(step, device, self.threads, self.cancels, self.processes)
        except self.cancels:
            raise
        except Exception as e:  # noqa: BLE001 - a build ahead is an optimization: the step builds as it runs
            built = Built(0, 0.0, refused=f"{type(e).__name__}: {e}")
        self.done[key] = built
        if built.kernels:
            log.info("SwiftDiT: built %d Triton kernels ahead of the first step in %.2f s (%d threads; the last ready: "
                     "%s)%s%s", built.kernels, built.seconds, built.threads, built.last,
                     f"; the dry step stopped early: {built.stopped}" if built.stopped else "",
                     f"; the stand-in's builds beside the load missed {'; '.join(built.specialized)}" if beside
                     else "")
        elif built.refused:
            log.info("SwiftDiT: kernels build as the first step runs (%s)", built.refused)
        return built
