"""Our workflows on a real ComfyUI v0.3.75 server on a GPU, started as a user starts it: ComfyUI's defaults (no
--cpu, no --disable-cuda-malloc: its cudaMallocAsync allocator, its model management, its cache, every node under
torch.inference_mode). Real-size random checkpoints under the templates' file names: Z-Image (host/checkpoints.py,
30 layers, BF16 and INT8 ConvRot), FLUX.3 Klein and Krea 2 (tests/real_size.py). Prompts in a row with new seeds,
the stock Z-Image graph on the same files, other models loaded and freed around ours, /interrupt within a run,
/free, then one more prompt. Each prompt's time, its sampler's and the memory on the card and the host go to the
report (SWIFTDIT_REPORT, markdown), as do the PSNRs of our Z-Image images against stock's.

Runs on the device (bench/device_session.sh server): pytest -m gpu tests/host/test_gpu_server.py
"""
import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from host import checkpoints
from host.graphs import Settings, krea2_graph, stock_graph, swiftdit_graph
from host.images import load, psnr
from host.server import ComfyHost, card_gb, node_seconds, of_type

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
MODELS = Path(os.environ.get("SWIFTDIT_REAL_MODELS", ROOT / ".cache" / "real_models"))
REPORT = os.environ.get("SWIFTDIT_REPORT")
TIMEOUT = 600.0
Z_BF16, Z_INT8 = checkpoints.DIT_BF16, checkpoints.DIT_INT8
# The Turbo template's size and sampler; the stock graph and ours share every setting (host/graphs.py).
Z_SETTINGS = Settings(width=1024, height=1024, steps=8, seed=0)
RESULTS: list[dict] = []  # one row a prompt, for the report


def workflow(name: str) -> dict:
    return json.loads((ROOT / "workflows" / name).read_text())


def with_seed(graph: dict, seed: int, prefix: str) -> dict:
    """graph with every sampler's seed and the SaveImage prefix set (a new seed: the sampler and what follows run
    again; ComfyUI's cache keeps the rest)."""
    graph = json.loads(json.dumps(graph))
    for body in graph.values():
        if "seed" in body["inputs"]:
            body["inputs"]["seed"] = seed
        if body["class_type"] in ("SaveImage", "SwiftDiTSaveImage"):
            body["inputs"]["filename_prefix"] = prefix
    return graph


def sampler_of(graph: dict) -> str:
    return next(node for node, body in graph.items() if "seed" in body["inputs"])


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory, serving):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sys.path.insert(0, str(ROOT / "tests"))
    import real_size
    t0 = time.monotonic()
    z_set = checkpoints.ensure(layers=30, device="cuda", log=print)
    real_size.write(MODELS)
    print(f"checkpoints ready in {time.monotonic() - t0:.0f} s")
    models = tmp_path_factory.mktemp("models")  # both sets, file by file
    for folder in ("diffusion_models", "text_encoders", "vae", "loras"):
        (models / folder).mkdir()
        for source in (z_set.root / folder, MODELS / folder):
            for f in source.glob("*.safetensors") if source.is_dir() else ():
                (models / folder / f.name).symlink_to(f.resolve())
    base = tmp_path_factory.mktemp("comfy_base")
    server = ComfyHost(COMFYUI_TREE, base, sys.executable, cpu=False, cache_none=False)
    server.link_models({folder: models / folder for folder in ("diffusion_models", "text_encoders", "vae", "loras")})
    yield from serving(server, timeout=180)
    if REPORT:
        write_report(server.log_text())
        Path(REPORT).with_name("comfyui_server.log").write_text(server.log_text()[-400_000:])


def memory(host: ComfyHost) -> tuple[float, float]:
    """(GB the server process holds on the card, GB resident in its host memory) now."""
    import psutil
    return card_gb(host.proc.pid), psutil.Process(host.proc.pid).memory_info().rss / 1e9


def run(host: ComfyHost, label: str, graph: dict, steps: int) -> tuple[dict, list[dict]]:
    """Queue graph and wait: it succeeds, the sampler reports progress every step, and the row goes to RESULTS."""
    entry, events, seconds = host.run(graph, TIMEOUT)
    errors = of_type(events, "execution_error")
    assert entry["status"]["status_str"] == "success", (errors[:1], host.log_tail())
    sampler = sampler_of(graph)
    progress = [p["value"] for p in of_type(events, "progress", sampler)]
    assert progress[-1:] == [steps], progress
    card, rss = memory(host)
    RESULTS.append({"prompt": label, "seconds": seconds, "sampler": node_seconds(events).get(sampler, 0.0),
                    "card_gb": card, "host_gb": rss})
    print(f"{label}: {seconds:.2f} s (sampler {RESULTS[-1]['sampler']:.2f} s), card {card:.1f} GB, host {rss:.1f} GB")
    return entry, events


def image(host: ComfyHost, entry: dict):
    [path] = host.output_files(entry)
    pixels = load(path)
    assert pixels.std() > 5, f"{path.name}: a flat image"
    return pixels


PSNR: dict[str, float] = {}


def test_z_image_workflow_prompt_after_prompt(gpu_host):
    """workflows/api/z_image_turbo_t2i.json as it is (1024x1024, 8 steps, BF16 file), then new seeds: the first
    prompt loads and builds, the next ones run only the sampler, decode and save (ComfyUI's cache)."""
    graph = workflow("api/z_image_turbo_t2i.json")
    for i, seed in enumerate((0, 1, 2)):
        image(gpu_host, run(gpu_host, f"Z-Image ours BF16, seed {seed}" + (" (first)" if i == 0 else ""),
                            with_seed(graph, seed, f"z_ours_{seed}"), 8)[0])


def test_z_image_images_against_stock(gpu_host):
    """The stock graph (UNETLoader, ModelSamplingAuraFlow, KSampler, VAELoader, VAEDecode) and ours on the same
    files, text rows and seed: PSNR of ours (BF16, then INT8 ConvRot) against stock's BF16 image."""
    stock = image(gpu_host, run(gpu_host, "Z-Image stock BF16", stock_graph(Z_SETTINGS), 8)[0])
    for label, unet in (("BF16", Z_BF16), ("INT8 ConvRot", Z_INT8)):
        settings = replace(Z_SETTINGS, unet_name=unet, filename_prefix=f"z_{unet[:-12]}")
        ours = image(gpu_host, run(gpu_host, f"Z-Image ours {label} (graph of host/graphs.py)",
                                   swiftdit_graph(settings), 8)[0])
        PSNR[f"ours {label} vs stock BF16"] = psnr(ours, stock)
    print(PSNR)
    assert PSNR["ours BF16 vs stock BF16"] > 25 and PSNR["ours INT8 ConvRot vs stock BF16"] > 20


def test_z_image_text_encoder_on_the_card_against_the_host(gpu_host):
    """Our graph with the text encoder on the card (BF16, the default) and on the host (f32, its loader's device
    "cpu"), the same files and seed: PSNR of the image of the card's encoding against the host's."""
    images = {}
    for device in ("cpu", "default"):
        settings = replace(Z_SETTINGS, unet_name=Z_BF16, text_device=device, filename_prefix=f"z_text_{device}")
        images[device] = image(gpu_host, run(gpu_host, f"Z-Image ours BF16, text encoder device {device}",
                                             swiftdit_graph(settings), 8)[0])
    PSNR["ours BF16, text encoder on the card vs on the host"] = psnr(images["default"], images["cpu"])
    print(PSNR)
    assert PSNR["ours BF16, text encoder on the card vs on the host"] > 25


def test_flux3_klein_workflow(gpu_host):
    """workflows/api/flux3_klein_t2i.json as it is (1024x1024, 16 steps, step cache 0.3), then a new seed."""
    graph = workflow("api/flux3_klein_t2i.json")
    for seed in (0, 1):
        image(gpu_host, run(gpu_host, f"FLUX.3 Klein ours INT8, seed {seed}", with_seed(graph, seed, f"klein_{seed}"),
                            16)[0])


def test_krea2_graph(gpu_host):
    for seed in (0, 1):
        image(gpu_host, run(gpu_host, f"Krea 2 ours INT8, seed {seed}", krea2_graph(seed), 8)[0])


def test_interrupt_within_a_run_then_free_then_one_more_prompt(gpu_host):
    """After the other families (ComfyUI freed ours for theirs): a long Z-Image run interrupted at its third step
    ends interrupted; /free empties our cache; the next prompt loads again and succeeds."""
    graph = with_seed(workflow("api/z_image_turbo_t2i.json"), 5, "z_interrupted")
    graph[sampler_of(graph)]["inputs"]["steps"] = 60
    sampler = sampler_of(graph)  # (a loader node's file read shows progress of its own)
    _, events, asked = gpu_host.run_interrupted(
        graph, lambda event: event.get("type") == "progress" and event["data"].get("node") == sampler
        and event["data"].get("value", 0) >= 3, TIMEOUT)
    assert events[-1]["type"] == "execution_interrupted", [e["type"] for e in events][-5:]
    print(f"interrupted {events[-1]['received'] - asked:.2f} s after asking")
    assert events[-1]["received"] - asked < 5
    freed = gpu_host.free_until(r"SwiftDiT: freed \d+ models")
    assert freed, gpu_host.log_tail()
    card, rss = memory(gpu_host)
    RESULTS.append({"prompt": "after /interrupt and /free", "seconds": 0.0, "sampler": 0.0, "card_gb": card,
                    "host_gb": rss})
    image(gpu_host, run(gpu_host, "Z-Image ours BF16 after /free", with_seed(workflow("api/z_image_turbo_t2i.json"),
                                                                              6, "z_after_free"), 8)[0])


def test_server_log_has_no_error_of_ours(gpu_host):
    """No traceback passes through the pack, no node reported an exception, and the process never met the
    allocator's abort (the test host's in-memory database logs tracebacks of its own: not ours); under ComfyUI's
    default allocator (cudaMallocAsync) the host-bound steps were captured (INT8 Z-Image and Klein on an H100) and
    no capture failed; the text encoders ran their fused layers and none fell back to transformers'."""
    log = gpu_host.log_text()
    assert not re.search(r'^  File ".*/custom_nodes/comfyui-swiftdit/', log, re.MULTILINE), log[-3000:]
    assert "!!! Exception during processing" not in log and "uncaptured free" not in log, log[-3000:]
    assert "could not be captured" not in log and "steps run without CUDA graphs" not in log, log[-3000:]
    assert "replayed from a CUDA graph from its next call" in log, log[-3000:]
    assert "layers run fused on cuda" in log and "fused layers failed" not in log, log[-3000:]


def test_z_image_with_cuda_graphs(gpu_host, tmp_path):
    """The Z-Image graphs again, on a second server started with --disable-cuda-malloc (PyTorch's own allocator):
    each of our steps replays a CUDA graph; the report sets these prompts beside the default allocator's."""
    server = ComfyHost(COMFYUI_TREE, tmp_path, sys.executable, extra_args=("--disable-cuda-malloc",), cpu=False,
                       cache_none=False)
    server.link_models({folder: gpu_host.base / "models" / folder
                        for folder in ("diffusion_models", "text_encoders", "vae", "loras")})
    server.start(timeout=180)
    try:
        for label, make, unet in (("stock BF16", stock_graph, Z_BF16), ("ours BF16", swiftdit_graph, Z_BF16),
                                  ("ours INT8 ConvRot", swiftdit_graph, Z_INT8)):
            for seed in (0, 1):
                settings = replace(Z_SETTINGS, seed=seed, unet_name=unet, filename_prefix=f"graphs_{seed}")
                label_run = f"Z-Image {label}, seed {seed}, --disable-cuda-malloc"
                image(server, run(server, label_run, make(settings), 8)[0])
        assert "steps run without CUDA graphs" not in server.log_text()
        assert "could not be captured" not in server.log_text()
    finally:
        server.stop()


def write_report(log: str) -> None:
    lines = [f"GPU server run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, allocator {allocator(log)}", "",
             "| prompt | whole graph (s) | sampler (s) | card in use (GB) | server RSS (GB) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['prompt']} | {r['seconds']:.2f} | {r['sampler']:.2f} | {r['card_gb']:.1f} | {r['host_gb']:.1f} |"
              for r in RESULTS]
    lines += ["", *(f"- PSNR {k}: {v:.2f} dB" for k, v in PSNR.items())]
    # each step shape's graph decision (GraphedStep's "host_bound"), each capture and its time (the text encoder's
    # too), any capture that failed, the text layers' path
    lines += [f"- {line.removeprefix('SwiftDiT: ')}" for line in log.splitlines()
              if line.startswith(("SwiftDiT: a step at input", "SwiftDiT: a CUDA graph of the step",
                                  "SwiftDiT: captured a CUDA graph"))
              or (line.startswith("SwiftDiT: ") and "fused" in line)]
    Path(REPORT).write_text("\n".join(lines) + "\n")


def allocator(log: str) -> str:
    return "cudaMallocAsync" if "cudaMallocAsync" in log else "PyTorch's native"
