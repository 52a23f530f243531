"""Streamed blocks: the resident blocks spread over the depth, the others staged in host memory and copied to two
device slots ahead of their use on a copy stream; free() gives memory back and refill() takes it again
(issue 5; seed 003: Weights, Ltx.free; seed 001: Model.fill, Model.room). Also the budget arithmetic: the
device's free memory and the bytes a pass needs besides the weights."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from ..arch import Arch
from .block import GpuBlock
from .options import DEFAULT
from ..weights import BlocksOnUse
from .staging import READERS, Staged, host_buffer, layout, meta_twin, stage_all

SLOTS = 2  # one slot is copied into while the block in the other runs


class BudgetError(ValueError):
    """A budget too small for the two slots the streamed blocks copy into (the loader's gpu_budget_gb)."""


def spread(n: int, k: int) -> list[bool]:
    """k of n positions marked, evenly spaced and the first among them: a streamed block's copy then overlaps
    the resident blocks before it all through a pass, not only at its end."""
    if not 0 <= k <= n:
        raise ValueError(f"cannot keep {k} of {n} blocks")
    # Bresenham's line from the end: position i is kept when floor((n - i) k / n) steps there.
    return [(n - i) * k // n > (n - 1 - i) * k // n for i in range(n)]


def plan(block_bytes: Sequence[int], budget: int, slot_bytes: int | None = None, slots: int = SLOTS) -> list[bool]:
    """Which blocks stay on the device (True) within budget bytes: all when they fit; else the slots of
    slot_bytes each (by default the largest block) first, then as many blocks as fit, spread over the depth."""
    n = len(block_bytes)
    if sum(block_bytes) <= budget:
        return [True] * n
    slot = max(block_bytes) if slot_bytes is None else slot_bytes
    need = slots * slot
    if budget < need:
        raise BudgetError(f"a GPU budget of {budget} bytes ({budget / 2**30:.2f} GiB) cannot stream these blocks: "
                         f"the {slots} slots they copy into need {need} bytes ({need / 2**30:.2f} GiB); raise "
                         f"the budget or free GPU memory")
    room = budget - need
    for k in range(n - 1, -1, -1):
        keep = spread(n, k)
        if sum(b for b, kept in zip(block_bytes, keep) if kept) <= room:
            return keep
    return [False] * n  # unreachable: k = 0 keeps nothing


def keep_order(m: int) -> list[int]:
    """0..m-1 in van der Corput order: every prefix is spread over the range (free() drops from its end)."""
    bits = max(1, (m - 1).bit_length())
    rev = lambda j: int(format(j, f"0{bits}b")[::-1], 2)  # noqa: E731
    return sorted(range(m), key=rev)


def gpu_free_bytes(device: torch.device | str) -> int:
    """The device's free memory as ComfyUI counts it (model_management.get_free_memory): the driver's free
    bytes plus those torch's caching allocator holds unused (a later allocation takes them first)."""
    device = torch.device(device)
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def gpu_budget(device: torch.device | str, reserve_bytes: int) -> int:
    """The device's free memory less reserve_bytes (what a pass needs besides the weights)."""
    return max(0, gpu_free_bytes(device) - reserve_bytes)


def pass_bytes(a: Arch, rows: int, mlp_chunk: int = DEFAULT.mlp_chunk) -> int:
    """The device bytes a pass over `rows` rows takes besides the weights, generously: the f32 residual stream
    four times (x, the parallel block's copy, the step cache's two), QKV's product and its rotated heads in
    BF16, attention's output, each linear's input rows (BF16 or INT8 with scales), the MLP's chunk of rows
    (its [rows, 2 ffn] product in BF16 and SwiGLU in f32; mlp_chunk: Options.mlp_chunk), and 256 MiB for cuBLAS
    and the kernels' workspaces."""
    chunk = min(rows, mlp_chunk)
    per_row = 4 * 4 * a.hidden + 2 * 2 * 3 * a.width + 3 * a.width + 3 * a.hidden + 16
    return rows * per_row + chunk * (2 * 2 * a.ffn + 6 * a.ffn) + (256 << 20)


def host_pass_bytes(a: Arch, rows: int) -> int:
    """The host bytes a pass of the float32 host path (dit_core/block.py) takes over `rows` rows besides the
    weights, generously: the residual stream and its norm's output three times, QKV's product and the rotated q
    and k, attention's output, the MLP's whole [rows, 2 ffn] product and SwiGLU (the host path does not chunk),
    and 256 MiB for the rest (attention runs in PyTorch's flash kernel: no [rows, rows] scores)."""
    per_row = 4 * (4 * a.hidden + a.qkv_width + 3 * a.width + 3 * a.ffn)
    return rows * per_row + (256 << 20)


def step_flops(a: Arch, rows: int, blocks: int) -> float:
    """Floating-point operations of one pass over `rows` rows through `blocks` blocks: the four linears and
    attention's two products."""
    linears = a.hidden * a.qkv_width + a.width * a.hidden + a.hidden * 2 * a.ffn + a.ffn * a.hidden
    return blocks * (2.0 * rows * linears + 4.0 * rows * rows * a.width)


def streamed_blocks(blocks: Sequence[Any], device: torch.device | str, budget: int | Callable[[int], int],
                    files: Sequence[dict] | None = None) -> StreamedBlocks:
    """A family's host blocks as StreamedBlocks on device: GpuBlocks on a CUDA device (each made on the host
    as it is staged or copied), the host blocks themselves elsewhere."""
    device = torch.device(device)
    return StreamedBlocks(blocks, device, budget, files, GpuBlock.of if device.type == "cuda" else None)


def placed(model: Any, device: torch.device, budget_bytes: int | Callable[[int], int] | None, options: Any) -> Any:
    """A recipe's .to(device) for one with gpu_form(device, options, with_layers) and a `blocks` stack of layers
    that have .on(device) (MiniMax H3, LTX-2.5): on CUDA its GPU form, elsewhere the model as it is (the kernels'
    references run there); with budget_bytes its layers as StreamedBlocks within it, each layer moved by its .on."""
    cuda = device.type == "cuda"
    if budget_bytes is None:
        return model.gpu_form(device, options) if cuda else replace(model, options=options)
    form = (lambda layer, where: layer.on(where)) if cuda else None
    base = model.gpu_form(device, options, with_layers=False) if cuda else replace(model, options=options)
    return replace(base, blocks=StreamedBlocks(model.blocks, device, budget_bytes, form=form))


def resident_generation(blocks: StreamedBlocks | Sequence[Any]) -> int | None:
    """The placement generation of blocks when every one of them stays on its device (0 for a plain sequence,
    which never moves), None while some stream. A CUDA graph reads the resident buffers where they were at
    its capture: it replays only while this is the value it was captured at (step_graph.ModelGraphs)."""
    if not isinstance(blocks, StreamedBlocks):
        return 0
    return blocks.generation if all(blocks.resident) else None


def _in_turn(blocks: Sequence[Any], indices: list[int]) -> Iterator[Any]:
    """blocks[i] for i in indices, in turn: a file's blocks read on use, each read while the one before is placed."""
    return blocks.reading(indices) if isinstance(blocks, BlocksOnUse) else (blocks[i] for i in indices)


def _as_is(block: Any, device: torch.device) -> Any:
    return block


def _layout_of(form: Callable[[Any, torch.device], Any], block: Any, read: Callable[[], Any]) -> Staged:
    """The staged layout of form(block) from shapes alone (meta tensors: no conversion work); a form that
    cannot run on meta tensors is run once on the host, on the block read()."""
    meta = torch.device("meta")
    try:
        return layout(form(meta_twin(block), meta))
    except (RuntimeError, NotImplementedError):
        return layout(form(read(), torch.device("cpu")))


class StreamedBlocks:
    """A stack of blocks that runs within a device memory budget. Iterating yields each block ready to run, in
    order: a resident one as is, a streamed one viewed on its slot once its copy has landed (an event the
    compute stream waits on; no device-wide synchronize). Each copy is issued as soon as its slot is free: after
    the block that last used it was enqueued. On the CPU the same path runs with plain tensors and synchronous
    copies.

    blocks: host blocks (or Staged ones); form(block, device) makes a block as it runs (e.g. GpuBlock.of), one
    block at a time. The host holds only what the device does not: the blocks that stream at load are staged
    in one page-locked buffer (files[i]: stage's files for block i, read from the checkpoint straight into it),
    the others go straight to the device; a block that leaves later is staged then, and its copy stays.
    budget: bytes, or a function of the blocks' total bytes asked once (the automatic budget reads the free
    memory after the model's other parts are on the device).

    generation counts the changes of the device buffers (blocks leaving or coming back, slots dropped): a
    CUDA graph captured over the resident blocks reads their addresses, and anything that moves them
    invalidates it (resident_generation)."""

    def __init__(self, blocks: Sequence[Any], device: torch.device | str, budget: int | Callable[[int], int],
                 files: Sequence[dict] | None = None, form: Callable[[Any, torch.device], Any] | None = None,
                 slots: int = SLOTS):
        if not blocks:
            raise ValueError("StreamedBlocks needs at least one block")
        self.device, form, cpu = torch.device(device), form or _as_is, torch.device("cpu")
        shapes = blocks.shapes if isinstance(blocks, BlocksOnUse) else blocks  # no block read for its layout
        self._layouts = [b.layout() if isinstance(b, Staged) else _layout_of(form, b, functools.partial(
            blocks.__getitem__, i)) for i, b in enumerate(shapes)]
        self._bytes = [s.nbytes for s in self._layouts]
        self.slot_bytes = max(self._bytes)
        self._staged: list[Staged | None] = [b if isinstance(b, Staged) else None for b in shapes]
        self._resident: list[tuple[torch.Tensor, Any] | None] = [None] * len(blocks)
        self._slots: list[torch.Tensor] = []
        self.slot_count = slots
        self._held: list[int | None] = [None] * slots
        cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self._free_events = [torch.cuda.Event() for _ in range(slots)] if cuda else []
        self._ready_events = [torch.cuda.Event() for _ in range(slots)] if cuda else []
        self.generation = 0
        self.budget = budget(self.total_bytes()) if callable(budget) else budget
        self.wanted = plan(self._bytes, self.budget, self.slot_bytes, slots)
        streamed = [i for i, want in enumerate(self.wanted) if not want and self._staged[i] is None]
        with ThreadPoolExecutor(READERS, thread_name_prefix="SwiftDiT read") as readers:
            made = stage_all((form(b, cpu) for b in _in_turn(blocks, streamed)), [self._layouts[i] for i in streamed],
                             [files[i] for i in streamed] if files else None, readers)
            for i, staged in zip(streamed, made):
                self._staged[i] = staged
        placed = [i for i, want in enumerate(self.wanted) if want and self._staged[i] is None]
        for i, block in zip(placed, _in_turn(blocks, placed)):
            buf = torch.empty(self._bytes[i], dtype=torch.uint8, device=self.device)
            self._layouts[i].write(form(block, cpu), buf, files[i] if files else None)
            self._resident[i] = (buf, self._layouts[i].on(buf))
        for i, want in enumerate(self.wanted):
            if want and self._resident[i] is None:  # staged before (given as Staged)
                buf = torch.empty(self._bytes[i], dtype=torch.uint8, device=self.device)
                self._staged[i].copy_to(buf)
                self._resident[i] = (buf, self._layouts[i].on(buf))
        self._make_slots()

    def __len__(self) -> int:
        return len(self._layouts)

    @property
    def resident(self) -> list[bool]:
        return [r is not None for r in self._resident]

    def total_bytes(self) -> int:
        """Bytes of every block: what the device holds when all stay there (no slots then)."""
        return sum(self._bytes)

    def device_bytes(self) -> int:
        """Bytes the blocks hold on the device now: resident blocks and slots."""
        return sum(b for b, r in zip(self._bytes, self._resident) if r is not None) + \
            sum(s.numel() for s in self._slots)

    def host_bytes(self) -> int:
        """Bytes of staged copies in (page-locked) host memory."""
        return sum(s.nbytes for s in self._staged if s is not None)

    def refill(self, budget: int | None = None) -> int:
        """Puts the blocks where the plan of budget (by default the last one) wants them: a block no longer
        wanted leaves first (staged if it holds no host copy), then each wanted one comes back from its staged
        copy, which stays (a later free() needs no copy back). Returns the bytes it copied to the device."""
        if budget is not None:
            self.budget, self.wanted = budget, plan(self._bytes, budget, self.slot_bytes, self.slot_count)
        self._release([i for i, want in enumerate(self.wanted) if self._resident[i] is not None and not want])
        if all(self.wanted) and self._slots:
            self._slots, self._held = [], [None] * self.slot_count  # nothing streams: the slots go
            self.generation += 1
        copied = 0
        for i, want in enumerate(self.wanted):
            if want and self._resident[i] is None:
                buf = torch.empty(self._bytes[i], dtype=torch.uint8, device=self.device)
                self._staged[i].copy_to(buf)  # synchronous: outside the loop
                self._resident[i] = (buf, self._layouts[i].on(buf))
                copied += self._bytes[i]
        if copied:
            self.generation += 1
        self._make_slots()
        return copied

    def _make_slots(self) -> None:
        if not all(self.resident) and not self._slots:
            self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
                           for _ in range(self.slot_count)]
            self._held = [None] * self.slot_count

    def _release(self, leaving: list[int]) -> None:
        """Blocks `leaving` off the device; those without a host copy are staged first, together in one
        buffer (torch's pinned allocator would round a buffer per block up to a power of two)."""
        if not leaving:
            return
        if self._copy_stream is not None:
            self._copy_stream.synchronize()  # copies in flight still write the slots
        unstaged = [i for i in leaving if self._staged[i] is None]
        host, start = host_buffer(sum(self._bytes[i] for i in unstaged)), 0
        for i in unstaged:
            view = host[start:start + self._bytes[i]]
            view.copy_(self._resident[i][0])  # device to host, blocking: the device buffer is released next
            self._staged[i], start = replace(self._layouts[i], host=view), start + self._bytes[i]
        for i in leaving:
            self._resident[i] = None
        self.generation += 1

    def free(self, nbytes: int) -> int:
        """Gives at least nbytes of device memory back where the blocks hold that much: resident blocks leave
        (staged first when they hold no host copy) so that those kept stay spread, then the slots (a later pass
        makes them again). The blocks stay wanted: refill() brings them back. Returns the bytes given back."""
        resident = [i for i, r in enumerate(self._resident) if r is not None]
        leaving, freed = [], 0
        for j in reversed(keep_order(len(resident))):
            if freed >= nbytes:
                break
            leaving.append(resident[j])
            freed += self._bytes[resident[j]]
        self._release(leaving)
        if freed < nbytes and self._slots:
            freed += sum(s.numel() for s in self._slots)
            self._slots, self._held = [], [None] * self.slot_count
            self.generation += 1
        return freed

    def forward_all(self, fn: Callable[[Any, Any], Any], x: Any) -> Any:
        """x through every block: x = fn(block, x)."""
        for block in self:
            x = fn(block, x)
        return x

    def __iter__(self) -> Iterator[Any]:
        self._make_slots()  # free() may have given them back; resident blocks stay as free() left them
        order = [i for i, r in enumerate(self._resident) if r is None]
        compute = torch.cuda.current_stream(self.device) if self._copy_stream is not None else None

        def issue(k: int) -> None:
            """Streamed block order[k] to slot k % 2, after the block that last used the slot (free event)."""
            s, i = k % self.slot_count, order[k]
            if self._held[s] == i:
                return  # the slot still holds it (from the last pass): no copy
            if compute is not None:
                self._copy_stream.wait_event(self._free_events[s])
            self._staged[i].copy_to(self._slots[s], self._copy_stream)
            if compute is not None:
                self._ready_events[s].record(self._copy_stream)
                # The slot allocated on the compute stream is written on the copy stream: if the slots are
                # dropped (free(), the model goes) with this copy in flight, the allocator waits for it.
                self._slots[s].record_stream(self._copy_stream)
            self._held[s] = i

        k = 0
        try:
            for j in range(min(self.slot_count, len(order))):
                issue(j)
            for i, r in enumerate(self._resident):
                if r is not None:
                    yield r[1]
                    continue
                s = k % self.slot_count
                if compute is not None:
                    compute.wait_event(self._ready_events[s])
                yield self._layouts[i].on(self._slots[s])
                if compute is not None:
                    self._free_events[s].record(compute)
                if k + self.slot_count < len(order):
                    issue(k + self.slot_count)
                k += 1
            if compute is not None:
                # The next pass's first blocks copy as soon as their slots are free, now: their copies overlap
                # this pass's last blocks and whatever runs between passes (seen at 0% resident: ~8% of a
                # Z-Image step when they waited for the next pass to begin). That pass finds them held.
                for j in range(min(self.slot_count, len(order))):
                    issue(j)
        finally:
            # A pass stopped early (cancel) may leave work using either slot enqueued: the next copies wait.
            if compute is not None and k < len(order):
                for event in self._free_events:
                    event.record(compute)
