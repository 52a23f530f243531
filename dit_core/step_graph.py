"""A model step replayed as a CUDA graph: one capture per input shape, then each call copies its inputs into the
captured ones and replays.

Why: a Z-Image step at 1024x1024 launches about 1350 kernels (886 of them Triton) for 96.5 ms of GPU work; on a
host that launches slowly the GPU waits between them (docs/benchmarks.md: the same kernels took 101.7 ms on one
machine and 134.2 ms on another). A replay launches the whole step at once.

What a step must be for this: a function of tensors only (a timestep too: ZImage.output_at takes t, not sigma),
with nothing in it that waits for the host or copies from it, every tensor it reads besides its inputs staying
where it is while the graph lives (weights resident, not streamed: a streamed block's slot is refilled between
steps), and every Triton kernel compiled and tuned before the capture (the first, eager call on a side stream does
that). A replay cannot be cancelled within the step: cancel is asked between steps.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

MAX_SHAPES = 4  # graphs kept: each holds its own pool of the step's temporaries (about 0.6 GB for Z-Image)


class GraphedStep:
    """step(*tensors) -> a tensor or a tuple of tensors, replayed from a CUDA graph captured at the first call of
    each input shape."""

    def __init__(self, step: Callable[..., torch.Tensor]):
        self.step = step
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]] = {}

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_SHAPES:  # the oldest shape's graph and pool go first
                del self.graphs[next(iter(self.graphs))]
            entry = self.graphs[key] = self._capture(inputs)
        graph, statics, out = entry
        for static, t in zip(statics, inputs):
            static.copy_(t)
        graph.replay()
        # The next replay overwrites `out`: the caller gets its own copy (of each tensor of a tuple).
        return tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()

    def _capture(self, inputs) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]:
        statics = [t.clone() for t in inputs]
        side = torch.cuda.Stream(device=statics[0].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile, tune and fill the caches outside the capture
            self.step(*statics)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.step(*statics)
        return graph, statics, out

    def clear(self) -> None:
        """Drop every graph and its pool (before the weights it reads move or go)."""
        self.graphs.clear()
