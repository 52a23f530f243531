"""Saving a 1024x1024 image as ComfyUI's Save Image does (PIL, one core, compress level 4) and as Save Image
(SwiftDiT) does (dit_core/codecs/png.py: the rows filtered on the card where there is one, else on the CPU's
cores, deflated in bands on every core), the IMAGE on the host as a decoder hands it over, with the prompt and
workflow of workflows/z_image_turbo_t2i.json as the text chunks: median ms of each, the same run, and ours by the
number of bands (threads) it deflates in. A picture like a decoded image (gradients with grain) and noise (what
random weights decode to).

    python bench/bench_save_image.py [--size 1024] [--runs 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from PIL.PngImagePlugin import PngInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dit_core.codecs.png import available_cores, filtered_image, png_bytes, to_bytes  # noqa: E402


def pictures(size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    smooth = torch.stack([torch.sin(6 * x + 3 * y), torch.cos(20 * x * y), torch.sin(9 * x * y + 2)], -1) * 0.4 + 0.5
    return {"decoded-like": (smooth + 0.02 * torch.randn(smooth.shape, generator=g)).clamp(0, 1),
            "noise": torch.rand(size, size, 3, generator=g)}


def stock_save(image: torch.Tensor, text: dict, path: str) -> None:
    """ComfyUI v0.3.75's SaveImage.save_images, one image."""
    img = Image.fromarray(np.clip(255. * image.cpu().numpy(), 0, 255).astype(np.uint8))
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    img.save(path, pnginfo=info, compress_level=4)


def median_ms(save, path: str, runs: int) -> float:
    save(path)  # a warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        save(path)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    text = {"prompt": (ROOT / "workflows" / "api" / "z_image_turbo_t2i.json").read_text(),
            "workflow": json.dumps(json.loads((ROOT / "workflows" / "z_image_turbo_t2i.json").read_text()))}
    cores = available_cores()
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(f"# Save Image at {args.size}x{args.size}, {cores} CPU cores, filters on {card or 'the CPU'}, torch "
          f"{torch.__version__}\n| picture | stock (PIL, one core) ms | SwiftDiT ms | speed-up | file KiB stock / "
          f"ours |\n|---|---|---|---|---|")
    threads = [n for n in (1, 2, 4, 8, 16, 32) if n < cores] + [cores]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(cores) as pool:
        scaling = {}
        for name, image in pictures(args.size).items():
            def ours(path, bands=cores, image=image):
                pixels = filtered_image(image, "cuda") if card else to_bytes(image)
                with open(path, "wb") as f:
                    f.write(png_bytes(pixels, text, 4, pool, bands=bands))
            paths = {label: os.path.join(folder, f"{label}.png") for label in ("stock", "ours")}
            stock_ms = median_ms(lambda path: stock_save(image, text, path), paths["stock"], args.runs)
            ours_ms = median_ms(ours, paths["ours"], args.runs)
            stock_img, ours_img = (np.asarray(Image.open(path)) for path in paths.values())
            assert np.array_equal(stock_img, ours_img), "the two files' pixels differ"
            kib = [os.path.getsize(path) / 1024 for path in paths.values()]
            print(f"| {name} | {stock_ms:.1f} | {ours_ms:.1f} | {stock_ms / ours_ms:.2f}x | {kib[0]:.0f} / "
                  f"{kib[1]:.0f} |", flush=True)
            scaling[name] = [median_ms(lambda path, n=n: ours(path, n), paths["ours"], args.runs) for n in threads]
    print("\nSwiftDiT's save by the bands (threads) it deflates in, ms\n| picture | "
          + " | ".join(str(n) for n in threads) + " |\n|---|" + "---|" * len(threads))
    for name, times in scaling.items():
        print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in times) + " |")


if __name__ == "__main__":
    main()
