"""Loading a file whose linears the loader quantizes: Krea 2 from its scaled FP8 file (`krea2_turbo_fp8_scaled`, the
t2i template's default) as the loader reads it (every block linear requantized to INT8 ConvRot), the arithmetic on
the host (as before) against on the GPU (compute_on: each linear there and its codes back), then placed on the GPU;
and a LoRA merged into the INT8 file's linears, both ways. Random weights of the real shapes, --layers of Krea 2's 28
blocks (a load's time scales with them). Prints seconds and the codes' agreement between the two ways.
--placement: only the INT8 file's way to the card as the loader node takes it (the file in the page cache).

    python bench/bench_load.py [--layers 4] [--placement]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from bench_fp8_products import fp8_scaled_weight  # noqa: E402
from bench_krea2_step import random_reference  # noqa: E402
from dit_core.families.krea2 import Krea2  # noqa: E402


def fp8_scaled(state: dict) -> dict:
    """The blocks' linears as ComfyUI's scaled FP8 file stores them: e4m3 weights and a `weight_scale` each."""
    out = {}
    for key, value in state.items():
        if ".blocks." in f".{key}" and key.endswith(".weight") and value.dim() == 2:
            codes, scale = fp8_scaled_weight(value)
            out[key] = codes.cpu()
            out[key.removesuffix(".weight") + ".weight_scale"] = scale.reshape(()).cpu()
        else:
            out[key] = value.cpu()
    return out


def timed_load(**kw) -> tuple[float, Krea2]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = Krea2.load(**kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, model


def codes_agree(a: Krea2, b: Krea2) -> float:
    """The fraction of the blocks' INT8 codes equal between two loads."""
    same = total = 0
    for x, y in zip(a.blocks, b.blocks):
        for lx, ly in zip(x.w, y.w):
            if getattr(lx, "scale", None) is not None:
                same += (lx.weight == ly.weight).sum().item()
                total += lx.weight.numel()
    return same / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--placement", action="store_true", help="only the INT8 file's load and placement on the card")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_load needs a CUDA GPU")
    from safetensors.torch import save_file
    from tiny_models import int8_convrot_state, krea2_original_layout
    gpu = torch.device("cuda")
    print(f"# Krea 2 load, {args.layers} of 28 blocks, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} host threads\n")
    state = krea2_original_layout(random_reference(args.layers, 0.1).state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        fp8, int8, lora = (Path(tmp) / n for n in ("fp8.safetensors", "int8.safetensors", "lora.safetensors"))
        save_file({k: v.cpu() for k, v in int8_convrot_state({k: v.float() for k, v in state.items()},
                                                             lambda k: ".blocks." in f".{k}", 256).items()}, int8)
        if args.placement:
            del state
            torch.cuda.empty_cache()
            return placements(int8)
        save_file(fp8_scaled(state), fp8)
        g = torch.Generator().manual_seed(1)
        save_file({f"diffusion_model.blocks.{i}.attn.{n}.lora_{s}.weight":
                   torch.randn(*((16, 6144) if s == "A" else (6144, 16)), generator=g) * 0.01
                   for i in range(args.layers) for n in ("wq", "wo") for s in "AB"}, lora)
        del state
        torch.cuda.empty_cache()
        rows = []
        for label, kw in (("FP8 file -> INT8 ConvRot", dict(path=fp8)),
                          ("INT8 file + a LoRA (rank 16, q and out)", dict(path=int8, loras=((lora, 1.0),)))):
            host_s, host = timed_load(**kw)
            gpu_s, on_gpu = timed_load(**kw, compute_on=gpu)
            t0 = time.perf_counter()
            on_gpu.to(gpu)
            torch.cuda.synchronize()
            rows.append((label, host_s, gpu_s, time.perf_counter() - t0, codes_agree(host, on_gpu)))
            del host, on_gpu
    print("| load | host arithmetic s | GPU arithmetic s | speed-up | then to the GPU s | codes equal |\n"
          "|---|---|---|---|---|---|")
    for label, host_s, gpu_s, place_s, same in rows:
        print(f"| {label} | {host_s:.2f} | {gpu_s:.2f} | {host_s / gpu_s:.1f}x | {place_s:.2f} | {same:.5f} |")
    print(f"\nper block (28 in the release): FP8 file {rows[0][1] / args.layers:.2f} s on the host, "
          f"{rows[0][2] / args.layers:.2f} s with the GPU")


def placements(path: Path, rounds: int = 3) -> None:
    """Seconds from the INT8 file (in the page cache: written just before) to the card as the loader node takes
    it: Krea2.load, then every block placed (StreamedBlocks, all resident), the blocks read first or as they are
    placed, with a profile of the last round's host work."""
    import cProfile
    import pstats
    gpu, size = torch.device("cuda"), path.stat().st_size
    print("| blocks | round | load s | to the card s | GB/s of the file |\n|---|---|---|---|---|")
    for on_use in (False, True):  # every block read first, or each read as it is placed (the node's way since)
        for r in range(rounds):
            profile = cProfile.Profile()
            profile.enable()
            load_s, host = timed_load(path=path, blocks_on_use=on_use)
            t0 = time.perf_counter()
            placed = host.to(gpu, budget_bytes=1 << 40)
            torch.cuda.synchronize()
            place_s = time.perf_counter() - t0
            profile.disable()
            print(f"| {'read as placed' if on_use else 'read first'} | {r + 1} | {load_s:.2f} | {place_s:.2f} | "
                  f"{size / 1e9 / (load_s + place_s):.1f} |", flush=True)
            del host, placed
            torch.cuda.empty_cache()
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
