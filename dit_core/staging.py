"""Pinned-memory staging of block weights for streamed models: a block's tensors in one host buffer, viewed on a
device slot once copied (seed 000: Staged, Part, stage, Staged.on, stagedBytes)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 256  # each tensor starts at a multiple of this: any dtype's view is aligned, and copies stay coalesced


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
    (page-locked when CUDA is there; None: the layout only, its bytes held elsewhere, e.g. a resident buffer)."""
    template: Any
    nbytes: int
    host: torch.Tensor | None

    def on(self, slot: torch.Tensor) -> Any:
        """The block viewing slot's bytes (uint8, at least nbytes, on any device) as its tensors."""
        if slot.dtype != torch.uint8 or slot.numel() < self.nbytes:
            raise ValueError(f"a staged block of {self.nbytes} bytes needs a uint8 slot of at least that many, "
                             f"got {slot.dtype} of {slot.numel()}")
        return _rebuild(self.template, lambda p: p.view(slot))

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
    """nbytes of host memory: page-locked when CUDA is there (asynchronous copies need it), plain otherwise."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def staged_bytes(block: Any) -> int:
    """The bytes of block's staged copy (Staged.nbytes) without making it."""
    end = 0
    for _, t in _leaves(block):
        end = _aligned(end) + t.numel() * t.element_size()
    return _aligned(end)


def stage(block: Any, files: dict[str, tuple[Any, str]] | None = None) -> Staged:
    """block (a GpuBlock, a host Block, any dataclass/tuple tree of tensors) in one host buffer. files maps a
    tensor's path in the tree ('w.1.weight', see tensor_paths) to (Checkpoint, key): such a tensor is read from
    the file straight into the buffer when the file stores it in the block's dtype and size (no second host
    copy); the caller names only tensors the loader keeps as stored (not permuted, merged or requantized)."""
    files = files or {}
    parts: dict[str, Part] = {}
    end = 0
    for path, t in _leaves(block):
        offset = _aligned(end)
        parts[path] = Part(tuple(t.shape), t.dtype, offset, t.numel() * t.element_size())
        end = offset + parts[path].nbytes
    host = host_buffer(_aligned(end))
    for path, t in _leaves(block):
        part = parts[path]
        out = host[part.offset:part.offset + part.nbytes]
        source = files.get(path)
        if source is not None and _stored_as(source, t):
            source[0].read_into(source[1], out)
        elif part.nbytes:
            # A device tensor comes back over PCIe; a host one is copied once (converted at load).
            out.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    in_order = iter(parts.values())  # _rebuild walks the tree in _leaves' order
    return Staged(_rebuild(block, lambda t: next(in_order)), host.numel(), host)


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
