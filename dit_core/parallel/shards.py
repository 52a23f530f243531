"""Sequence parallelism of the shared block: a step's packed rows split across ranks, attention by all-to-all over
heads (Ulysses, arXiv 2309.14509), everything else local to each rank's rows.

A rank holds a share of the rows: every run of rows sharing a modulation row (text, keyframes, references, audio,
video) is cut into one contiguous piece a rank, the pieces' leftover rows dealt out in turn, so each rank holds about
1/world of every kind of row and the shares differ by one row at most. Norms, modulation rows, linears and the MLP
need nothing from other ranks. Attention does: each rank sends every other rank its rows' q, k and v of that rank's
heads/world heads, attends the whole sequence for its heads (the rows put back in packed order: one process's
arithmetic, a bias as given), and sends the rows back. Where the heads do not divide by the world (56 heads on 3
GPUs) they are padded to a multiple of it with copies of the first heads, whose outputs are dropped: each head's
attention is its own, so the others' arithmetic is unchanged (a few percent more attention, no ring over key blocks
needed while there are at least as many heads as ranks; fewer are refused, as are grouped key heads that do not
divide).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from ..block import GroupBias, attention
from ..sequence import AngleFactors, Sequence, runs_of


@dataclass(frozen=True)
class Ranks:
    """The ranks one step runs on: this process's rank, the world's size, and their process group (None: the
    default group)."""
    rank: int
    world: int
    group: object = None

    @staticmethod
    def current(group=None) -> Ranks:
        """The ranks of the initialised process group `group` (None: the default)."""
        return Ranks(dist.get_rank(group), dist.get_world_size(group), group)


def shares(runs: list[tuple[int, int]], world: int) -> list[torch.Tensor]:
    """Each rank's rows [n_r] long of the runs (first, end) that cover the rows: every run cut into world contiguous
    pieces in rank order, a run's leftover rows going to the ranks next in turn (so 1-row runs are dealt round)."""
    pieces, turn = [[] for _ in range(world)], 0
    for first, end in runs:
        base, extra = divmod(end - first, world)
        start = first
        for r in range(world):
            n = base + ((r - turn) % world < extra)
            pieces[r].append(torch.arange(start, start + n))
            start += n
        turn = (turn + extra) % world
    return [torch.cat(p) if p else torch.zeros(0, dtype=torch.long) for p in pieces]


@dataclass(frozen=True)
class SequenceShards:
    """One step's rows across the ranks: rows (this rank's, [n_r] long, indexes of the packed rows), counts (every
    rank's share, in rank order) and order (every rank's rows concatenated in rank order: the row order attention
    sees)."""
    ranks: Ranks
    rows: torch.Tensor
    counts: tuple[int, ...]
    order: torch.Tensor
    # rows and order where the step runs, copied there once (each block's attention reads them several times)
    _placed: dict = field(default_factory=dict, compare=False, repr=False)

    def _on(self, name: str, device: torch.device) -> torch.Tensor:
        key = (name, device)
        if key not in self._placed:
            self._placed[key] = getattr(self, name).to(device)
        return self._placed[key]

    @staticmethod
    def split(ranks: Ranks, map_: torch.Tensor, heads: tuple[int, int] | None = None) -> SequenceShards:
        """The rows of a sequence whose modulation rows are map_ [rows], balanced by its runs (shares). heads:
        (query heads, key/value heads) of the attention the rows go through, checked here, before any work."""
        parts = shares([(first, end) for first, end, _ in runs_of(map_.cpu())], ranks.world)
        shards = SequenceShards(ranks, parts[ranks.rank], tuple(p.numel() for p in parts), torch.cat(parts))
        if heads is not None:
            shards.check_heads(*heads)
        return shards

    @property
    def total(self) -> int:
        return self.order.numel()

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full rows x [rows, ...]."""
        return x[self._on("rows", x.device)]

    def sequence(self, s: Sequence) -> Sequence:
        """This rank's rows of s: its map, rotary tables and angles' positions (starts recomputed)."""
        if s.group and self.ranks.world > 1:
            raise ValueError(f"sequence parallel: attention in groups of {s.group} rows cannot split across ranks "
                             "(the rows of a group would sit on different ranks); run this step on one rank")
        # (a host map with device tables: starts kept)
        at = lambda t: None if t is None else t[self._on("rows", t.device)]  # noqa: E731
        angles = None if s.angles is None else AngleFactors(at(s.angles.positions), s.angles.freqs, s.angles.ends)
        by_axis = None if s.by_axis is None else replace(s.by_axis, index=at(s.by_axis.index))
        return Sequence(at(s.map), at(s.cos), at(s.sin), 0, angles, by_axis=by_axis)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The full rows [total, ...] on every rank from each rank's share x [n_r, ...] (padded to the largest share
        for all_gather, which wants equal sizes)."""
        if self.ranks.world == 1:
            return x
        most = max(self.counts)
        padded = x.new_zeros(most, *x.shape[1:])
        padded[:x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(self.ranks.world)]
        dist.all_gather(parts, padded, group=self.ranks.group)
        out = x.new_empty(self.total, *x.shape[1:])
        out[self._on("order", x.device)] = torch.cat([p[:n] for p, n in zip(parts, self.counts)])
        return out

    def check_heads(self, heads: int, key_heads: int) -> None:
        """Ulysses gives each rank whole heads (padded_heads): refuse fewer heads than ranks, and grouped key heads
        that do not divide by the world (padding would break which key head serves which query head)."""
        padded_heads(heads, key_heads, self.ranks.world)

    def padded(self, heads: int) -> int:
        """The heads attention runs for `heads` (query and key heads alike where they pad): padded_heads' share of
        every rank."""
        return padded_heads(heads, heads, self.ranks.world) * self.ranks.world

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int = 0,
                  key_bias: torch.Tensor | GroupBias | None = None,
                  keys: SequenceShards | None = None) -> torch.Tensor:
        """block.attention of this rank's rows q [n_r, heads, head] against every rank's keys k, v [m_r, key heads,
        head] (across). keys: the shards of the key rows where they are another sequence's (LTX-2.5's A<->V; None:
        these rows). key_bias [keys], [queries, keys] or a GroupBias (LTX-2.5's guides), in packed order, as one
        process gives it. Returns [n_r, heads x head], as block.attention."""
        if self.ranks.world == 1:
            return attention(q, k, v, group, key_bias)
        if group:
            raise ValueError(f"sequence parallel: attention in groups of {group} rows cannot split across ranks")
        return self.across(lambda q, k, v: attention(q, k, v, 0, key_bias), q, k, v, keys)

    def across(self, kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], q: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor, keys: SequenceShards | None = None) -> torch.Tensor:
        """kernel(q, k, v) -> o [total, ...] (q, k, v [total, heads/world, head]: every rank's rows of this rank's
        heads, in packed order, so the kernel does one process's arithmetic head by head and a bias applies as
        given) run on this rank's rows q [n_r, heads, head], k and v [m_r, key heads, head]: to_heads, to_packed,
        the kernel, back to rank order, to_rows. Returns [n_r, heads x head]. Host attention and the GPU kernels
        (dit_core/gpu/block.py, pieces.py) run through it."""
        keys = self if keys is None else keys
        gq, gk, gv = self.to_heads(q, k, v, keys)
        o = kernel(self.to_packed(gq), keys.to_packed(gk), keys.to_packed(gv))
        return self.to_rows(self.to_rank_order(o.reshape(o.shape[0], -1)), q.shape[1])

    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 keys: SequenceShards | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's rows of every head (q [n_r, heads, head], k and v [m_r, key heads, head]) -> every rank's
        rows of this rank's heads (q [total, heads/world, head], k and v [keys' total, key heads/world, head], in
        rank order): one all-to-all (two where keys are another sequence's)."""
        w, keys = self.ranks.world, self if keys is None else keys
        n, heads, head = q.shape
        self.check_heads(heads, k.shape[1])
        if n != self.rows.numel() or k.shape[0] != keys.rows.numel() or keys.ranks.world != w:
            raise ValueError(f"sequence parallel: rank {self.ranks.rank} holds {self.rows.numel()} query and "
                             f"{keys.rows.numel()} key rows, got {n} and {k.shape[0]} (keys not split as its "
                             "rows, or by another world)")
        q, k, v = (_padded(t, self.padded(t.shape[1])) for t in (q, k, v))
        hq, hk = q.shape[1] // w, k.shape[1] // w
        # One buffer to each rank j: this rank's rows of j's slice of the heads, [q | k | v] where keys are the rows.
        if keys is self:
            return self._exchange(torch.cat([t.reshape(n, w, -1, head) for t in (q, k, v)], 2),
                                  self.counts).split([hq, hk, hk], 1)
        gk, gv = self._exchange(torch.cat([t.reshape(-1, w, hk, head) for t in (k, v)], 2), keys.counts).split(
            [hk, hk], 1)
        return self._exchange(q.reshape(n, w, hq, head), self.counts), gk, gv

    def to_rows(self, o: torch.Tensor, heads: int) -> torch.Tensor:
        """to_heads' inverse for the output: o [total, padded heads/world x head] (every rank's rows of this rank's
        heads) -> [n_r, heads x head], this rank's rows of every head (the padding heads dropped)."""
        w, n = self.ranks.world, self.rows.numel()
        o = o.reshape(self.total, self.padded(heads) // w, -1)
        back = o.new_empty(w * n, *o.shape[1:])
        dist.all_to_all_single(back, o.contiguous(), [n] * w, list(self.counts), group=self.ranks.group)
        # [n, world, heads a rank, head] in head order: the padding heads are the last ones
        return back.reshape(w, n, *o.shape[1:]).transpose(0, 1).reshape(n, -1, o.shape[-1])[:, :heads].reshape(n, -1)

    def to_packed(self, t: torch.Tensor) -> torch.Tensor:
        """t [total, ...] in rank order (to_heads' rows) -> the packed order: attention then runs on the rows
        exactly as one process lays them out, so a bias keeps its key spans (GroupBias.key_spans)."""
        out = torch.empty_like(t)
        out[self._on("order", t.device)] = t
        return out

    def to_rank_order(self, t: torch.Tensor) -> torch.Tensor:
        """to_packed's inverse: t [total, ...] in packed order -> rank order (what to_rows takes)."""
        return t[self._on("order", t.device)]

    def _exchange(self, t: torch.Tensor, counts: tuple[int, ...]) -> torch.Tensor:
        """t [m_r, world, h, head] (this rank's rows, by the rank whose heads they are) -> [sum(counts), h, head]:
        every rank's rows of this rank's heads, in rank order."""
        m, w = t.shape[0], self.ranks.world
        got = t.new_empty(sum(counts), *t.shape[2:])
        dist.all_to_all_single(got, t.transpose(0, 1).reshape(w * m, *t.shape[2:]).contiguous(), list(counts),
                               [m] * w, group=self.ranks.group)
        return got


def padded_heads(heads: int, key_heads: int, world: int) -> int:
    """The heads each rank attends for `heads` query and `key_heads` key heads over `world` ranks (padded to a
    multiple of the world where they do not divide); ValueError where they cannot be split."""
    if heads < world:
        raise ValueError(f"sequence parallel over {world} ranks gives each rank whole heads (Ulysses): {heads} heads "
                         f"are fewer than the ranks; use {heads} GPUs or fewer")
    if key_heads != heads and (heads % world or key_heads % world):
        raise ValueError(f"sequence parallel over {world} ranks: {heads} heads sharing {key_heads} key/value heads "
                         f"do not divide by {world}; use a number of GPUs that divides {key_heads}")
    return -(-heads // world)


def _padded(t: torch.Tensor, heads: int) -> torch.Tensor:
    """t [rows, h, head] with heads - h more heads, copies of its first ones (their attention is dropped after)."""
    extra = heads - t.shape[1]
    return t if extra == 0 else torch.cat([t, t[:, :extra]], 1)
