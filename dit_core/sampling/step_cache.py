"""The step cache (First Block Cache) and the reference rows' keys and values kept between steps (refresh).

Both follow the design documents (seed 001: StepCache, Flux.sample's `refresh`, RefSlot) and serve FLUX.3
Klein's joint blocks; the model calls `joint_blocks` in place of its plain block loop
(families/flux3_klein.py), so neither the model nor the shared block knows about caching (gpt-fast's habit: a
speed feature in its own file).

First Block Cache (ParaAttention's, as seed 001's StepCache): each step runs the first joint block and takes
its residual r = x1 - x (x the rows entering the joint blocks, x1 after the first). With r_full the residual
of the last step that ran every block,

    change = mean |r - r_full| / mean |r_full|        (relative L1 over every tracked row and channel)

and when change < limit the step skips the other blocks and returns x1 + R_full, R_full being the last full
step's residual of the other blocks (their output minus x1). Skipped steps leave r_full and R_full alone, so
the change is measured since the last full step (it accumulates over consecutive skips). limit 0 runs every
block and stores nothing: the plain loop exactly. Steps before `start` run every block (WanGP's start step).
Only the first `rows` rows (text and image: FLUX.3's rows that change each step) are tracked; reference rows
are not read after the blocks.
"""
from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..arch import Arch
from ..block import Block, NormStats
from ..modulation import Modulation
from ..sequence import Sequence

StepFn = Callable[[int, Block, torch.Tensor], torch.Tensor]


def relative_change(residual: torch.Tensor, previous: torch.Tensor, previous_l1: torch.Tensor | None = None) -> float:
    """mean |residual - previous| / mean |previous| (ParaAttention's are_two_tensors_similar), in f32: as sums (the
    same count divides both), the difference's in one reduction; previous_l1: sum |previous| where already known
    (a step cache keeps it with the residual it compares against)."""
    r, p = residual.float(), previous.float()
    base = torch.linalg.vector_norm(p, 1) if previous_l1 is None else previous_l1
    return (torch.linalg.vector_norm(r - p, 1) / base.clamp_min(1e-12 * p.numel())).item()


@dataclass
class StepCache:
    """One sampler run's step cache: `limit` on the first joint block's relative residual change (0: every
    block), `start` the first step allowed to skip. Counts: `steps` seen, `skipped` of them, `ran` the rest;
    `changes` the measured change per step (None where none was measured). One cache per image and per
    conditioning (a CFG's negative pass keeps its own)."""
    limit: float = 0.0
    start: int = 0
    steps: int = 0
    skipped: int = 0
    changes: list = field(default_factory=list)
    first: torch.Tensor | None = field(default=None, repr=False)   # r_full
    first_l1: torch.Tensor | None = field(default=None, repr=False)  # sum |r_full|
    rest: torch.Tensor | None = field(default=None, repr=False)    # R_full

    def __post_init__(self):
        if not self.limit >= 0:
            raise ValueError(f"StepCache: limit must be >= 0 (0 runs every block), got {self.limit}")
        if self.start < 0:
            raise ValueError(f"StepCache: start must be a step >= 0, got {self.start}")

    @property
    def ran(self) -> int:
        return self.steps - self.skipped

    def fresh(self) -> StepCache:
        """An empty cache with the same limit and start (for another image or conditioning)."""
        return StepCache(self.limit, self.start)

    def run(self, blocks: Seq[Block], x: torch.Tensor, step: StepFn, check: Callable[[], None],
            rows: int) -> torch.Tensor:
        """The blocks over x (step(i, block, x) runs block i), skipping all but the first where allowed. The
        blocks are walked once, in order: streamed ones (dit_core/gpu/streaming.py) copy ahead of their use."""
        with _walk(blocks) as walk:
            x1 = step(*next(walk), x)
            check()
            return self.after_first(x, x1, rows, lambda y: _loop(walk, y, step, check))

    def after_first(self, x: torch.Tensor, x1: torch.Tensor, rows: int,
                    rest: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """A step once its first block has run (x in, x1 out): x1 + R_full where the change allows a skip, else
        rest(x1), the other blocks; the counts and the stored residuals kept. A CUDA-graphed step (Flux3Klein.
        graphed) replays its first block and its rest as two graphs around this host decision."""
        index, self.steps = self.steps, self.steps + 1
        if self.limit == 0:  # nothing measured or stored: the plain loop
            self.changes.append(None)
            return rest(x1)
        first = x1[:rows] - x[:rows]
        change = None
        if self.first is not None and self.first.shape == first.shape:
            change = relative_change(first, self.first, self.first_l1)
        self.changes.append(change)
        if index >= self.start and change is not None and change < self.limit:
            self.skipped += 1
            return torch.cat([x1[:rows] + self.rest, x1[rows:]])
        out = rest(x1)
        self.first, self.rest = first, out[:rows] - x1[:rows]
        self.first_l1 = torch.linalg.vector_norm(first.float(), 1)
        return out


@dataclass
class RefSlots:
    """The reference rows' keys and values of each joint block (seed 001 RefSlot), for `refresh`: steps 0,
    refresh, 2 refresh, ... record them while running every row; the others run only the rows before the
    references ([text | image]) and attend to the recorded keys and values. An approximation: the reference
    rows would take each step's target embedding (flow map). Set `record` per step with `begin`. A recording
    step that the step cache skips records the first block only; the others keep their earlier keys and
    values."""
    refresh: int
    record: bool = True
    kv: dict = field(default_factory=dict)   # joint block index -> (k, v) [reference rows, heads, head]

    def __post_init__(self):
        if self.refresh < 1:
            raise ValueError(f"RefSlots: refresh must be >= 1 (steps between recordings), got {self.refresh}")

    def begin(self, step: int) -> None:
        self.record = step % self.refresh == 0 or not self.kv

    def parallel(self, i: int, block: Block, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence,
                 rows: int, keep_input: bool = True, carry=None, options=None) -> torch.Tensor:
        """Block.parallel with block i's reference keys and values recorded (x holds every row) or read (x
        holds the first `rows` rows only): a recording step equals Block.parallel."""
        def keys_values(k: torch.Tensor, v: torch.Tensor):
            if self.record:
                # Copies: slices would keep the block's whole k and v (every row) alive until the next recording.
                self.kv[i] = (k[rows:].clone(), v[rows:].clone())
                return k, v
            ref_k, ref_v = self.kv[i]
            return torch.cat([k, ref_k]), torch.cat([v, ref_v])

        return block.parallel(a, x, m, s, keys_values, keep_input, carry, options)


@contextmanager
def _walk(blocks: Seq[Block]):
    """(index, block) of blocks in order; a walk left early is closed at once, so that streamed blocks
    order their next copies after the work already enqueued (StreamedBlocks.__iter__'s finally)."""
    walk = iter(blocks)
    try:
        yield ((i, block) for i, block in enumerate(walk))
    finally:
        close = getattr(walk, "close", None)
        if close is not None:
            close()


def _loop(walk, x: torch.Tensor, step: StepFn, check: Callable[[], None]) -> torch.Tensor:
    for i, block in walk:
        x = step(i, block, x)
        check()
    return x


def joint_blocks(blocks: Seq[Block], a: Arch, x: torch.Tensor, m: Modulation, s: Sequence,
                 check: Callable[[], None], rows: int, cache: StepCache | None = None,
                 slots: RefSlots | None = None, options=None) -> torch.Tensor:
    """FLUX.3's joint blocks over x ([text | image | references] rows; the first `rows` are text and image),
    with the step cache and the reference slots when given; neither given: Block.parallel block by
    block. options: the model's GPU options (dit_core/gpu/options.py), given to each block; their carry_norms
    off, no statistics carried."""
    # StepCache.after_first reads the inputs of blocks 0 and 1 after them: the later blocks update their rows in
    # place. carry: each block's norm statistics from the block before (GPU blocks; every block's input is the
    # output of the block before, whether the cache skips the others or not), from block 1 on, as the graphed
    # step (Flux3Klein.graphed) carries them within its second graph: block 1 makes its own, so both give the same
    # bits (statistics from the parts differ from a pass's by f32 ulps).
    carry = NormStats.of(x) if options is None or options.carry_norms else None
    if slots is None:
        step = lambda i, block, y: block.parallel(a, y, m, s, keep_input=i < 2, carry=carry if i else None,
                                                  options=options)
    else:
        step = lambda i, block, y: slots.parallel(i, block, a, y, m, s, rows, keep_input=i < 2,
                                                  carry=carry if i else None, options=options)
    if cache is not None:
        return cache.run(blocks, x, step, check, rows)
    with _walk(blocks) as walk:
        return _loop(walk, x, step, check)
