"""Arrival counters: programs that share a piece of work count themselves in, and either the one counted last does
the step that needs all of them (kernels/split_tail.py: a tile's parts along K; no program waits for another), or
each waits until all are in (kernels/int8_quant.py: a row block's groups, each needing the others' maxima).

Issue 4. A program stores its share, then counts in: a barrier (every thread's stores issued) and one atomic add
with acquire-release semantics at GPU scope, so a program that sees the count complete sees every counted program's
stores (it reads them with .cg loads, from L2). Counters go back to 0 (`counter_reset`, or the last of `leave`):
each launch finds them at 0. Waiting is safe only in order: a program takes a `ticket` (the order programs
started in) and its peers are the tickets beside its own, so the programs waited on have started or start next;
with at least as many programs resident as peers (the launcher checks peers <= SMs), the first row of peers
completes whatever else runs, and so on. The buffers are made once per device and stream and kept, outside CUDA
graph capture (made during one, they would belong to the graph's memory pool): `kept` returns None then, and the
caller runs its path without counters. Launches on one stream run one after another, so they may share a stream's
buffers; a graph is captured on the stream its warm-up ran on (dit_core/step_graph.py), so the capture finds them.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

_KEPT: dict[tuple, torch.Tensor] = {}


def kept(device: torch.device, numel: int, zeroed: bool = True):
    """An int32 buffer of at least `numel` values for this device and its current stream, zeroed (counters) or not
    (small ones a power of two, at least 64: few sizes, each kept), shared by the kernels that ask for it on that
    stream (each launch leaves its counters at 0); None while a CUDA graph is being captured and it is not made yet."""
    size = max(64, 1 << (numel - 1).bit_length()) if numel <= 1 << 16 else numel
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (torch.device(device), stream, size, zeroed)
    if key not in _KEPT:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _KEPT[key] = (torch.zeros if zeroed else torch.empty)(size, dtype=torch.int32, device=device)
    return _KEPT[key]


def counters_left() -> int:
    """The sum of every kept counter (tests: each launch leaves them at 0)."""
    return sum(int(t.abs().sum()) for (*_, zeroed), t in _KEPT.items() if zeroed)


@triton_jit
def counted_last(count_ptr, index, total):
    """After this program's stores: count it in at counter `index`; True for the program counted last of `total`."""
    tl.debug_barrier()  # every thread's stores issued before the counter (released at GPU scope) says so
    return tl.atomic_add(count_ptr + index, 1, sem="acq_rel", scope="gpu") == total - 1


@triton_jit
def counter_reset(count_ptr, index):
    tl.atomic_xchg(count_ptr + index, 0)


@triton_jit
def ticket(count_ptr, total):
    """This program's place (0 .. total - 1) in the order the launch's `total` programs started, from counter 0; the
    program with the last ticket sets it back to 0 (every other ticket is taken by then)."""
    place = tl.atomic_add(count_ptr, 1, sem="relaxed", scope="gpu")
    if place == total - 1:
        counter_reset(count_ptr, 0)
    return place


@triton_jit
def wait_for_peers(count_ptr, index, peers):
    """After this program's stores: count it in at counter `index` and wait until all `peers` are in; then every
    peer's stores before its count are visible (to .cg loads). Each peer must `leave` after its last read."""
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr + index, 1, sem="acq_rel", scope="gpu") + 1
    while count < peers:
        count = tl.atomic_add(count_ptr + index, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton_jit
def leave(count_ptr, index, peers):
    """Count out of wait_for_peers' counter: the last peer out sets it back to 0 (no peer reads it after that)."""
    if tl.atomic_add(count_ptr + index, 1, sem="relaxed", scope="gpu") == 2 * peers - 1:
        counter_reset(count_ptr, index)
