"""The first Z-Image step on a machine that has built nothing yet: Triton's kernels built one after another as the step
reaches them, against built side by side ahead of it (dit_core/gpu/builds.py) on 1 thread, on all threads, and in
worker processes. Each mode runs in a process of its own with an empty Triton cache; the real-width model (INT8
ConvRot, 3840 wide, 2 layers: every layer launches the same kernels) at 1024x1024 with a 512-row caption. Prints a
markdown table and checks that the step after a build ahead equals the step built as it ran, bit for bit.

    python bench/bench_first_step.py [--size 1024] [--layers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# mode -> None (no build ahead) or (threads or workers, 0: as many as cores; processes?)
MODES = {"as it runs": None, "ahead, 1 thread": (1, False), "ahead, all threads": (0, False),
         "ahead, worker processes": (0, True)}


def one_mode(mode: str, size: int, layers: int, out: Path) -> dict:
    """In this process (its Triton cache empty): the model, the build (if any), the first and second steps."""
    sys.path[:0] = [str(ROOT)]
    import torch

    from dit_core.families.z_image import ZImage
    from dit_core.gpu.builds import build_ahead
    from dit_core.weights import TensorSource
    from host import checkpoints

    torch.manual_seed(0)
    model = ZImage.load(TensorSource(checkpoints.dit_state_dict(layers, cap_dim=2560, device="cuda")),
                        linears="int8").to("cuda")
    latent = torch.randn(16, size // 8, size // 8, device="cuda")
    caption = torch.randn(512, 2560, device="cuda")
    step = lambda: model.output(latent, 0.6429, caption)  # noqa: E731
    torch.cuda.synchronize()
    row = {"mode": mode}
    if MODES[mode] is not None:
        threads, processes = MODES[mode]
        built = build_ahead(step, torch.device("cuda"), threads or None, processes=processes)
        row |= {"kernels": built.kernels, "build_s": built.seconds, "threads": built.threads, "refused": built.refused}
    for name in ("first_step_s", "second_step_s"):
        t0 = time.perf_counter()
        with torch.no_grad():
            result = step()
        torch.cuda.synchronize()
        row[name] = time.perf_counter() - t0
    torch.save(result.cpu(), out)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: a mode, its row printed as JSON
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one_mode(args.one, args.size, args.layers, Path(args.out))), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="first_step_") as work:
        for i, mode in enumerate(MODES):
            cache = Path(work) / f"triton_{i}"
            env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--one", mode, "--out", f"{work}/{i}.pt",
                                   "--size", str(args.size), "--layers", str(args.layers)],
                                  env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"{mode}: exit {done.returncode}\n{done.stderr[-3000:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["process_s"] = time.perf_counter() - t0
            row["cached_kernels"] = sum(1 for f in cache.rglob("*.cubin"))
            rows.append(row)
        import torch
        outputs = {row["mode"]: torch.load(f"{work}/{list(MODES).index(row['mode'])}.pt") for row in rows}
    print(f"# first Z-Image step, {args.size}x{args.size}, {args.layers} layers, INT8 ConvRot; each mode a fresh "
          f"process and Triton cache")
    print("| mode | build ahead (s) | kernels | threads | first step (s) | build + first step (s) | second step (s) "
          "| cubins in the cache | process (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        build = r.get("build_s", 0.0)
        print(f"| {r['mode']} | {build:.2f} | {r.get('kernels', '-')} | {r.get('threads', '-')} | "
              f"{r['first_step_s']:.2f} | {build + r['first_step_s']:.2f} | {r['second_step_s'] * 1e3:.1f} ms | "
              f"{r['cached_kernels']} | {r['process_s']:.1f} |" + (f" refused: {r['refused']}" if r.get("refused")
                                                                    else ""))
    base = outputs.get("as it runs")
    for mode, out in outputs.items():
        if base is not None and mode != "as it runs":
            print(f"- {mode}: the step equals the one built as it ran, bit for bit: {torch.equal(out, base)}")
    same = all(torch.equal(out, base) for out in outputs.values()) if base is not None else False
    return 0 if len(rows) == len(MODES) and same else 1


if __name__ == "__main__":
    sys.exit(main())
