"""Z-Image's VAE decode (FLUX.1's ae.safetensors, random weights of its real size) at 1024x1024, BF16 on the GPU:
stock ComfyUI v0.3.75's VAE (what VAEDecode runs, its model management choosing the dtype) against ours
(dit_core/codecs/flux1_vae.py, what SwiftDiTZImageVAEDecode runs, and the same with its activations channels last)
in the same run, each with cuDNN's autotuner off and on. Seconds include the IMAGE's trip to the host (both sides).
Then one profiled decode of each of ours: its kernels by GPU time.

    python bench/bench_image_decode.py [--size 1024] [--runs 5]    # on a GPU, ComfyUI's tree in .cache/ (either carry)
    python bench/bench_image_decode.py --device cpu --size 64 --runs 1  # a smoke run
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"

from bench_video_decode import psnr  # noqa: E402
from dit_core.codecs.flux1_vae import ImageDecoder  # noqa: E402
from host import checkpoints  # noqa: E402


def seconds(fn, runs: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Median seconds of fn over runs (two untimed first), and its last result."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        out = fn()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def stock_vae(state: dict, device: torch.device):
    """ComfyUI's VAE of the state, as VAELoader makes it (in-process; model management on the GPU)."""
    sys.path.append(str(COMFYUI_TREE))
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = device.type == "cpu"
    import comfy.sd
    return comfy.sd.VAE(sd=state)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        from host.run_comfy import TorchvisionOpsShim
        sys.meta_path.insert(0, TorchvisionOpsShim())
    state = checkpoints.vae_state_dict()
    latent = torch.randn(1, 16, args.size // 8, args.size // 8, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ae.safetensors"
        save_file(state, str(path))
        loaded = ImageDecoder.load(path)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        ours, ours_last = loaded.to(device, dtype), loaded.to(device, dtype, channels_last=True)
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# FLUX.1 VAE decode, {args.size}x{args.size}, {card}, torch {torch.__version__}")
    print("| decode | cuDNN autotuner | ms | peak GB | PSNR against stock |\n|---|---|---|---|---|")
    try:
        stock = stock_vae(state, device)
    except Exception as e:  # noqa: BLE001 (the row says why it is missing)
        stock = None
        print(f"| stock ComfyUI VAE | - | not run: {type(e).__name__}: {e} | - | - |")
    want = None
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        runs = [("stock ComfyUI VAE", lambda: stock.decode(latent))] if stock is not None else []
        runs += [("ours", lambda: ours.decode(latent, tile=None)),
                 ("ours, channels last", lambda: ours_last.decode(latent, tile=None))]
        for label, fn in runs:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():  # as ComfyUI runs every node
                ms, image = seconds(fn, args.runs, device)
            image = image.reshape(-1, *image.shape[-3:])
            if label.startswith("stock") and want is None:
                want = image
            match = f"{psnr(image, want):.1f} dB" if want is not None and not label.startswith("stock") else "-"
            peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0
            print(f"| {label} | {'on' if benchmark else 'off'} | {ms * 1e3:.1f} | {peak:.2f} | {match} |", flush=True)
    torch.backends.cudnn.benchmark = False
    if device.type != "cuda":
        return 0
    from torch.profiler import ProfilerActivity, profile
    for label, decoder in (("Ours", ours), ("Ours channels last", ours_last)):
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            decoder.decode(latent, tile=None)
            torch.cuda.synchronize()
        print(f"\n{label}, one decode's kernels by GPU time:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
