"""Times LTX-2.5's q/k rows on CUDA (kernels/rows_norm_rope.py: RMS across the heads, per-head split-half rotary by
axis, bf16) at every call a step makes: the video rows of stage 2 (16 x 22 x 40 latents) and stage 1 (16 x 11 x 20)
in the self-attention (32 x 128, three axes), the A<->V attentions (the audio stream's 32 x 64 heads, the time axis)
and the prompt's queries (no rotary); the audio's 127 rows (self and A<->V, 32 x 64) and the prompt's 1024 key rows
(no rotary) of each stream. Each by the launches the kernel offers: rows in blocks walking the heads whole or by
rotary pairs, and a row a program (its heads in one tile), the default first.
Median ms of one CUDA-graph replay over --runs (bench_int8_linear.median_ms); calls a step per stream's layer beside
each case. Prints markdown.
Not collected by pytest (bench_*); on the device: python tests/kernels/bench_rows_norm_rope.py [--runs 100]
"""
import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_int8_linear import median_ms  # noqa: E402
from dit_core.families.ltx25_positions import Grid, audio_midpoints, split_angles, video_midpoints  # noqa: E402
from kernels import Choices  # noqa: E402
from kernels.rows_norm_rope import rows_norm_rope  # noqa: E402

AUDIO_ROWS, PROMPT_ROWS = 127, 1024
BLOCKED = Choices(rows_in_pairs_from=None, rows_at_once_below=None)
PAIRS = Choices(rows_in_pairs_from=0, rows_at_once_below=None)
# (label, rows_norm_rope's launch): block_m and num_warps of the blocked and pairs kernels, warps of a row at once
LAUNCHES = [("default", {})] + [(f"whole heads: {m}, {w}", {"block_m": m, "num_warps": w, "choices": BLOCKED})
                                for m, w in ((4, 2), (16, 4), (1, 1))] + \
           [(f"pairs: {m}, {w}", {"block_m": m, "num_warps": w, "choices": PAIRS})
            for m, w in ((16, 4), (8, 4), (8, 2), (4, 2), (2, 1))] + \
           [(f"a row at once: {w}", {"row_at_once": True, "num_warps": w}) for w in (2, 4, 8, 16)]


def cases(grid: Grid) -> list:
    """(label, calls a step per layer, heads, head, midpoints [rows, axes], or a row count: no rotary)."""
    video, audio = video_midpoints(grid, torch.float64), audio_midpoints(AUDIO_ROWS, torch.float64)
    m = grid.rows
    return [(f"video self, {m} rows", 2, 32, 128, video), (f"video A<->V, {m} rows", 2, 32, 64, video[:, :1]),
            (f"video prompt q, {m} rows", 1, 32, 128, m), ("audio self and A<->V, 127 rows", 4, 32, 64, audio),
            ("audio prompt q, 127 rows", 1, 32, 64, AUDIO_ROWS),
            ("prompt keys, video heads, 1024 rows", 1, 32, 128, PROMPT_ROWS),
            ("prompt keys, audio heads, 1024 rows", 1, 32, 64, PROMPT_ROWS)]


def call(heads: int, head: int, mid) -> functools.partial:
    """rows_norm_rope of random rows, angles by axis of mid's (or no rotary where mid is a row count)."""
    m = mid if isinstance(mid, int) else mid.shape[0]
    x = torch.randn(m, heads * head, device="cuda").to(torch.bfloat16)
    gain = 1 + 0.1 * torch.randn(heads * head, device="cuda")
    if isinstance(mid, int):
        return functools.partial(rows_norm_rope, x, heads, head, gain, None, None, across=True)
    tables = split_angles(mid.cuda(), heads * head, heads)
    return functools.partial(rows_norm_rope, x, heads, head, gain, tables.cos, tables.sin, across=True,
                             index=tables.index, columns=(tables.axis, tables.freq))


def main(runs: int) -> None:
    every = cases(Grid(16, 22, 40)) + cases(Grid(16, 11, 20))[:3]  # (the audio's and prompt's rows: one stage's)
    calls = {label: call(heads, head, mid) for label, _, heads, head, mid in every}
    for label, fn in calls.items():  # each launch against the default: the same but for the order of f32 sums
        first = fn().float()
        worst = max(float(((fn(**launch).float() - first).abs() / first.abs().clamp(min=1e-3)).max())
                    for _, launch in LAUNCHES)
        print(f"{label}: launches within {worst:.2g} relative of the default's")
    print(f"\n| launch | {' | '.join(f'{label} (x{n})' for label, n, *_ in every)} |")
    print("|---|" + "---|" * len(every))
    for name, launch in LAUNCHES:
        times = [f"{median_ms(functools.partial(fn, **launch), runs, True):.4f}" for fn in calls.values()]
        print(f"| {name} | {' | '.join(times)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    main(parser.parse_args().runs)
