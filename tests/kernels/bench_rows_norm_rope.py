"""Times LTX-2.5's q/k rows on CUDA: kernels/rows_norm_rope.py against the torch f32 form it replaced in
dit_core/gpu/pieces.py (RMS across the heads, per-head split-half rotary, bf16), at the video self-attention (32 x
128, every column turned) and the A<->V time rotary on video heads (32 of 64 pairs), at stage 2's video rows (16 x 22
x 40 latents) and stage 1's (16 x 11 x 20); the kernel's angles as every row's tables and by axis (the rows'
midpoints' tables), rows in blocks walking the heads by rotary pairs or whole heads at several launches, and a row at
once (its heads in one tile) on 4, 8 and 16 warps.
Median ms of --runs, eager and one CUDA-graph replay (bench_int8_linear.median_ms). Prints markdown.
Not collected by pytest (bench_*); on the device: python tests/kernels/bench_rows_norm_rope.py [--runs 100]
"""
import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_int8_linear import median_ms  # noqa: E402
from dit_core.families.ltx25_positions import Grid, split_angles, video_midpoints  # noqa: E402
from kernels import Choices  # noqa: E402
from kernels.rows_norm_rope import reference, rows_norm_rope  # noqa: E402

CASES = [("video self", 32, 128, 64, 3), ("A<->V, video heads", 32, 128, 32, 1)]


def main(runs: int, grid: Grid) -> None:
    mid = video_midpoints(grid, torch.float64).cuda()
    launches, whole = {}, {}  # case -> the by-axis call at a launch; (case, angles) -> the call a row at once
    print("| rows | M | torch f32 ms (graph) | rows_norm_rope, every row's tables ms (graph) | by axis ms (graph) |")
    print("|---|---|---|---|---|")
    for name, heads, head, r, axes in CASES:
        tables = split_angles(mid[:, :axes], 2 * heads * r, heads)
        cos, sin = tables.by_rows()
        m = cos.shape[0]
        x = torch.randn(m, heads * head, device="cuda").to(torch.bfloat16)
        gain = 1 + 0.1 * torch.randn(heads * head, device="cuda")
        by_axis = {"index": tables.index, "columns": (tables.axis, tables.freq)}
        fns = (lambda: reference(x, heads, head, gain, cos, sin, across=True),  # noqa: E731
               lambda: rows_norm_rope(x, heads, head, gain, cos, sin, across=True),  # noqa: E731
               lambda: rows_norm_rope(x, heads, head, gain, tables.cos, tables.sin, across=True, **by_axis))  # noqa
        assert torch.equal(fns[1](), fns[2]())
        times = [f"{median_ms(fn, runs, False):.4f} ({median_ms(fn, runs, True):.4f})" for fn in fns]
        print(f"| {name} | {m} | {' | '.join(times)} |")
        launches[name] = functools.partial(rows_norm_rope, x, heads, head, gain, tables.cos, tables.sin, across=True,
                                           **by_axis)
        whole[name, "tables"] = functools.partial(rows_norm_rope, x, heads, head, gain, cos, sin, across=True,
                                                  row_at_once=True)
        whole[name, "by axis"] = functools.partial(launches[name], row_at_once=True)
        assert torch.equal(whole[name, "tables"](), whole[name, "by axis"]())  # (the sum's order is the blocks' own)
    print("\nBy axis, rows walking the heads by rotary pairs (16, 4 its default launch) or by whole heads (4, 2: the "
          "default), the launch's rows a program and warps, ms (graph):\n")
    print(f"| kernel: rows a program, warps | {' | '.join(launches)} |")
    print("|---|" + "---|" * len(launches))
    for kernel, block_m, warps in (("pairs", 16, 4), ("pairs", 8, 4), ("pairs", 32, 4), ("pairs", 16, 8),
                                   ("pairs", 32, 8), ("pairs", 8, 2), ("pairs", 4, 2), ("whole heads", 4, 2),
                                   ("whole heads", 16, 4)):
        pairs_from = 0 if kernel == "pairs" else None
        launch = {"block_m": block_m, "num_warps": warps, "choices": Choices(rows_in_pairs_from=pairs_from)}
        times = [f"{median_ms(functools.partial(call, **launch), runs, True):.4f}" for call in launches.values()]
        print(f"| {kernel}: {block_m}, {warps} | {' | '.join(times)} |")
    print("\nA row a program, its heads in one tile, ms (graph):\n")
    print(f"| warps | {' | '.join(f'{case}, {angles}' for case, angles in whole)} |")
    print("|---|" + "---|" * len(whole))
    for warps in (4, 8, 16):
        times = [f"{median_ms(functools.partial(call, num_warps=warps), runs, True):.4f}" for call in whole.values()]
        print(f"| {warps} | {' | '.join(times)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    for stage, latents in (("2", Grid(16, 22, 40)), ("1", Grid(16, 11, 20))):
        print(f"\n## stage {stage}: {latents.rows} video rows\n")
        main(parser.parse_args().runs, latents)
