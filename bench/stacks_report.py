"""Reads a server's sampled stacks (`bench_graph.py --stacks`, host/stack_sampler.py): the seconds in which a thread
was inside FRAME (a substring of `file:function:line`, e.g. `load_text_encoder`), then for each thread in those
seconds its samples, the frames most of them pass through and where they end; with --where, only the samples that
pass through FRAME, by their innermost frames (where that work's time goes).

    python bench/stacks_report.py STACKS_FILE [FRAME] [--where] [--top 25]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict


def read(path: str) -> tuple[str, list[tuple[int, str, list[str], int]]]:
    """(the process's command line, [(second, thread, frames outer to inner, samples)])."""
    command, rows = "", []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                command = line[1:].strip()
                continue
            stack, n = line.rsplit(" ", 1)
            second, thread, *frames = stack.split(";")
            rows.append((int(second), thread, frames, int(n)))
    return command, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stacks")
    p.add_argument("frame", nargs="?", default="load_text_encoder")
    p.add_argument("--where", action="store_true", help="only the samples inside FRAME, by their innermost frames")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    command, rows = read(args.stacks)
    inside = [r for r in rows if any(args.frame in f for f in r[2])]
    if not inside:
        print(f"stacks_report: no sample of {args.stacks} passes through {args.frame!r}", file=sys.stderr)
        return 1
    print(f"# {command[:200]}")
    if args.where:
        ends = Counter()
        for _, _, frames, n in inside:
            ends[";".join(frames[-3:])] += n
        print(f"{sum(ends.values())} samples inside {args.frame}, by their innermost frames:")
        for end, n in ends.most_common(args.top):
            print(f"{n:6d}  {end}")
        return 0
    seconds = {s for s, *_ in inside}
    print(f"seconds {min(seconds)}-{max(seconds)} ({len(seconds)} of them) have samples inside {args.frame}")
    through, ends, total = defaultdict(Counter), defaultdict(Counter), Counter()
    for second, thread, frames, n in rows:
        if second in seconds:
            total[thread] += n
            for frame in set(frames):
                through[thread][frame] += n
            ends[thread][";".join(frames[-3:])] += n
    for thread, n in total.most_common():
        print(f"\n== {thread}: {n} samples; the frames of at least a tenth of them:")
        for frame, k in through[thread].most_common(args.top):
            if k >= n / 10:
                print(f"{k:6d}  {frame}")
        print("   where they end:")
        for end, k in ends[thread].most_common(5):
            print(f"{k:6d}  {end}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
