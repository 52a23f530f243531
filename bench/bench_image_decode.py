"""Image VAE decodes at 1024x1024 (random weights of the real sizes), BF16 on the GPU: stock ComfyUI v0.3.75's VAE
(what VAEDecode runs, its model management choosing the dtype) against ours in the same run, each with cuDNN's
autotuner off and on; seconds include the IMAGE's trip to the host (both sides). Z-Image's FLUX.1 VAE
(ae.safetensors; dit_core/codecs/flux1_vae.py, what SwiftDiTZImageVAEDecode runs channels last, and laid out
[B, C, H, W]), then Krea 2's Qwen-Image VAE (qwen_image_vae.safetensors, Wan 2.1's causal 3-D VAE on one frame;
dit_core/codecs/qwen_image_vae.py, what SwiftDiTKrea2VAEDecode runs channels last, and laid out). Then one profiled
decode of each of ours: its kernels by GPU time.

    python bench/bench_image_decode.py [--size 1024] [--runs 5] [--only flux1 qwen_image]  # on a GPU, ComfyUI's
                                                                                           # tree in .cache/
    python bench/bench_image_decode.py --device cpu --size 64 --runs 1  # a smoke run
"""
from __future__ import annotations

import argparse
import math
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
from dit_core.codecs.qwen_image_vae import QwenImageDecoder  # noqa: E402
from dit_core.weights import TensorSource  # noqa: E402
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


def comfy_imported(device: torch.device) -> None:
    """ComfyUI's tree importable in-process, its model management on device's kind."""
    if str(COMFYUI_TREE) not in sys.path:
        sys.path.append(str(COMFYUI_TREE))
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = device.type == "cpu"


def stock_vae(state: dict, device: torch.device):
    """ComfyUI's VAE of the state, as VAELoader makes it (in-process; model management on the GPU)."""
    comfy_imported(device)
    import comfy.sd
    return comfy.sd.VAE(sd=state)


def qwen_image_state(device: torch.device) -> dict[str, torch.Tensor]:
    """qwen_image_vae as ComfyUI builds it from the file (comfy/sd.py: Wan 2.1's VAE, dim 96), random: gammas about
    1, convs scaled by their fan-in (a few dozen layers in a row stay about unit size)."""
    comfy_imported(device)
    from comfy.ldm.wan.vae import WanVAE
    with torch.device("meta"):
        wan = WanVAE(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                     temperal_downsample=[False, True, True], dropout=0.0)
    g = torch.Generator().manual_seed(0)
    state = {}
    for k, v in wan.state_dict().items():
        if k.endswith("gamma"):
            state[k] = 1 + 0.1 * torch.randn(v.shape, generator=g)
        elif v.dim() > 1:
            state[k] = torch.randn(v.shape, generator=g) / math.sqrt(v[0].numel())
        else:
            state[k] = 0.02 * torch.randn(v.shape, generator=g)
    return state


def decodes(title: str, state: dict, ours: dict, latent: torch.Tensor, device: torch.device, runs: int) -> None:
    """One table: stock ComfyUI's VAE of state, then each of ours (label -> decode(latent)), autotuner off and on."""
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"\n# {title}, {card}, torch {torch.__version__}")
    print("| decode | cuDNN autotuner | ms | peak GB | PSNR against stock |\n|---|---|---|---|---|")
    try:
        stock = stock_vae(state, device)
    except Exception as e:  # noqa: BLE001 (the row says why it is missing)
        stock = None
        print(f"| stock ComfyUI VAE | - | not run: {type(e).__name__}: {e} | - | - |")
    want = None
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        timed = [("stock ComfyUI VAE", lambda: stock.decode(latent))] if stock is not None else []
        timed += list(ours.items())
        for label, fn in timed:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():  # as ComfyUI runs every node
                ms, image = seconds(fn, runs, device)
            image = image.reshape(-1, *image.shape[-3:])
            if label.startswith("stock") and want is None:
                want = image
            match = f"{psnr(image, want):.1f} dB" if want is not None and not label.startswith("stock") else "-"
            peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0
            print(f"| {label} | {'on' if benchmark else 'off'} | {ms * 1e3:.1f} | {peak:.2f} | {match} |", flush=True)
    torch.backends.cudnn.benchmark = False
    if device.type != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile
    for label, fn in ours.items():
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        print(f"\n{title}, {label}, one decode's kernels by GPU time:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", nargs="*", default=["flux1", "qwen_image"])
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        from host.run_comfy import TorchvisionOpsShim
        sys.meta_path.insert(0, TorchvisionOpsShim())
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cells = args.size // 8
    if "flux1" in args.only:
        state = checkpoints.vae_state_dict()
        latent = torch.randn(1, 16, cells, cells, generator=torch.Generator().manual_seed(0))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "ae.safetensors"
            save_file(state, str(path))
            loaded = ImageDecoder.load(path)
        last, laid = loaded.to(device, dtype, channels_last=True), loaded.to(device, dtype)
        decodes(f"FLUX.1 VAE decode, {args.size}x{args.size}", state,
                {"ours (channels last, the nodes')": lambda: last.decode(latent, tile=None),
                 "ours, laid out [B, C, H, W]": lambda: laid.decode(latent, tile=None)}, latent, device, args.runs)
    if "qwen_image" in args.only:
        state = qwen_image_state(device)
        latent = torch.randn(1, 16, 1, cells, cells, generator=torch.Generator().manual_seed(0))
        loaded = QwenImageDecoder.load(TensorSource(state))
        last, laid = loaded.to(device, dtype, channels_last=True), loaded.to(device, dtype)
        decodes(f"Qwen-Image VAE decode (Krea 2's), {args.size}x{args.size}", state,
                {"ours, channels last": lambda: last.decode(latent),
                 "ours, laid out [B, C, H, W]": lambda: laid.decode(latent)}, latent, device, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
