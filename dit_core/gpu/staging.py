"""Pinned-memory staging of block weights for streamed models: each block's tensors at 256-byte offsets of one
host buffer per model (or per batch of blocks), viewed on a device slot once copied (seed 000: Staged, Part,
stage, Staged.on, stagedBytes)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 256  # each tensor starts at a multiple of this: any dtype's view is aligned, and copies stay coalesced

log = logging.getLogger("SwiftDiT")


@dataclass(frozen=True)
class Part:
    """One tensor of a staged block: its shape and dtype, and its bytes [offset, offset + nbytes) of the buffer."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        """This tensor as a view of buffer's bytes (uint8, host or device)."""
        return buffer[self.offset:self.offset + self.nbytes].view(self.dtype).view(self.shape)


@dataclass(frozen=True)
class Staged:
    """A block as one byte buffer: template is the block with each tensor replaced by its Part, host the bytes
    (a view of a page-locked buffer when CUDA is there; None: the layout only, its bytes held elsewhere, e.g. a
    resident buffer)."""
    template: Any
    nbytes: int
    host: torch.Tensor | None

    def on(self, slot: torch.Tensor) -> Any:
        """The block viewing slot's bytes (uint8, at least nbytes, on any device) as its tensors."""
        if slot.dtype != torch.uint8 or slot.numel() < self.nbytes:
            raise ValueError(f"a staged block of {self.nbytes} bytes needs a uint8 slot of at least that many, "
                             f"got {slot.dtype} of {slot.numel()}")
        return _rebuild(self.template, lambda p: p.view(slot))

    def write(self, block: Any, out: torch.Tensor, files: dict[str, tuple[Any, str]] | None = None,
              readers: Executor | None = None) -> None:
        """block's bytes into out (uint8, nbytes, host or device) at this layout's offsets; block must have it
        (the block this layout was made of, or its twin). files: see stage, read by readers (Checkpoint.read_into's)
        into a host buffer, by the carrier's into a card's."""
        for (path, t), part in zip(_leaves(block), _parts(self.template), strict=True):
            if (part.shape, part.dtype) != (tuple(t.shape), t.dtype):
                raise ValueError(f"block tensor {path}: {tuple(t.shape)} {t.dtype} does not match its staged "
                                 f"part {part.shape} {part.dtype}")
            dest = out[part.offset:part.offset + part.nbytes]
            source = (files or {}).get(path)
            if source is not None and not _stored_as(source, t):
                source = None
            if source is not None and out.device.type == "cpu":
                source[0].read_into(source[1], dest, readers)
            elif part.nbytes:
                # A device tensor comes back over PCIe; a host one is copied once (converted at load); a file's
                # goes to a card from the file.
                carried_into(dest, t.detach().contiguous().reshape(-1).view(torch.uint8), source)

    def copy_to(self, slot: torch.Tensor, stream: torch.cuda.Stream | None = None) -> None:
        """The host bytes into slot: non-blocking on stream (the caller orders it with events) on a GPU,
        synchronous on the CPU."""
        if self.host is None:
            raise ValueError("this staged block holds no host bytes (its layout only); stage it first")
        if stream is None or slot.device.type != "cuda":
            slot[:self.nbytes].copy_(self.host)
            return
        with torch.cuda.stream(stream):
            slot[:self.nbytes].copy_(self.host, non_blocking=True)

    def layout(self) -> Staged:
        """The same block without its host bytes (what a resident block keeps to be staged again)."""
        return dataclasses.replace(self, host=None)


def host_buffer(nbytes: int) -> torch.Tensor:
    """nbytes of host memory in one allocation of exactly that size: page-locked when CUDA is there
    (asynchronous copies need it), plain otherwise. torch's pinned allocator (CachingHostAllocator) rounds each
    allocation up to a power of two (up to twice the bytes), so ordinary memory is registered with CUDA
    (cudaHostRegister) instead; torch's pinned allocator is the fallback where registering fails."""
    if nbytes == 0 or not torch.cuda.is_available():
        return torch.empty(nbytes, dtype=torch.uint8)
    registered = _registered(nbytes)
    if registered is not None:
        return registered
    log.warning("SwiftDiT: cudaHostRegister refused %d bytes; using torch's pinned allocator (it rounds up to "
                "a power of two)", nbytes)
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _registered(nbytes: int) -> torch.Tensor | None:
    """nbytes of ordinary host memory page-locked by CUDA, unregistered when the memory is released."""
    import numpy as np
    array = np.empty(nbytes, dtype=np.uint8)
    cudart, address = torch.cuda.cudart(), array.ctypes.data
    if int(cudart.cudaHostRegister(address, nbytes, 0)) != 0:
        return None
    # The tensor (and every view of it) holds the array; numpy runs weak-reference callbacks before it frees
    # the bytes, so they are unregistered first (a freed registered range would refuse the next registration).
    weakref.finalize(array, cudart.cudaHostUnregister, address).atexit = False  # the process's end frees all
    return torch.from_numpy(array)


CARRY_CHUNK = 64 << 20  # bytes of each of the two page-locked buffers that carry host tensors to a card
CARRIED = 1 << 20  # tensors from this size on go through them; smaller ones are copied as they are
READERS = 8  # threads reading a file's pieces side by side (Checkpoint.read_into)


class Carrier:
    """Two page-locked buffers of `chunk` bytes that take turns carrying host bytes to a CUDA device: the CPU
    fills a chunk of one while the other's chunk crosses to the card (a pageable copy from a memory map ran at 8.0
    GB/s on an H100 host; registered memory to the card at 52, the memory map into registered memory at 26.5).
    A file's tensor is read into the chunk by positioned reads on READERS threads of the carrier's own
    (Checkpoint.read_into), which release the GIL and fault no map pages in; other bytes are copied by torch's
    threads. Registered once, on first use; one carry at a time (a load and the stand-in built beside it share
    it)."""

    def __init__(self, chunk: int = CARRY_CHUNK):
        self.chunk = chunk
        self._lock = threading.Lock()
        self._buffers: list[torch.Tensor] = []
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._readers: ThreadPoolExecutor | None = None

    def carry(self, src: torch.Tensor, dest: torch.Tensor, source: tuple[Any, str] | None = None) -> None:
        """src's bytes (uint8 [n], host) into dest (uint8 [n], a CUDA device), not waited for: later work on dest's
        device's current stream sees them. source: (checkpoint, key) of a file tensor whose stored bytes src is,
        read from the file in src's place."""
        stream = torch.cuda.current_stream(dest.device)
        with self._lock:
            if not self._buffers:
                # Normal tensors, not inference tensors: any thread writes them, in inference mode (ComfyUI's
                # nodes) or not (a stand-in's builds beside the load).
                with torch.inference_mode(False):
                    self._buffers = [host_buffer(self.chunk) for _ in range(2)]
            if source is not None and self._readers is None:
                self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="SwiftDiT read")
            for start in range(0, src.numel(), self.chunk):
                i, self._turn = self._turn, 1 - self._turn
                if self._copied[i] is not None:
                    self._copied[i].synchronize()  # its last chunk has crossed: it may be written again
                end = min(start + self.chunk, src.numel())
                chunk = self._buffers[i][:end - start]
                if source is None:
                    chunk.copy_(src[start:end])
                else:
                    source[0].read_into(source[1], chunk, self._readers, offset=start)
                dest[start:end].copy_(chunk, non_blocking=True)
                self._copied[i] = torch.cuda.Event()
                self._copied[i].record(stream)


CARRIER = Carrier()


def carried_into(dest: torch.Tensor, src: torch.Tensor, source: tuple[Any, str] | None = None) -> None:
    """dest.copy_(src) of bytes (uint8 [n] each): through CARRIER where CARRIED bytes or more go from the host to a
    card (the same bytes either way); source: (checkpoint, key) whose stored bytes src is, read from the file there
    (Carrier.carry)."""
    if dest.device.type == "cuda" and src.device.type == "cpu" and src.numel() >= CARRIED:
        CARRIER.carry(src, dest, source)
    else:
        dest.copy_(src)


def to_card(t: torch.Tensor, device: torch.device | str, source: tuple[Any, str] | None = None) -> torch.Tensor:
    """t on device (carried_into a new tensor there when it goes from the host to a card), else t.to(device).
    source: (checkpoint, key) of the file tensor t may be as stored (Checkpoint.views): then read from the file."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    src = t.contiguous()
    out = torch.empty(src.shape, dtype=src.dtype, device=device)
    if source is not None and not source[0].views(source[1], src):
        source = None
    carried_into(out.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8), source)
    return out


def layout(block: Any) -> Staged:
    """block's staged layout (its tensors' Parts, 256-byte aligned, and the total bytes) without its bytes."""
    parts: dict[str, Part] = {}
    end = 0
    for path, t in _leaves(block):
        offset = _aligned(end)
        parts[path] = Part(tuple(t.shape), t.dtype, offset, t.numel() * t.element_size())
        end = offset + parts[path].nbytes
    in_order = iter(parts.values())  # _rebuild walks the tree in _leaves' order
    return Staged(_rebuild(block, lambda t: next(in_order)), _aligned(end), None)


def meta_twin(block: Any) -> Any:
    """block with each tensor replaced by a meta tensor of its shape and dtype: a layout without the bytes."""
    return _rebuild(block, lambda t: t.to("meta"))


def staged_bytes(block: Any) -> int:
    """The bytes of block's staged copy (Staged.nbytes) without making it."""
    return layout(block).nbytes


def stage(block: Any, files: dict[str, tuple[Any, str]] | None = None) -> Staged:
    """block (a GpuBlock, a host Block, any dataclass/tuple tree of tensors) in its own host buffer. files maps
    a tensor's path in the tree ('w.1.weight', see tensor_paths) to (Checkpoint, key): such a tensor is read
    from the file straight into the buffer when the file stores it in the block's dtype and size (no second
    host copy); the caller names only tensors the loader keeps as stored (not permuted, merged or
    requantized)."""
    return stage_all([block], files=[files])[0]


def stage_all(blocks: Iterable[Any], layouts: Sequence[Staged] | None = None,
              files: Sequence[dict | None] | None = None, readers: Executor | None = None) -> list[Staged]:
    """The blocks in one host buffer of exactly the sum of their staged bytes (each a multiple of 256, so
    every block and tensor starts aligned), each Staged's host a view of it. layouts: the blocks' layouts when
    known, so that blocks may be a generator that makes each block only while it is written (no whole second
    host copy); files[i]: stage's files for block i, read by readers (Checkpoint.read_into's)."""
    if layouts is None:
        blocks = list(blocks)
        layouts = [layout(b) for b in blocks]
    blocks = iter(blocks)
    offsets, total = [], 0
    for s in layouts:
        offsets.append(total)
        total += s.nbytes
    host = host_buffer(total)
    staged = []
    for i, (s, start) in enumerate(zip(layouts, offsets)):
        view = host[start:start + s.nbytes]
        s.write(next(blocks), view, files[i] if files else None, readers)
        staged.append(dataclasses.replace(s, host=view))
    return staged


def tensor_paths(block: Any) -> list[str]:
    """The paths of block's tensors in staging order, as stage's files names them."""
    return [path for path, _ in _leaves(block)]


def _stored_as(source: tuple[Any, str], t: torch.Tensor) -> bool:
    ckpt, key = source
    read_into = getattr(ckpt, "read_into", None)
    if read_into is None or key not in ckpt:
        return False
    try:
        stored = ckpt.dtype(key)
    except (KeyError, ValueError):
        return False
    n = 1
    for d in ckpt.shape(key):
        n *= int(d)
    return stored == t.dtype and n == t.numel()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _leaves(obj: Any, path: str = ""):
    """(path, tensor) of every tensor in a dataclass/tuple/list tree, in field order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.init:
                yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from _leaves(item, f"{path}.{i}" if path else str(i))


def _parts(template: Any):
    """The Parts of a layout's template, in _leaves' order."""
    if isinstance(template, Part):
        yield template
    elif dataclasses.is_dataclass(template) and not isinstance(template, type):
        for f in dataclasses.fields(template):
            if f.init:
                yield from _parts(getattr(template, f.name))
    elif isinstance(template, (tuple, list)):
        for item in template:
            yield from _parts(item)


def _rebuild(obj: Any, fn):
    """obj with each tensor (or Part) t replaced by fn(t); other values kept."""
    if isinstance(obj, (torch.Tensor, Part)):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _rebuild(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, (tuple, list)):
        return type(obj)(_rebuild(item, fn) for item in obj)
    return obj
