"""Where a kernel's warps wait, from Nsight Compute's per-instruction stall samples (device_session.sh's `ncu` part
writes them: `ncu -i REPORT --page source --csv --print-source sass > FILE`).

Prints the stall reasons over the whole kernel, then the samples of each run of SPAN instructions in address order
with its commonest opcodes, then the hottest instructions. A warp-specialized kernel's partitions and phases (the
producer, each consumer's K loop and epilogue) are runs of addresses, so the runs' sums say where each spends its
time (docs/notes/runs.md, the ninth session: the fused QKV's epilogue against its K loop).

    python bench/ncu_stalls.py FILE.sass.csv [--span 200] [--top 30]
"""
from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def opcode(source: str) -> str:
    """The instruction's opcode without its modifiers (a predicate such as `@!P0` skipped)."""
    words = source.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0] if words else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass_csv")
    parser.add_argument("--span", type=int, default=200, help="instructions a run")
    parser.add_argument("--top", type=int, default=30, help="hottest instructions listed")
    args = parser.parse_args()
    with open(args.sass_csv, newline="") as f:
        rows = list(csv.reader(f))
    header = next(r for r in rows if SAMPLES in r)
    data = [dict(zip(header, r)) for r in rows[rows.index(header) + 1:] if len(r) == len(header)]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    count = lambda row, key: int(row[key] or 0)  # noqa: E731
    total = sum(count(r, SAMPLES) for r in data) or 1
    by_reason = collections.Counter({h[6:]: sum(count(r, h) for r in data) for h in reasons})
    print(f"{len(data)} instructions, {total} samples; reasons: " +
          ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(8)))
    print(f"\nruns of {args.span} instructions: first, samples (% of all), executed, commonest opcodes")
    for first in range(0, len(data), args.span):
        run = data[first:first + args.span]
        samples = sum(count(r, SAMPLES) for r in run)
        ops = collections.Counter(opcode(r["Source"]) for r in run).most_common(4)
        executed = sum(count(r, "Instructions Executed") for r in run)
        print(f"{first:6d} {samples:7d} ({100 * samples / total:4.1f}%) {executed:11d}  "
              + " ".join(f"{o}x{n}" for o, n in ops))
    print(f"\nhottest {args.top}: index, samples, instruction, its two main reasons")
    for i in sorted(sorted(range(len(data)), key=lambda i: -count(data[i], SAMPLES))[:args.top]):
        row = data[i]
        main_reasons = sorted(((count(row, h), h[6:]) for h in reasons), reverse=True)[:2]
        print(f"{i:6d} {count(row, SAMPLES):6d}  {row['Source'].strip()[:64]:64s}  "
              + ", ".join(f"{name} {n}" for n, name in main_reasons if n))


if __name__ == "__main__":
    main()
