"""A model step replayed as a CUDA graph: one capture per input shape (that call returns the eager warm-up's
output), then each call copies its inputs into the captured ones and replays.

Why: a Z-Image step at 1024x1024 launches about 1350 kernels (886 of them Triton) for 96.5 ms of GPU work; on a
host that launches slowly the GPU waits between them (the same kernels took a third longer on one machine than
on another). A replay launches the whole step at once.

What a step must be for this: a function of tensors only (a timestep too: ZImage.output_at takes t, not sigma),
with nothing in it that waits for the host or copies from it, every tensor it reads besides its inputs staying
where it is while the graph lives (weights resident, not streamed: a streamed block's slot is refilled between
steps), and every Triton kernel compiled and tuned before the capture (the first, eager call on a side stream does
that). A replay cannot be cancelled within the step: cancel is asked between steps.

Memory: the graphs of one GraphedStep (one per shape), and those of the GraphedSteps given one `pool`, share one
memory pool, so they hold one step's temporaries, not one set each. That is safe because they replay one at a time
on one stream and each call clones its outputs at once: a capture may reuse only memory that no kept tensor holds
(another graph's temporaries, dead once its replay has ended). Under cudaMallocAsync (ComfyUI's default) there
are no pools: the temporaries are graph memory nodes, whose physical memory the driver shares between graphs
replayed on one stream, and keeps after they go until asked (release_graph_memory).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import logging
import time
import weakref
from collections.abc import Callable, Hashable, Sequence

import torch

log = logging.getLogger("SwiftDiT")

MAX_SHAPES = 4  # graphs kept (their temporaries share a pool: about 0.6 GB for Z-Image at 1024x1024)
EAGER_CALLS = {"always": 0, "second": 1, "host_bound": 2}  # a shape's eager calls before its capture, by policy


_STREAMS: dict[tuple[torch.device, str], torch.cuda.Stream] = {}


def kept_stream(device: torch.device, purpose: str) -> torch.cuda.Stream:
    """One CUDA stream a device and purpose, made once and kept ("capture": every graph's warm-up and capture; a
    model's side streams): what kernels keep per stream (kernels/int8/arrival_counters.py) made in a warm-up is there
    again in the capture."""
    if (device, purpose) not in _STREAMS:
        _STREAMS[(device, purpose)] = torch.cuda.Stream(device=device)
    return _STREAMS[(device, purpose)]


def side_stream(x: torch.Tensor, purpose: str, concurrent: bool, shards=None) -> torch.cuda.Stream | None:
    """The kept stream of purpose for work beside the work on x's rows (concurrent: Options.concurrent_modes), or
    None: x not on CUDA, concurrent off, rows shared across ranks (each rank's collectives must keep one order), or
    within a capture under cudaMallocAsync (what a side stream frees after its join fails it: capture_refusal)."""
    if not (concurrent and x.is_cuda and shards is None) or (
            torch.cuda.is_current_stream_capturing() and async_allocator()):
        return None
    return kept_stream(x.device, purpose)


# Why captures stopped in this process: a capture failed under cudaMallocAsync, after which every later capture
# failed PyTorch's own assertion (the allocator's list of a capture's free streams left non-empty; an H100 server,
# 2026-12-05). Not a setting: the allocator's state, which nothing resets.
_ASYNC_CAPTURE_FAILED: list[str] = []
# What a failed capture under cudaMallocAsync made and still holds (its exception's frames, Triton's scratch), kept
# for good: freeing memory a capture made before its graph ever ran fails in a destructor (cudaErrorInvalidValue),
# which aborts the process. One step's temporaries, once a process; the frames also hold the model the step reads,
# so the log asks for a restart.
_KEPT_FROM_FAILED_CAPTURES: list = []


def capture_refusal() -> str | None:
    """Why a step cannot be captured in this process, or None. Under PyTorch's cudaMallocAsync allocator (ComfyUI
    turns it on unless started with --disable-cuda-malloc) a capture's temporaries are graph memory nodes: Triton's
    launcher is given addresses (addresses_for_triton), nothing allocated within a capture may outlive it, and no
    memory may be freed on a side stream after its last join (FLUX.3 Klein's capture that did so failed with
    "capturing stream has unjoined work", torch 2.11, and left the allocator unable to capture again)."""
    if _ASYNC_CAPTURE_FAILED:
        return (f"a capture failed under PyTorch's cudaMallocAsync allocator ({_ASYNC_CAPTURE_FAILED[0]}); start "
                "ComfyUI with --disable-cuda-malloc to replay each step from a CUDA graph")
    return None


def async_allocator() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_allocator_backend() == "cudaMallocAsync"


def _triton_launcher() -> type | None:
    """Triton's CUDA launcher class (every compiled kernel's `run`, Triton's and Gluon's), or None."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:
        return None
    return CudaLauncher if "__call__" in vars(CudaLauncher) else None


def _triton_scratch_allocator():
    """Triton's holder (get, set: a ContextVar, or in older releases an object of its own) of the allocator its
    launcher asks for a kernel's global scratch (device-side TMA descriptors: kernels/int8/tiles.py sets it), or
    None."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    return getattr(_allocation, "_allocator", None)


@contextlib.contextmanager
def addresses_for_triton():
    """Within: Triton's launcher (where it is the one this knows) is given each tensor argument's address instead of
    the tensor, and its global scratch as an address too (the buffers kept until the context ends: enter it within
    the capture, so they are freed there). It passes an int through as the pointer it is; a tensor it first looks
    up with the driver (cuPointerGetAttribute), which fails for a graph memory node's address during a capture under
    cudaMallocAsync. Every kernel was built and its arguments checked in the eager warm-up just before
    (GraphedStep._capture), on the same tensors."""
    launcher, scratch = _triton_launcher(), _triton_scratch_allocator()
    if launcher is None:
        yield
        return
    launch, kept = vars(launcher)["__call__"], []

    def call(self, *args, **kwargs):
        return launch(self, *(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args), **kwargs)

    allocate = scratch.get() if scratch is not None else None

    def by_address(size, align, stream):
        kept.append(allocate(size, align, stream))
        return kept[-1].data_ptr()
    launcher.__call__ = call
    if scratch is not None:
        scratch.set(by_address)
    try:
        yield
    except BaseException:
        _KEPT_FROM_FAILED_CAPTURES.append(kept)
        raise
    finally:
        launcher.__call__ = launch
        if scratch is not None:
            scratch.set(allocate)
    kept.clear()


@contextlib.contextmanager
def collector_confined():
    """Within: Python's collector runs only when called, on the objects made since entry. Yields that call.

    A capture must free within it the reference cycles its step made (above) and nothing made before it: under
    cudaMallocAsync, memory freed within a capture is freed at every replay. Objects made before are frozen (out
    of every collection) and automatic collections are off (another thread's allocations could start one) until
    exit. The call then scans the step's objects only: a full collection walks the whole process, 0.2 s at 450k
    objects (torch, transformers and diffusers imported; a ComfyUI server holds more), twice each capture before."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield gc.collect
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


class CaptureFailed(RuntimeError):
    """A step's capture failed after its eager warm-up ran: what failed is the graph (the cause: __cause__)."""


class GraphedStep:
    """step(*tensors) -> a tensor or a tuple of tensors, replayed from a CUDA graph captured at the first call of
    each input shape, where capture="second" at its second, or where capture="host_bound" at its third if its second
    ran host-bound (run eagerly where capture_refusal() says why not)."""

    def __init__(self, step: Callable[..., torch.Tensor], pool: tuple | None = None, capture: str = "always"):
        """pool: torch.cuda.graph_pool_handle() shared with other GraphedSteps replayed on the same stream (by
        default this step's own, made at its first capture). capture: "always"; "second": a shape's first call
        runs eagerly, its second captures (a text encoder's: a server's first prompt, encoded while the DiT's kernels
        built, took 0.94 s with its capture against 0.08-0.11 eager, Z-Image, H100); or "host_bound": a shape is
        captured only where a graph pays, i.e. where the host sets the eager step's pace at least at times (a graph
        saves the launches' host time and costs about a step's host time to capture at each new shape: Krea 2's new
        prompt lengths). Its first call runs eagerly (builds, plans and caches come then), its second is timed
        (timed_step, HOST_BOUND), and from its third it replays if that one was host-bound."""
        if capture not in EAGER_CALLS:
            raise ValueError(f"GraphedStep: capture is one of {', '.join(EAGER_CALLS)}, not {capture!r}")
        self.step, self.pool, self.capture = step, pool, capture
        self.refused = False  # capture_refusal() said so once (logged once a GraphedStep)
        # shape key -> (graph, its input tensors, its output), or None: that shape runs eagerly
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor] | None] = {}
        self.eager_calls: dict[tuple, int] = {}  # "second", "host_bound": calls so far of shapes not yet decided
        self.captured_on: set[torch.device] = set()  # the devices of the graphs captured since the last clear()

    def __call__(self, *inputs: torch.Tensor, **fixed) -> torch.Tensor:
        """fixed: hashable values the step depends on besides its tensors (passed to it by name): a graph each."""
        key = (tuple((tuple(t.shape), t.dtype, t.device) for t in inputs), tuple(sorted(fixed.items())))
        if key not in self.graphs:
            refusal = capture_refusal()
            if refusal:
                if not self.refused:
                    log.info("SwiftDiT: steps run without CUDA graphs: %s", refusal)
                self.refused = True
                self._decided(key, None)
            elif self.eager_calls.get(key, 0) < EAGER_CALLS[self.capture]:
                return self._undecided(key, inputs, fixed)
            else:
                self.eager_calls.pop(key, None)
                self._decided(key, None)  # its place first (the oldest graph goes before this one is made)
                caller = torch.cuda.current_stream(inputs[0].device) if inputs[0].is_cuda else None
                try:
                    started = time.perf_counter()
                    self.graphs[key], first = self._capture(inputs, fixed)
                    self.captured_on.add(inputs[0].device)
                    log.info("SwiftDiT: captured a CUDA graph of a step at input %s in %.3f s (its eager call "
                             "included)", tuple(inputs[0].shape), time.perf_counter() - started)
                    return first
                except RuntimeError as e:
                    # The warm-up's clones did not fit beside the model (out of memory), or the graph failed
                    # (CaptureFailed: its own pool did not fit, or something in the step cannot be captured, a bug
                    # to report, not the user's problem). This shape runs eagerly from now on.
                    said = str(e).splitlines()[0] if str(e) else type(e).__name__
                    if caller is not None:
                        torch.cuda.set_stream(caller)  # a failed capture's end left its stream current
                    if isinstance(e, CaptureFailed) and async_allocator():
                        _ASYNC_CAPTURE_FAILED.append(said)
                        _KEPT_FROM_FAILED_CAPTURES.append(e)  # its tracebacks' frames hold the capture's tensors
                    log.warning("SwiftDiT: a CUDA graph of the step could not be captured (%s); running it eagerly%s",
                                said, "; no more captures in this process, which keeps what the capture made "
                                "(restart ComfyUI to free it)" if _ASYNC_CAPTURE_FAILED else "")
        entry = self.graphs[key]
        if entry is None:
            return self.step(*inputs, **fixed)
        graph, statics, out = entry
        for static, t in zip(statics, inputs):
            static.copy_(t)
        graph.replay()
        # The next replay overwrites `out`: the caller gets its own copy (of each tensor of a tuple).
        return tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()

    def _undecided(self, key, inputs, fixed):
        """A shape's eager calls before its capture: the first as it comes; a "host_bound" shape's second timed, a
        GPU-bound second keeping the shape eager for good."""
        calls = self.eager_calls.pop(key, 0) + 1
        if calls == 1:
            if len(self.eager_calls) >= MAX_SHAPES:  # shapes seen once long ago go first
                del self.eager_calls[next(iter(self.eager_calls))]
            self.eager_calls[key] = calls
            return self.step(*inputs, **fixed)
        out, gpu, host = timed_step(lambda: self.step(*inputs, **fixed), inputs[0].device)
        host_bound = gpu < HOST_BOUND * host
        log.info("SwiftDiT: a step at input %s took the GPU %.1f ms for %.1f ms of launching: %s",
                 tuple(inputs[0].shape), gpu * 1e3, host * 1e3,
                 "replayed from a CUDA graph from its next call" if host_bound else "eager (a graph would gain little)")
        if host_bound:
            self.eager_calls[key] = calls
        else:
            self._decided(key, None)
        return out

    def _decided(self, key, entry) -> None:
        """The shape's graph, or None (it runs eagerly); the oldest shape's goes past MAX_SHAPES."""
        if len(self.graphs) >= MAX_SHAPES:
            del self.graphs[next(iter(self.graphs))]
        self.graphs[key] = entry

    def _capture(self, inputs, fixed) -> tuple[tuple, torch.Tensor]:
        """((the graph, its input tensors, its output), this call's output: the eager warm-up's, equal to a replay's
        bit for bit, so the first call of a shape costs one step besides the capture, not two)."""
        statics = [t.clone() for t in inputs]
        side = kept_stream(statics[0].device, "capture")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile, tune and fill the caches outside the capture
            warm = self.step(*statics, **fixed)
        torch.cuda.current_stream().wait_stream(side)
        # The graph writes its outputs into tensors made outside it (nothing the capture allocates may outlive it:
        # below).
        tupled = isinstance(warm, tuple)
        outs = tuple(torch.empty_like(t) for t in (warm if tupled else (warm,)))
        for t in warm if tupled else (warm,):  # made on the side stream, read by the caller on this one
            t.record_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        torch._C._cuda_clearCublasWorkspaces()  # the capture makes its own (below), not reads one made outside it
        # On the warm-up's stream: what kernels keep per stream (kernels/int8/arrival_counters.py) is there.
        # thread_local: the host's other threads (ComfyUI's server) may call CUDA meanwhile.
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"), \
                    addresses_for_triton() if async_allocator() else contextlib.nullcontext(), \
                    collector_confined() as collect_young:
                got = self.step(*statics, **fixed)
                # No loop variable may keep one of `got`'s tensors past the capture (below).
                torch._foreach_copy_(list(outs), list(got) if tupled else [got])
                del got
                # Nothing the capture allocated may be freed after it: under cudaMallocAsync such memory exists
                # only once a replay made it, and a free before that fails (cudaErrorInvalidValue) in a destructor,
                # which aborts the process. cuBLAS keeps a workspace per stream, made by the capture's first
                # product; tensors the step left in reference cycles go whenever the collector runs, on any
                # thread. Both go here, within it.
                torch._C._cuda_clearCublasWorkspaces()
                collect_young()
        except Exception as e:  # the step ran just before: what failed is its graph
            raise CaptureFailed(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
        return (graph, statics, outs if tupled else outs[0]), warm

    def clear(self, pool: tuple | None = None) -> None:
        """Drop every graph (before the weights they read move or go) and with them their pool; later captures
        go to `pool` (by default a new one: a released pool's id is not reused)."""
        self.graphs.clear()
        self.eager_calls.clear()
        self.pool = pool
        for device in self.captured_on:
            release_graph_memory(device)
        self.captured_on = set()


def release_graph_memory(device: torch.device) -> None:
    """Under cudaMallocAsync a graph's temporaries are graph memory nodes, whose physical memory the driver keeps
    for graphs after the graphs go (reused across graphs, given to nothing else) until asked to trim it; ComfyUI's
    model management, which reads the card's free memory, would count it as taken. Elsewhere the graphs' pool goes
    back to PyTorch's allocator with them."""
    driver = _cuda_driver() if async_allocator() else None
    if driver is None:
        return
    torch.cuda.synchronize(device)  # (a graph still running keeps its memory)
    handle = ctypes.c_int()
    index = torch.cuda.current_device() if device.index is None else device.index
    if driver.cuDeviceGet(ctypes.byref(handle), index) == 0:
        driver.cuDeviceGraphMemTrim(handle)


@functools.cache
def _cuda_driver():
    """The CUDA driver library (cuDeviceGraphMemTrim is not in PyTorch's bindings), or None."""
    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


# An eager step whose GPU time (from an idle GPU to its end) is under this many times the host's time launching it
# waited on the host at least at times, and a graph, which saves the launches' host time, pays (Z-Image at 1024x1024:
# 70.7 ms eager, 66.2 graphed). At or past it the host ran well ahead of the GPU throughout: a graph gains about
# nothing (Krea 2 at 1024x1024: 139.1 ms eager, 137.5 graphed) and costs a capture at each new shape. In the H100
# servers' logs a host-bound step's ratio was 1.00-1.02 (Z-Image, FLUX.3 Klein's two graphs: the GPU ends with the
# last launch) and Krea 2's 1.45-2.58 (its launches' time varying with the server's other threads): at 1.5, two of
# Krea 2's new prompt lengths were captured for nothing (0.22 s each).
HOST_BOUND = 1.2


def timed_step(run: Callable[[], torch.Tensor], device: torch.device) -> tuple:
    """(run()'s output, seconds from an idle GPU to the GPU's end of it, seconds the host took to launch it)."""
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    out = run()
    end.record()
    host = time.perf_counter() - began
    end.synchronize()
    return out, start.elapsed_time(end) / 1e3, host


@dataclasses.dataclass(frozen=True)
class _Node:
    """A container in tensor_tree's structure: its type and its items (a dataclass's as (field, item) pairs)."""
    kind: type
    items: tuple


_TENSOR = "<tensor>"


def tensor_tree(value) -> tuple[list[torch.Tensor], Hashable]:
    """value's tensors (dataclasses, tuples and lists walked) and its structure without them: hashable (a graph's
    `fixed` key: the ints, flags and None of the step's inputs), and with the tensors it gives value back
    (from_tensor_tree). What a step's dataclass inputs hold besides tensors must be hashable."""
    tensors: list[torch.Tensor] = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return _TENSOR
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return _Node(type(v), tuple((f.name, walk(getattr(v, f.name))) for f in dataclasses.fields(v)))
        if isinstance(v, (tuple, list)):
            return _Node(type(v), tuple(walk(x) for x in v))
        hash(v)  # a value the structure keeps must be hashable (it keys the graphs)
        return v
    return tensors, walk(value)


def from_tensor_tree(structure: Hashable, tensors: Sequence[torch.Tensor]):
    """The value tensor_tree took apart, with these tensors in its tensors' places."""
    remaining = iter(tensors)

    def build(s):
        if isinstance(s, str) and s == _TENSOR:
            return next(remaining)
        if isinstance(s, _Node):
            if dataclasses.is_dataclass(s.kind):
                return s.kind(**{name: build(item) for name, item in s.items})
            return s.kind(build(item) for item in s.items)
        return s
    return build(structure)


class ModelGraphs:
    """A model's graphed steps (GraphedSteps of its step functions, one memory pool: they replay in turn), valid
    while the model's blocks stay where they were at the capture."""

    def __init__(self, *steps: Callable[..., torch.Tensor], capture: str = "always"):
        """capture: GraphedStep's."""
        pool = torch.cuda.graph_pool_handle()
        self.steps = tuple(GraphedStep(step, pool, capture) for step in steps)
        self.placed: int | None = None  # the blocks' generation the graphs read

    def usable(self, blocks) -> bool:
        """Whether the graphs may replay over blocks now: every block resident (a streamed block's slot is
        refilled within the step, which a graph cannot hold) and where it was at the capture; else the graphs
        go (the next call captures them again once the blocks stay put)."""
        from .streaming import resident_generation  # streaming imports the GPU block; graphs only on a GPU
        generation = resident_generation(blocks)
        if generation != self.placed:
            self.clear()
            self.placed = generation
        return generation is not None

    def clear(self) -> None:
        """Drop every graph and their pool (before the blocks move or the model goes)."""
        pool = torch.cuda.graph_pool_handle()
        for step in self.steps:
            step.clear(pool)


class KeptRows:
    """make(rows, dtype) kept for the tensors that come back unchanged: the rows a step computes from its
    conditioning alone (the same tensor every step of a sampler run, or the same view of it; positive and negative
    alternate with CFG; a batch's images each take theirs), made once, outside the graph, and fed to it. The last
    `keep` are kept (a few MB each). A tensor changed in place or gone (the weak reference to it, or to the tensor
    it views) makes them again. In place: its version counter has moved; an inference tensor (made under
    torch.inference_mode, as every tensor of a ComfyUI node is) has none, and its views no base, so a copy of its
    values is kept and compared instead (one pass over a few MB, but a read back that waits for the GPU: the nodes give
    a sampler run's own copy, made outside inference mode, dit_core/sampling/ksampler.py run_copy)."""

    def __init__(self, make: Callable[[torch.Tensor, torch.dtype], torch.Tensor], keep: int = 4):
        self.make, self.keep, self.kept = make, keep, []

    @staticmethod
    def _where(rows: torch.Tensor) -> tuple:
        # A live base holds its memory: the same base, place, shape and strides are the same values, unless they
        # were changed in place (the version counter, shared by views, where the tensor has one).
        return (rows.data_ptr(), tuple(rows.shape), rows.stride(), rows.dtype, rows.device,
                None if rows.is_inference() else rows._version)

    def clear(self) -> None:
        """Drops the kept rows (with the graphs, when the model gives its memory back)."""
        self.kept = []

    def __call__(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        base, where = (rows if rows._base is None else rows._base), self._where(rows)
        for ref, kept_where, kept_dtype, values, made in self.kept:
            # The same values give the same rows: an inference tensor needs no identity (its views have no base).
            if kept_where == where and kept_dtype == dtype and (
                    ref() is base if values is None else torch.equal(values, rows)):
                return made
        made = self.make(rows, dtype)
        values = rows.clone() if rows.is_inference() else None
        self.kept = [(weakref.ref(base), where, dtype, values, made)] + self.kept[:self.keep - 1]
        return made
