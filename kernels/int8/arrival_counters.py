"""Arrival counters: the programs that share a piece of work count themselves in, and the one counted last does the
step that needs all of them (kernels/int8/split_tail.py: a tile's parts along K). No program waits for another, so
nothing depends on which programs run at the same time.

Issue 4. A program stores its share, then `counted_last`: a barrier (every thread's stores issued) and one atomic add
with acquire-release semantics at GPU scope, so the program counted last sees every earlier program's stores (it
reads them with .cg loads, from L2). That program sets the counter back to 0 (`counter_reset`): each launch finds
its counters at 0. The buffers are made once per device and stream and kept, outside CUDA graph capture (made during
one, they would belong to the graph's memory pool): `kept` returns None then, and the caller runs its path without
counters. Launches on one stream run one after another, so they may share a stream's buffers; a graph is captured on
the stream its warm-up ran on (dit_core/gpu/step_graph.py), so the capture finds them.
"""
from __future__ import annotations

import torch

from ..jit import triton_jit

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without Triton: the references still import
    triton = tl = None

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
