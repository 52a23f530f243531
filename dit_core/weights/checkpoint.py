"""Model files as stored: lazy safetensors files whose header is checked before any tensor is read, plain tensors
from them, and tensors in memory behind the same interface. Nothing here unpickles: safetensors only."""
from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open

# safetensors dtype names -> torch dtypes we can hold (the header check rejects any other).
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
MAX_HEADER_BYTES = 100 * 1024 * 1024
READ_PIECE = 16 << 20  # bytes a reader thread reads at a time (Checkpoint.read_into)


def _fits_range(offset: int | None, n: int, size: int) -> bool:
    """Whether n bytes from offset lie within a tensor of size bytes (offset None: n is the whole tensor)."""
    return n == size if offset is None else 0 <= offset and offset + n <= size


class WeightsError(ValueError):
    """A model file that is not what the loader expects; the message names the file and the fix."""


def layer_reader(ckpt, layer: str, kind: str, stores: str):
    """(bad, need) for reading quantized layer `layer`: bad(problem) is the WeightsError naming the file, the
    format's `kind` and the layer; need(suffix) its tensor `layer.suffix`, or bad saying what `stores`."""
    def bad(problem: str) -> WeightsError:
        return WeightsError(f"{ckpt.path.name}: {kind} layer '{layer}' {problem}")

    def need(suffix: str):
        key = f"{layer}.{suffix}"
        if key not in ckpt:
            raise bad(f"has no '{key}' ({stores})")
        return ckpt.get(key)
    return bad, need


class Checkpoint:
    """One safetensors file, read lazily (memory-mapped); its header is checked before any tensor is read. check(),
    when set, runs before each tensor is read (it raises to cancel a long load); read(nbytes), when set, after
    (a load's progress)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.check: Callable[[], None] | None = None
        self.read: Callable[[int], None] | None = None
        if self.path.suffix.lower() not in (".safetensors", ".sft"):
            raise WeightsError(f"{self.path.name}: only .safetensors files are read (no pickle); convert it first")
        self.header, self.metadata = _read_header(self.path)
        try:
            self._file = safe_open(str(self.path), framework="pt", device="cpu")
        except Exception as e:  # safetensors' own checks (holes between tensors, ...) beyond ours
            raise WeightsError(f"{self.path.name}: safetensors cannot open it ({e})") from e

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def keys(self) -> list[str]:
        return list(self.header)

    def prefix_of(self, keys: tuple[str, ...], prefixes: tuple[str, ...]) -> str | None:
        """The first of prefixes under which the file holds every one of keys (a family's detection), or None."""
        return next((p for p in prefixes if all(p + k in self for k in keys)), None)

    def numbered(self, stem: str, suffix: str) -> int:
        """How many blocks stem0suffix, stem1suffix, ... the file holds in a row."""
        n = 0
        while f"{stem}{n}{suffix}" in self:
            n += 1
        return n

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return SAFETENSORS_DTYPES[self._entry(name)["dtype"]]

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        if self.check is not None:
            self.check()
        if self._file is None:
            self._file = safe_open(str(self.path), framework="pt", device="cpu")
        tensor = self._file.get_tensor(name)
        self._was_read(name)
        return tensor

    def views(self, name: str, t: torch.Tensor) -> bool:
        """Whether t is tensor name's stored bytes as get() gives them (a view of the file's map, whole and
        untouched by any conversion): what read_into may read from the file in its place."""
        entry, mapped = self.header.get(name), getattr(self, "_file", None)  # (HeaderOnly has no map of its own)
        if entry is None or mapped is None or not t.is_contiguous() or t.device.type != "cpu":
            return False
        begin, end = entry["data_offsets"]
        return t.numel() * t.element_size() == end - begin and t.data_ptr() == mapped.get_tensor(name).data_ptr()

    def total_bytes(self) -> int:
        """The bytes of every tensor in the file."""
        return sum(end - begin for begin, end in (e["data_offsets"] for e in self.header.values()))

    def _was_read(self, name: str) -> None:
        if self.read is not None:
            begin, end = self.header[name]["data_offsets"]
            self.read(end - begin)

    def release(self) -> None:
        """Drops the file's memory map: every page a load read stays counted in the process's resident memory while
        it is mapped (a model that keeps this file for later reads would hold a file's worth); get() maps it
        again, read_into() never needs it."""
        self._file = None

    def read_into(self, name: str, out: torch.Tensor, readers: Executor | None = None,
                  offset: int | None = None) -> None:
        """Tensor name's stored bytes read from the file straight into out (uint8 host memory of exactly its
        size, e.g. a pinned staging buffer): no tensor and no second host copy is made, and the file's map is not
        touched (a map's pages fault in a few at a time and count as the process's resident memory). offset: out
        takes the bytes [offset, offset + out's size) of a tensor get() gave before (not counted as read again).
        readers: a thread pool that reads pieces of READ_PIECE bytes side by side (one thread's reads from the page
        cache ran at a few GB/s; positioned reads release the GIL), where the platform has positioned reads."""
        begin, end = self._entry(name)["data_offsets"]
        if out.dtype != torch.uint8 or out.device.type != "cpu" or not _fits_range(offset, out.numel(), end - begin):
            raise ValueError(f"{self.path.name}: '{name}' holds {end - begin} bytes; read_into needs a host "
                             f"uint8 tensor of that size (or of a range within them from offset {offset}), got "
                             f"{out.dtype} [{out.numel()}] on {out.device}")
        begin += offset or 0
        if self.check is not None:
            self.check()
        view = memoryview(out.numpy()).cast("B")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            start = 8 + n + begin  # the data section follows the 8-byte length and the JSON header
            pieces = [view[a:a + READ_PIECE] for a in range(0, len(view), READ_PIECE)]
            if readers is None or len(pieces) < 2 or not hasattr(os, "preadv"):
                f.seek(start)
                self._read_all(lambda rest, _: f.readinto(rest), view, name)
            else:
                fd = f.fileno()
                list(readers.map(lambda i: self._read_all(
                    lambda rest, done: os.preadv(fd, [rest], start + i * READ_PIECE + done), pieces[i], name),
                    range(len(pieces))))
        if offset is None:
            self._was_read(name)

    def _read_all(self, read: Callable[[memoryview, int], int], view: memoryview, name: str) -> None:
        """view filled by read(the rest of view, the bytes of view already read) calls, each returning the bytes
        it read."""
        done = 0
        while done < len(view):
            got = read(view[done:], done)
            if not got:
                raise WeightsError(f"{self.path.name}: '{name}' ends past the end of the file (truncated?)")
            done += got

    def _entry(self, name: str) -> dict:
        if name not in self.header:
            raise WeightsError(f"{self.path.name}: tensor '{name}' is missing; is this the right model file?")
        return self.header[name]

    def quantization_markers(self) -> dict[str, dict]:
        """Per-layer quantization markers from the header's `_quantization_metadata` (ComfyUI's file form)."""
        raw = self.metadata.get("_quantization_metadata")
        if not raw:
            return {}
        try:
            return dict(json.loads(raw).get("layers", {}))
        except (ValueError, AttributeError) as e:
            raise WeightsError(f"{self.path.name}: unreadable _quantization_metadata in the header ({e})") from e


def _read_header(path: Path) -> tuple[dict, dict]:
    """The safetensors header, checked: JSON of known dtypes whose byte ranges lie inside the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path.name}: corrupt safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise WeightsError(f"{path.name}: corrupt safetensors header (declares {n} header bytes in a "
                               f"{size}-byte file); the download is probably truncated or not safetensors")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            raise WeightsError(f"{path.name}: corrupt safetensors header (not JSON: {e})") from e
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data = size - 8 - n
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            elements = math.prod(int(d) for d in shape)
        except (TypeError, KeyError, ValueError) as e:
            raise WeightsError(f"{path.name}: corrupt safetensors header entry for '{name}'") from e
        if dtype not in SAFETENSORS_DTYPES:
            raise WeightsError(f"{path.name}: tensor '{name}' has unsupported dtype {dtype}")
        nbytes = elements * torch.empty((), dtype=SAFETENSORS_DTYPES[dtype]).element_size()
        if not (0 <= begin <= end <= data) or end - begin != nbytes:
            raise WeightsError(f"{path.name}: corrupt safetensors header: '{name}' bytes [{begin}, {end}) do not "
                               f"fit its shape {shape} or the file's {data} data bytes (truncated download?)")
    return header, metadata


def moved_to(t: torch.Tensor, device: str | torch.device, source: tuple[Checkpoint, str] | None = None) -> torch.Tensor:
    """t on device, the same bytes: to a card through dit_core/gpu/staging.to_card's page-locked pair (imported only
    then: the host path never loads dit_core/gpu; source: the (checkpoint, key) t was read as, read from the file
    there where t is still its stored bytes), elsewhere a plain copy."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    from ..gpu.staging import to_card
    return to_card(t, device, source)


def read_tensor(ckpt: Checkpoint, key: str, shape: tuple[int, ...] | None = None, dtype: torch.dtype = torch.float32,
                device: str | torch.device | None = None) -> torch.Tensor:
    """A plain (non-linear) tensor as dtype (f32 by default) on device (by default where it was read), its shape
    checked when given. It moves as stored and is converted there: a BF16 tensor bound for a GPU in BF16 never
    exists in f32 on the host."""
    t = ckpt.get(key)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise WeightsError(f"{ckpt.path.name}: '{key}' has shape {tuple(t.shape)}, expected {tuple(shape)}; "
                           f"the file is of another model size or family")
    t = t if device is None else moved_to(t, device, (ckpt, key))
    if t.dtype in FP8_DTYPES:
        scale_key = key.rsplit(".", 1)[0] + ".weight_scale"
        scale = ckpt.get(scale_key).float().to(t.device) if scale_key in ckpt else 1.0
        return (t.float() * scale).to(dtype)
    return t.to(dtype)


class FirstBlocks(Checkpoint):
    """A file with each stack of repeated blocks cut to its first (`...layers.0.`, `...blocks.0.`, `...refiner.0.`,
    `...blocks.<mode>.0.` kept, the later ones hidden): what a recipe's load makes a one-block stand-in of, to build a
    step's kernels (every block launches the same ones) without reading the model."""

    STACKED = re.compile(r"(?:layers|refiner|blocks(?:\.[a-z_]+)?)\.(\d+)\.")

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.header = {k: v for k, v in self.header.items() if all(i == "0" for i in self.STACKED.findall(k))}


class HeaderOnly(Checkpoint):
    """A file's large tensors as meta tensors of their shapes and dtypes, its small ones (markers, scales, norms: what
    a load checks by value) read: a load read through it runs each of its checks and gives the model's shapes
    without reading its weights (BlocksOnUse)."""

    SMALL = 1 << 20  # bytes

    def __init__(self, source: Checkpoint):
        self.path, self.header, self.metadata, self.source = source.path, source.header, source.metadata, source
        self.check = self.read = None

    def dtype(self, name: str) -> torch.dtype:
        return self.source.dtype(name)

    def get(self, name: str) -> torch.Tensor:
        shape, dtype = self.shape(name), self.dtype(name)
        if math.prod(shape) * dtype.itemsize <= self.SMALL:
            return self.source.get(name)
        return torch.empty(shape, dtype=dtype, device="meta")


class BlocksOnUse(Sequence):
    """A stack of a file's blocks, each read when it is asked for and not kept (read(i)): a model placed block by
    block (a GpuBlock a block, StreamedBlocks' copies) holds a few blocks of gathered rows on the host at a time, not
    a second copy of itself. shapes: the blocks read from the file's header alone (HeaderOnly), their layouts without
    their bytes. In turn (iteration, reading), each block is read on a thread while the one before is placed."""

    def __init__(self, read: Callable[[int], object], shapes: tuple):
        self.read, self.shapes = read, shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if not -len(self) <= i < len(self):
            raise IndexError(f"block {i} of {len(self)}")
        return self.read(i % len(self))

    def __iter__(self) -> Iterator:
        return self.reading(range(len(self)))

    def reading(self, indices: Iterable[int]) -> Iterator:
        """The blocks at indices in turn, the next read (the file's pages, the rows' gathers) on a thread of its own
        while the caller places this one (a copy to the card)."""
        indices = list(indices)
        if not indices:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="SwiftDiT block read") as ahead:
            coming = ahead.submit(self.read, indices[0])
            for k in range(len(indices)):
                block = coming.result()
                if k + 1 < len(indices):
                    coming = ahead.submit(self.read, indices[k + 1])
                yield block
                del block


class TensorSource(Checkpoint):
    """Tensors already in memory behind Checkpoint's interface (benchmarks on random weights, converters)."""

    def __init__(self, tensors: dict[str, torch.Tensor], name: str = "in-memory"):
        self.path = Path(name)
        self.tensors = tensors
        self.header = {k: {"shape": list(v.shape)} for k, v in tensors.items()}
        self.metadata = {}

    def dtype(self, name: str) -> torch.dtype:
        return self.get(name).dtype

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        return self.tensors[name]

    def views(self, name: str, t: torch.Tensor) -> bool:
        """Whether t is tensor name itself (its bytes, whole)."""
        held = self.tensors.get(name)
        return (held is not None and t.is_contiguous() and held.is_contiguous() and t.data_ptr() == held.data_ptr()
                and t.numel() * t.element_size() == held.numel() * held.element_size())

    def read_into(self, name: str, out: torch.Tensor, readers: Executor | None = None,
                  offset: int | None = None) -> None:
        """Tensor name's bytes (from offset: a range of them) copied into out (uint8), as Checkpoint.read_into reads
        a file's (readers unused: one copy)."""
        t = self.get(name).contiguous().reshape(-1).view(torch.uint8)
        if out.dtype != torch.uint8 or not _fits_range(offset, out.numel(), t.numel()):
            raise ValueError(f"{self.path.name}: '{name}' holds {t.numel()} bytes; read_into needs a uint8 "
                             f"tensor of that size (or of a range within them from offset {offset}), got "
                             f"{out.dtype} [{out.numel()}]")
        start = offset or 0
        out.copy_(t[start:start + out.numel()])
