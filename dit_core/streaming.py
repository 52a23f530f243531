"""Streamed blocks: the resident blocks spread over the depth, the others staged in host memory and copied to two
device slots ahead of their use on a copy stream; free() gives memory back and refill() takes it again
(issue 5; seed 003: Weights, Ltx.free)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .staging import Staged, host_buffer, stage

SLOTS = 2  # one slot is copied into while the block in the other runs


def spread(n: int, k: int) -> list[bool]:
    """k of n positions marked, evenly spaced and the first among them: a streamed block's copy then overlaps
    the resident blocks before it all through a pass, not only at its end."""
    if not 0 <= k <= n:
        raise ValueError(f"cannot keep {k} of {n} blocks")
    # Bresenham's line from the end: position i is kept when floor((n - i) k / n) steps there.
    return [(n - i) * k // n > (n - 1 - i) * k // n for i in range(n)]


def plan(block_bytes: Sequence[int], budget: int, slot_bytes: int | None = None) -> list[bool]:
    """Which blocks stay on the device (True) within budget bytes: all when they fit; else the two slots of
    slot_bytes each (by default the largest block) first, then as many blocks as fit, spread over the depth."""
    n = len(block_bytes)
    if sum(block_bytes) <= budget:
        return [True] * n
    slot = max(block_bytes) if slot_bytes is None else slot_bytes
    need = SLOTS * slot
    if budget < need:
        raise ValueError(f"a GPU budget of {budget} bytes ({budget / 2**30:.2f} GiB) cannot stream these blocks: "
                         f"the {SLOTS} slots they copy into need {need} bytes ({need / 2**30:.2f} GiB); raise "
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


def gpu_budget(device: torch.device | str, reserve_bytes: int) -> int:
    """The device's free memory less reserve_bytes (what a pass needs besides the weights)."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(0, free - reserve_bytes)


class StreamedBlocks:
    """A stack of blocks that runs within a device memory budget. Iterating yields each block ready to run, in
    order: a resident one as is, a streamed one viewed on its slot once its copy has landed (an event the
    compute stream waits on; no device-wide synchronize). Each copy is issued as soon as its slot is free: after
    the block that last used it was enqueued. On the CPU the same path runs with plain tensors and synchronous
    copies. files[i]: stage's files for block i (tensors read from the checkpoint straight into host memory)."""

    def __init__(self, blocks: Sequence[Any], device: torch.device | str, budget: int,
                 files: Sequence[dict] | None = None):
        self.device = torch.device(device)
        staged = [b if isinstance(b, Staged) else stage(b, files[i] if files else None)
                  for i, b in enumerate(blocks)]
        if not staged:
            raise ValueError("StreamedBlocks needs at least one block")
        self._layouts = [s.layout() for s in staged]
        self._bytes = [s.nbytes for s in staged]
        self.slot_bytes = max(self._bytes)
        self._staged: list[Staged | None] = staged
        self._resident: list[tuple[torch.Tensor, Any] | None] = [None] * len(staged)
        self._slots: list[torch.Tensor] = []
        self._held: list[int | None] = [None] * SLOTS
        cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self._free_events = [torch.cuda.Event() for _ in range(SLOTS)] if cuda else []
        self._ready_events = [torch.cuda.Event() for _ in range(SLOTS)] if cuda else []
        self.budget = budget
        self.wanted = plan(self._bytes, budget, self.slot_bytes)
        self.refill()
        # The host holds only what the device does not: a resident block is staged again when free() drops it.
        for i, r in enumerate(self._resident):
            if r is not None:
                self._staged[i] = None

    def __len__(self) -> int:
        return len(self._layouts)

    @property
    def resident(self) -> list[bool]:
        return [r is not None for r in self._resident]

    def device_bytes(self) -> int:
        """Bytes the blocks hold on the device now: resident blocks and slots."""
        return sum(b for b, r in zip(self._bytes, self._resident) if r is not None) + \
            sum(s.numel() for s in self._slots)

    def host_bytes(self) -> int:
        """Bytes of staged copies in (page-locked) host memory."""
        return sum(s.nbytes for s in self._staged if s is not None)

    def refill(self, budget: int | None = None) -> int:
        """Puts the wanted blocks (the plan of budget, by default the last one) back on the device, each from its
        staged copy, which stays (a later free() needs no copy back); returns the bytes it copied."""
        if budget is not None:
            self.budget, self.wanted = budget, plan(self._bytes, budget, self.slot_bytes)
        copied = 0
        for i, want in enumerate(self.wanted):
            if want and self._resident[i] is None:
                buf = torch.empty(self._bytes[i], dtype=torch.uint8, device=self.device)
                self._staged[i].copy_to(buf)  # synchronous: outside the loop
                self._resident[i] = (buf, self._layouts[i].on(buf))
                copied += self._bytes[i]
        self._make_slots()
        return copied

    def _make_slots(self) -> None:
        if not all(self.resident) and not self._slots:
            self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
                           for _ in range(SLOTS)]
            self._held = [None] * SLOTS

    def free(self, nbytes: int) -> int:
        """Gives at least nbytes of device memory back where the blocks hold that much: resident blocks leave
        (staged first when they hold no host copy) so that those kept stay spread, then the slots (a later pass
        makes them again). Returns the bytes given back."""
        if self._copy_stream is not None:
            self._copy_stream.synchronize()  # copies in flight still write the slots
        resident = [i for i, r in enumerate(self._resident) if r is not None]
        freed = 0
        for j in reversed(keep_order(len(resident))):
            if freed >= nbytes:
                break
            i = resident[j]
            buf = self._resident[i][0]
            if self._staged[i] is None:
                host = host_buffer(buf.numel())
                host.copy_(buf)  # device to host, blocking: buf is released next
                self._staged[i] = Staged(self._layouts[i].template, buf.numel(), host)
            self._resident[i] = None
            freed += buf.numel()
        if freed < nbytes and self._slots:
            freed += sum(s.numel() for s in self._slots)
            self._slots, self._held = [], [None] * SLOTS
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
            s, i = k % SLOTS, order[k]
            if self._held[s] == i:
                return  # the slot still holds it (from the last pass): no copy
            if compute is not None:
                self._copy_stream.wait_event(self._free_events[s])
            self._staged[i].copy_to(self._slots[s], self._copy_stream)
            if compute is not None:
                self._ready_events[s].record(self._copy_stream)
            self._held[s] = i

        k = 0
        try:
            for j in range(min(SLOTS, len(order))):
                issue(j)
            for i, r in enumerate(self._resident):
                if r is not None:
                    yield r[1]
                    continue
                s = k % SLOTS
                if compute is not None:
                    compute.wait_event(self._ready_events[s])
                yield self._layouts[i].on(self._slots[s])
                if compute is not None:
                    self._free_events[s].record(compute)
                if k + SLOTS < len(order):
                    issue(k + SLOTS)
                k += 1
        finally:
            # A pass stopped early (cancel) may leave work using either slot enqueued: the next copies wait.
            if compute is not None and k < len(order):
                for event in self._free_events:
                    event.record(compute)
