"""Packed rows of one sequence: their modulation rows (the map), rotary cos/sin, and attention groups."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AngleFactors:
    """The rotary angles as positions times frequencies: angle[row, j] = positions[row, axis(j)] * freq[j], axis(j)
    the axis whose columns hold j (ends: the first columns of axes 1, 2, 3), freq the float64 frequency as two f32
    (freqs [hi; lo]). The fused QKV's epilogue on Hopper makes cos and sin from these (kernels/int8/hopper_epilogues.py)
    rather than reading the [rows, R] tables."""
    positions: torch.Tensor  # [rows, 4] float32 (axes past the rotary's: 0)
    freqs: torch.Tensor  # [2, R] float32: hi, lo
    ends: tuple[int, int, int]

    def as_args(self) -> tuple:
        return self.positions, self.freqs, self.ends


@dataclass(frozen=True)
class AxisAngles:
    """Rotary angles that depend on a row only through its coordinate on each axis (LTX-2.5's split rotary): cos, sin
    [T, F] of each axis's distinct coordinates times its frequencies (row 0: the zero angle of padding columns),
    index [rows, A] each row's table row on each axis, axis and freq [heads, r] each angle column's. A row's angles
    are cos[index[row, axis], freq]: the full tables' values from a few hundred KB where those take rows x heads x r
    (115 MB each at LTX-2.5's stage 2, read by every q and k)."""
    cos: torch.Tensor
    sin: torch.Tensor
    index: torch.Tensor
    axis: torch.Tensor
    freq: torch.Tensor

    def by_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [rows, heads, r]: every row's angles."""
        at = self.index.long()[:, self.axis.long()]
        freq = self.freq.long()
        return self.cos[at, freq], self.sin[at, freq]

    def to(self, device) -> "AxisAngles":
        return AxisAngles(*(t.to(device) for t in (self.cos, self.sin, self.index, self.axis, self.freq)))


@dataclass(frozen=True)
class Sequence:
    """The rows of one packed sequence, where the block runs.

    map: [rows] long, each row's modulation row. cos, sin: [rows, rotary/2] of each row's rotary angles (per axis
    its frequencies, concatenated axis by axis), or [rows, heads, rotary/2] where each head turns by its own
    (LTX-2.5). group: rows attend within consecutive groups of that many rows (0: all rows), as the tiles of a
    VAE. angles: the tables' angles as factors, where they have them. starts: the first row of each run of rows
    sharing a modulation row (host ints; from a map made on the host, else None): where every run starts on one of
    its row blocks, the quantizer reads each block's modulation row as vectors. by_axis: the per-head angles by axis
    in place of cos and sin (None), which rotary() expands.
    """
    map: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    group: int = 0
    angles: AngleFactors | None = None
    starts: tuple[int, ...] | None = None
    by_axis: AxisAngles | None = None

    def __post_init__(self):
        if self.starts is None and self.map.device.type == "cpu":
            object.__setattr__(self, "starts", tuple(first for first, _, _ in runs_of(self.map)))
        rows = self.map.shape[0]
        if self.by_axis is not None:
            if self.cos is not None or self.by_axis.index.shape[0] != rows:
                raise ValueError(f"sequence of {rows} rows given angles by axis for "
                                 f"{self.by_axis.index.shape[0]} rows (and no cos/sin tables beside them)")
        elif self.cos.shape != self.sin.shape or self.cos.shape[0] != rows:
            raise ValueError(f"sequence of {rows} rows given rotary tables {tuple(self.cos.shape)}")
        if self.angles is not None and self.angles.positions.shape[0] != rows:
            raise ValueError(f"sequence of {rows} rows given angles of {self.angles.positions.shape[0]}")
        if self.group and rows % self.group:
            raise ValueError(f"{rows} rows do not split into attention groups of {self.group}")

    @property
    def rows(self) -> int:
        return self.map.shape[0]

    def rotary(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of every row: the tables, or the angles by axis expanded."""
        return (self.cos, self.sin) if self.by_axis is None else self.by_axis.by_rows()

    def to(self, device, rotary_dtype: torch.dtype | None = None) -> "Sequence":
        """The sequence on device, its cos/sin in rotary_dtype when given. The map goes int32 on a GPU, as the
        kernels read it: converted once here rather than at each of a step's launches."""
        gpu = torch.device(device).type == "cuda"
        angles = None if self.angles is None else AngleFactors(
            self.angles.positions.to(device), self.angles.freqs.to(device), self.angles.ends)
        on = lambda t: None if t is None else t.to(device, rotary_dtype)  # noqa: E731
        return Sequence(self.map.to(device, torch.int32 if gpu else self.map.dtype), on(self.cos), on(self.sin),
                        self.group, angles, self.starts, None if self.by_axis is None else self.by_axis.to(device))


def runs_of(map_: torch.Tensor) -> list[tuple[int, int, int]]:
    """(first, end, modulation row) of each run of consecutive rows sharing a modulation row."""
    runs, values = [], map_.tolist()
    first = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[first]:
            runs.append((first, i, values[first]))
            first = i
    return runs


def rotary_angles(positions: torch.Tensor, axes: tuple[int, ...], theta: float) -> torch.Tensor:
    """Angles [rows, sum(axes)/2] in float64: per axis of width d, d/2 frequencies theta^(-2k/d) times that
    axis's position (diffusers 0.42.1 transformer_z_image.py RopeEmbedder computes them in float64 too)."""
    if positions.shape[-1] != len(axes):
        raise ValueError(f"positions have {positions.shape[-1]} axes, the rotary tables {len(axes)}")
    parts = []
    for i, d in enumerate(axes):
        freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        parts.append(positions[:, i, None].double() * freqs)
    return torch.cat(parts, dim=-1)


def angle_factors(positions: torch.Tensor, axes: tuple[int, ...], theta: float) -> AngleFactors | None:
    """rotary_angles' factors, or None where the kernel cannot take them: more than 4 axes, 256 frequencies or more,
    or positions that float32 does not hold exactly."""
    half = [d // 2 for d in axes]
    exact = torch.equal(positions.double(), positions.float().double())
    if len(axes) > 4 or sum(half) >= 256 or not exact:
        return None
    freq = torch.cat([1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d) for d in axes])
    freqs = torch.stack([freq.float(), (freq - freq.float().double()).float()])
    ends = [sum(half[:a + 1]) for a in range(len(axes))][:3]
    padded = torch.zeros(positions.shape[0], 4, dtype=torch.float32)
    padded[:, :len(axes)] = positions.float()
    return AngleFactors(padded, freqs, tuple(ends + [sum(half)] * (3 - len(ends))))


def sequence_of(positions: torch.Tensor, map_: torch.Tensor, axes: tuple[int, ...], theta: float,
                dtype: torch.dtype = torch.float32, group: int = 0) -> Sequence:
    """The sequence of rows at integer positions [rows, axes] using modulation rows map_. The angles are rounded
    to dtype before cos/sin, as the references do (float64 keeps them exact)."""
    angles = rotary_angles(positions, axes, theta).to(dtype)
    return Sequence(map_.long(), angles.cos(), angles.sin(), group, angle_factors(positions, axes, theta))


def concat(parts: list[Sequence]) -> Sequence:
    """Sequences joined row-wise (their maps index the same modulation rows); the angles' factors where every part
    has them, with the same frequencies."""
    first = parts[0].angles
    same = first is not None and all(p.angles is not None and p.angles.ends == first.ends and
                                     torch.equal(p.angles.freqs, first.freqs) for p in parts)
    angles = AngleFactors(torch.cat([p.angles.positions for p in parts]), first.freqs, first.ends) if same else None
    # Each part's runs, shifted (a part's first run may continue the last one's: a start too many only makes the
    # quantizer's check stricter).
    offsets = [sum(p.rows for p in parts[:i]) for i in range(len(parts))]
    starts = None if any(p.starts is None for p in parts) else tuple(
        o + first for o, p in zip(offsets, parts) for first in p.starts)
    return Sequence(torch.cat([p.map for p in parts]), torch.cat([p.cos for p in parts]),
                    torch.cat([p.sin for p in parts]), 0, angles, starts)


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary by split halves over the first 2 r values of each head (x [rows, heads, head]): pair (j, j + r) turns
    by angle j. cos/sin [rows, r] turn every head alike; [rows, heads, r] give each head its own angles (LTX-2.5,
    reference/families/ltx25.md section 4). Checkpoints that rotate adjacent pairs are permuted at load
    (reference/families/z_image.md section 6, checkpoint tensor names: RoPE), so this is the only rotary the
    block knows."""
    r = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b, rest = x[..., :r], x[..., r:2 * r], x[..., 2 * r:]
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)


def halves_permutation(rotary: int, head: int) -> torch.Tensor:
    """Per head, the row order that turns adjacent-pair rotary (pairs (2j, 2j+1)) into split halves
    (pairs (j, j + rotary/2)): new row j takes old 2j, new row j + rotary/2 takes old 2j + 1; the rest stay."""
    return torch.cat([torch.arange(0, rotary, 2), torch.arange(1, rotary, 2), torch.arange(rotary, head)])
