"""A MiniMax H3 or LTX-2.5 step on 1, 2 and 4 GPUs as the loaders' gpus option runs it (dit_core/parallel
RankedModel: a rank process a GPU, NCCL, the step's rows split between them; this process sends the rows and gets
the velocity back), at the t2v templates' sizes on random weights of the real shapes, INT8 ConvRot linears, in one
run. Prints a markdown table: median seconds a step (wall clock here, the rows' trips included), the speed against
one GPU of the same run, and the output's distance from one GPU's.

    python bench/bench_sequence_parallel.py [--family h3|ltx25] [--gpus 1,2,4] [--layers 12] [--steps 3] [--tiny]

--layers cuts the model (50 and 48 in the releases): a step's time scales with its layers and so its ratios stay,
while each rank builds its copy on its GPU (diffusers' BF16 model quantized there: the whole 33 B H3 needs 100 GB at
that moment). --tiny runs a model of kernel sizes on 1 and 2 host processes (gloo) where there is no GPU: a smoke test
of the script, not a timing. The issue's goal: >= 1.8x at 2 GPUs, >= 3.4x at 4."""
from __future__ import annotations

import argparse
import functools
import importlib
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_z_image_step import rel  # noqa: E402
from dit_core.families.ltx25 import LTX25  # noqa: E402
from dit_core.families.minimax_h3 import MiniMaxH3  # noqa: E402
from dit_core.parallel import RankedModel  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402


def rank_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def random_h3(_path: str, layers: int, tiny: bool) -> MiniMaxH3:
    """A rank's H3: bench_h3_step's random diffusers model (seeded: every rank the same) quantized on its GPU."""
    import bench_h3_step
    from tiny_models import minimax_h3_comfy_layout
    ref = bench_h3_step.random_reference(layers, 0.1, rank_device(), bench_h3_step.TINY if tiny else {})
    state = minimax_h3_comfy_layout(ref)
    del ref
    return MiniMaxH3.load(TensorSource(state), linears="int8")


def random_ltx25(_path: str, layers: int, tiny: bool) -> LTX25:
    """A rank's LTX-2.5: bench_ltx25_step's random diffusers model, its blocks' linears INT8 ConvRot."""
    import bench_ltx25_step
    ref = bench_ltx25_step.random_reference(layers, 0.1, rank_device(), bench_ltx25_step.TINY if tiny else {})
    state = bench_ltx25_step.quantized_state(ref)
    del ref
    return LTX25.load(TensorSource(state))


def h3_step(tiny: bool):
    """(the rows of the t2v template's step: 864x480x124 (or 64x64x22 tiny), a 512-row prompt (16), step(model))."""
    width, height, frames, text = (64, 64, 22, 16) if tiny else (864, 480, 124, 512)
    bench = importlib.import_module("bench_h3_step")
    s = bench.step_inputs(bench.TINY if tiny else {}, width, height, frames, text, torch.device("cpu"))

    def step(model):
        txt = model.text_rows(s.text)
        return lambda: model.velocity(s.video, s.audio, txt, s.layout, s.times, s.index)[0]
    return f"{width}x{height}x{frames}, {s.layout.rows} rows", step


def ltx25_step(tiny: bool):
    """The t2v template's stage 2 (1280x704, 121 frames, 1024 prompt rows; tiny: 128x128, 17 frames, 16)."""
    bench = importlib.import_module("bench_ltx25_step")
    (width, height), frames, text = (bench.TINY_STAGES[2], 17, 16) if tiny else (bench.STAGES[2], 121, 1024)
    s = bench.stage_inputs(width, height, frames, text, bench.TINY if tiny else {}, torch.device("cpu"))

    def step(model):
        return lambda: model.forward(s.video, s.audio, s.text_video, s.text_audio, s.grid, bench.SIGMA_VIDEO,
                                     bench.SIGMA_AUDIO, av_times="cross")[0]
    return f"{width}x{height}x{frames} (stage 2), {s.rows} rows", step


FAMILIES = {"h3": (MiniMaxH3, random_h3, h3_step), "ltx25": (LTX25, random_ltx25, ltx25_step)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=list(FAMILIES), default="h3")
    p.add_argument("--gpus", default="1,2,4", help="the rank counts to run, e.g. 1,2,4")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--steps", type=int, default=3, help="timed steps, after one untimed (Triton builds)")
    p.add_argument("--tiny", action="store_true", help="a smoke run: a model of kernel sizes, 1 and 2 host processes "
                   "where there is no GPU")
    args = p.parse_args(argv)
    recipe, builder, rows = FAMILIES[args.family]
    # the builder by its module's name (this file run as __main__ is not importable in a rank)
    builder = getattr(importlib.import_module(Path(__file__).stem), builder.__name__)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    have = torch.cuda.device_count() if on_gpu else 2
    worlds = [w for w in (int(n) for n in args.gpus.split(",")) if w <= have]
    if args.tiny:
        args.layers = min(args.layers, 2)
    size, step_of = rows(args.tiny)
    name = torch.cuda.get_device_name() if on_gpu else "CPU, host processes (gloo)"
    print(f"# {recipe.__name__} step across ranks, {size}, {args.layers} layers{' (tiny sizes)' * args.tiny}, "
          f"INT8 ConvRot, {have} x {name}, torch {torch.__version__}; ranks {worlds} (asked {args.gpus})")
    results = {}
    for world in worlds:
        started = time.perf_counter()
        with RankedModel.start(world, functools.partial(builder, layers=args.layers, tiny=args.tiny), "", recipe,
                               device) as model:
            loaded = time.perf_counter() - started
            step = step_of(model)
            out = step()  # the first: Triton's builds on every rank
            seconds = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                out = step()
                seconds.append(time.perf_counter() - t0)
        results[world] = (statistics.median(seconds), out.float().cpu(), loaded)
    one = results.get(1)
    print("\n| GPUs | s / step | vs 1 GPU | output vs 1 GPU | start + load s |\n|---|---|---|---|---|")
    for world, (seconds, out, loaded) in results.items():
        speed = f"{one[0] / seconds:.2f}x" if one else "-"
        dist = f"{rel(out, one[1]):.1e}" if one else "-"
        print(f"| {world} | {seconds:.3f} | {speed} | {dist} | {loaded:.1f} |")
    if one and math.isfinite(one[0]):
        speedups = {w: one[0] / results[w][0] for w in (2, 4) if w in results}
        goals = {2: 1.8, 4: 3.4}
        print("\n" + "; ".join(f"{w} GPUs {x:.2f}x (goal {goals[w]}x: {'met' if x >= goals[w] else 'not met'})"
                               for w, x in speedups.items()))


if __name__ == "__main__":
    main()
