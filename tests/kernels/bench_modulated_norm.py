"""Times kernels/modulated_norm.py at LTX-2.5's stage-2 video rows (14080 x 4096 f32 to bf16, one modulation row):
one modulation, the A<->V pair from one pass against two passes, and the launch's rows a program, warps and columns a
step (4096: each row read once, held in registers).
Median ms of --runs, eager and one CUDA-graph replay (bench_int8_linear.median_ms). Prints markdown.
Not collected by pytest (bench_*); on the device: python tests/kernels/bench_modulated_norm.py [--runs 50]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_int8_linear import median_ms  # noqa: E402
from kernels.modulated_norm import modulated_norm  # noqa: E402

# (block_m, num_warps, block_d); (1, 8, 4096) the default
LAUNCHES = [(4, 4, 1024), (2, 4, 1024), (1, 4, 1024), (2, 8, 1024), (8, 8, 1024), (1, 4, 4096), (1, 8, 4096),
            (2, 8, 4096), (2, 16, 4096), (4, 16, 4096)]


def main(runs: int) -> None:
    m, d = 14080, 4096
    x = torch.randn(m, d, device="cuda")
    scale, shift, scale2, shift2 = (0.1 * torch.randn(1, d, device="cuda") for _ in range(4))
    row_map = torch.zeros(m, dtype=torch.int32, device="cuda")
    print("| block_m, warps, block_d | one modulation ms (graph) | two passes ms (graph) | the pair in one pass ms "
          "(graph) |")
    print("|---|---|---|---|")
    for block_m, warps, block_d in LAUNCHES:
        kw = {"out_dtype": torch.bfloat16, "block_m": block_m, "num_warps": warps, "block_d": block_d}
        fns = (lambda: modulated_norm(x, scale, shift, row_map, **kw),  # noqa: E731
               lambda: (modulated_norm(x, scale, shift, row_map, **kw),  # noqa: E731
                        modulated_norm(x, scale2, shift2, row_map, **kw)),
               lambda: modulated_norm(x, scale, shift, row_map, also=(scale2, shift2), **kw))  # noqa: E731
        times = [f"{median_ms(fn, runs, False):.4f} ({median_ms(fn, runs, True):.4f})" for fn in fns]
        print(f"| {block_m}, {warps}, {block_d} | {' | '.join(times)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    main(parser.parse_args().runs)
