"""Z-Image on a real ComfyUI v0.3.75 server: our nodes as documented, our graph against the stock one, and the
ComfyUI behaviour users expect (progress per step, cancel, models kept and freed, errors on the node)."""

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swiftdit.swap import swap_api
from host.graphs import (DECODE, MODEL_LOADER, SAMPLER, SAMPLING, SAVE, TEXT_LOADER, VAE_LOADER, Settings, stock_graph,
                         swiftdit_graph)
from host.images import PNG_SIGNATURE, load, psnr
from host.server import TERMINAL_EVENTS, HostError, of_type

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CATEGORY = "SwiftDiT/Z-Image"
SETTINGS = Settings()  # 128x96 (48 tokens: image padding is exercised), 3 steps, res_multistep/simple, cfg 1
INT8 = "z_image_turbo_int8_convrot.safetensors"
TIMEOUT = 300.0
LORA_NODE = "16"
LORA = "z_image_widget_test_lora.safetensors"  # tests/host/conftest.py puts it in models/lora

# docs/nodes.md: node id -> (required inputs in order, optional inputs in order, output types).
NODES = {
    "SwiftDiTZImageLoader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb"], [], ["SWIFTDIT_MODEL"]),
    "SwiftDiTZImageTextEncoderLoader": (["clip_name", "type"], ["device"], ["SWIFTDIT_TEXT_ENCODER"]),
    "SwiftDiTZImageTextEncode": (["text", "clip"], [], ["CONDITIONING"]),
    "SwiftDiTZImageModelSamplingAuraFlow": (["model", "shift"], [], ["SWIFTDIT_MODEL"]),
    "SwiftDiTZImageLoraLoaderModelOnly": (["model", "lora_name", "strength_model"], [], ["SWIFTDIT_MODEL"]),
    "SwiftDiTZImageSampler": (
        [
            "model",
            "seed",
            "steps",
            "cfg",
            "sampler_name",
            "scheduler",
            "positive",
            "negative",
            "latent_image",
            "denoise",
        ],
        [],
        ["LATENT"],
    ),
    "SwiftDiTZImageVAELoader": (["vae_name"], [], ["SWIFTDIT_VAE"]),
    "SwiftDiTZImageVAEDecode": (["samples", "vae"], [], ["IMAGE"]),
}
# Wire inputs and plain widgets: input name -> its ComfyUI type, the same on every node that has it.
INPUT_TYPES = {
    "model": "SWIFTDIT_MODEL",
    "clip": "SWIFTDIT_TEXT_ENCODER",
    "vae": "SWIFTDIT_VAE",
    "positive": "CONDITIONING",
    "negative": "CONDITIONING",
    "latent_image": "LATENT",
    "samples": "LATENT",
    "text": "STRING",
    "seed": "INT",
    "steps": "INT",
    "cfg": "FLOAT",
    "denoise": "FLOAT",
    "shift": "FLOAT",
    "strength_model": "FLOAT",
    "gpu_budget_gb": "FLOAT",
}
# Combos with fixed options (docs/nodes.md), in the documented order.
COMBOS = {
    ("SwiftDiTZImageLoader", "weight_dtype"): ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"],
    ("SwiftDiTZImageLoader", "linears"): ["as stored", "int8 convrot", "bf16"],
    ("SwiftDiTZImageTextEncoderLoader", "type"): ["lumina2"],
    ("SwiftDiTZImageTextEncoderLoader", "device"): ["default", "cpu"],
}
# The sampler's choices: docs/nodes.md names them; the scheduler list is the stock KSampler's, in its order.
SAMPLER_NAMES = {"euler", "res_multistep"}
SCHEDULERS = {
    "simple",
    "normal",
    "sgm_uniform",
    "karras",
    "exponential",
    "ddim_uniform",
    "beta",
    "linear_quadratic",
    "kl_optimal",
}
# Combos listing a models folder -> files of the checkpoint set they must offer.
FOLDER_COMBOS = {
    ("SwiftDiTZImageLoader", "unet_name"): ["z_image_turbo_bf16.safetensors", INT8],
    ("SwiftDiTZImageTextEncoderLoader", "clip_name"): ["qwen_3_4b.safetensors"],
    ("SwiftDiTZImageVAELoader", "vae_name"): ["ae.safetensors"],
    ("SwiftDiTZImageLoraLoaderModelOnly", "lora_name"): [LORA],
}


@dataclass
class Run:
    entry: dict  # the /history entry
    events: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return self.entry["status"]["status_str"]


class Runs:
    """Graph runs shared by the tests of this module (the full-width model makes each one cost seconds)."""

    def __init__(self, host):
        self.host = host
        self.done: dict[str, Run] = {}

    def get(self, name: str, graph: dict) -> Run:
        if name not in self.done:
            entry, events, seconds = self.host.run(graph, TIMEOUT)
            self.done[name] = Run(entry, events, seconds)
        return self.done[name]


@pytest.fixture(scope="module")
def runs(host) -> Runs:
    return Runs(host)


def combo_options(spec) -> list:
    """A combo's options in /object_info: classic `[[...], {...}]` or V3 `["COMBO", {"options": [...]}]`."""
    kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
    return list(kind) if isinstance(kind, list) else list(opts.get("options", []))


def saved_image(host, run: Run):
    """The one image SaveImage wrote for a run: checked through /history, the output folder and GET /view."""
    assert run.status == "success", _error_text(run)
    images = run.entry["outputs"][SAVE]["images"]
    assert len(images) == 1
    path = host.output_files({"outputs": {SAVE: {"images": images}}})[0]
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert host.view(images[0]) == data
    return load(path)


def _error_text(run: Run) -> str:
    errors = of_type(run.events, "execution_error")
    return (
        f"{errors[0]['node_type']}: {errors[0]['exception_message']}" if errors else str(run.entry["status"])
    )


def test_object_info_lists_every_node_as_documented(host):
    # Every Z-Image node id of docs/nodes.md is in the table above: a node added to the docs is tested here.
    doc = (ROOT / "docs" / "nodes.md").read_text()
    documented = set(re.findall(r"^\| `(SwiftDiTZImage\w+)`", doc, flags=re.MULTILINE))
    assert documented == set(NODES)
    info = host.object_info()
    missing = sorted(set(NODES) - set(info))
    assert not missing, f"not registered: {missing}; server log:\n{host.log_tail()}"
    for node, (required, optional, outputs) in NODES.items():
        n = info[node]
        assert n["category"] == CATEGORY, node
        assert n["python_module"] == "custom_nodes.comfyui-swiftdit", node
        assert n["input_order"].get("required", []) == required, node
        assert n["input_order"].get("optional", []) == optional, node
        assert n["output"] == outputs, node
        specs = {**n["input"].get("required", {}), **n["input"].get("optional", {})}
        for name, spec in specs.items():
            if name in INPUT_TYPES:
                assert spec[0] == INPUT_TYPES[name], (node, name, spec)
        for (combo_node, name), options in COMBOS.items():
            if combo_node == node:
                assert combo_options(specs[name]) == options, (node, name)
        for (combo_node, name), files in FOLDER_COMBOS.items():
            if combo_node == node:
                assert set(files) <= set(combo_options(specs[name])), (node, name, specs[name])
    sampler = info["SwiftDiTZImageSampler"]["input"]["required"]
    assert sampler["seed"][1].get("control_after_generate") is True
    assert set(combo_options(sampler["sampler_name"])) == SAMPLER_NAMES
    stock_schedulers = combo_options(info["KSampler"]["input"]["required"]["scheduler"])
    assert set(stock_schedulers) == SCHEDULERS
    assert combo_options(sampler["scheduler"]) == stock_schedulers
    assert info["SwiftDiTZImageTextEncode"]["input"]["required"]["text"][1].get("multiline") is True
    assert info["SwiftDiTZImageModelSamplingAuraFlow"]["input"]["required"]["shift"][1]["default"] == 3.0
    assert (
        info["SwiftDiTZImageLoraLoaderModelOnly"]["input"]["required"]["strength_model"][1]["default"] == 1.0
    )


def test_bf16_graph_matches_stock_graph(host, runs):
    stock = runs.get("stock_bf16", stock_graph(SETTINGS))
    log = host.log_text()
    # Loading is strict=False in ComfyUI: a key mismatch only logs and leaves parameters uninitialized.
    for line in ("unet missing", "unet unexpected", "Missing VAE keys"):
        assert line not in log, f"stock loader: {line}:\n{host.log_tail()}"
    # Ours is the stock graph as `swiftdit swap` rewrites it (the same graph host.graphs builds by hand).
    swapped, _ = swap_api(stock_graph(SETTINGS))
    assert swapped == swiftdit_graph(SETTINGS)
    ours = runs.get("ours_bf16", swapped)
    a, b = saved_image(host, stock), saved_image(host, ours)
    assert a.shape == (SETTINGS.height, SETTINGS.width, 3)
    assert a.std() > 10, "the stock image is flat: the random checkpoint set is degenerate"
    value = psnr(a, b)
    print(
        f"\nZ-Image BF16 {SETTINGS.width}x{SETTINGS.height}, {SETTINGS.steps} steps: "
        f"stock {stock.seconds:.1f} s, SwiftDiT {ours.seconds:.1f} s, PSNR {value:.1f} dB"
    )
    assert value >= 40.0


def test_int8_graph_close_to_bf16_graph(host, runs):
    # Stock ComfyUI v0.3.75 cannot read INT8 ConvRot files (only FP8 quantized weights: comfyui_host.md
    # section 6), so our INT8 graph is compared with our BF16 graph on the same seed instead.
    ours_bf16 = runs.get("ours_bf16", swiftdit_graph(SETTINGS))
    ours_int8 = runs.get("ours_int8", swiftdit_graph(Settings(unet_name=INT8)))
    value = psnr(saved_image(host, ours_bf16), saved_image(host, ours_int8))
    print(
        f"\nZ-Image INT8 ConvRot vs BF16: {ours_int8.seconds:.1f} s vs {ours_bf16.seconds:.1f} s, "
        f"PSNR {value:.1f} dB"
    )
    assert value >= 30.0


def test_loader_shows_where_the_model_is_on_its_node(host):
    """The loader's report (the file, GiB on the GPU or MiB of host memory) reaches the editor as the node's text."""
    entry, events, _ = host.run(swiftdit_graph(Settings(steps=1, seed=11, filename_prefix="loader_text")), TIMEOUT)
    assert entry["status"]["status_str"] == "success"
    [shown] = [e["text"] for e in of_type(events, "progress_text", node=MODEL_LOADER)]
    assert shown.startswith("z_image_turbo_bf16.safetensors: ") and "host memory" in shown, shown


def test_sampler_reports_progress_per_step(host, runs):
    run = runs.get("ours_bf16", swiftdit_graph(SETTINGS))
    progress = of_type(run.events, "progress", node=SAMPLER)
    assert [p["value"] for p in progress] == list(range(1, SETTINGS.steps + 1))
    assert {p["max"] for p in progress} == {SETTINGS.steps}
    assert {p["prompt_id"] for p in progress} == {run.entry["prompt"][1]}


def test_cancel_stops_the_sampler_and_server_stays_usable(host):
    """Cancel on a real server: the prompt ends interrupted at the sampler with no image saved, and the next prompt
    runs. (ComfyUI's own progress hook also interrupts at the next step, so this cannot tell that our check inside a
    step ran: tests/nodes/test_z_image_nodes.py test_cancel_interrupts_within_a_step proves that.)"""
    steps = 8
    graph = swiftdit_graph(Settings(steps=steps, seed=7, filename_prefix="cancelled"))
    prompt_id, events, asked = host.run_interrupted(
        graph, lambda event: event["type"] == "progress" and event["data"].get("node") == SAMPLER, TIMEOUT)
    latency = time.monotonic() - asked
    assert events[-1]["type"] == "execution_interrupted", [e["type"] for e in events]
    assert events[-1]["data"]["node_id"] == SAMPLER
    progress = of_type(events, "progress", node=SAMPLER)
    print(
        f"\ncancel: {len(progress)} of {steps} sampler progress events, "
        f"interrupted {latency:.2f} s after Cancel"
    )
    # The first progress event triggered the interrupt; at most the step already running may still report.
    assert len(progress) <= 2, f"{len(progress)} of {steps} steps ran after Cancel ({latency:.1f} s)"
    entry = host.wait(prompt_id, 30)
    assert entry["status"]["status_str"] == "error"
    assert not entry["outputs"].get(SAVE)
    after = host.run(swiftdit_graph(Settings(steps=1, seed=8, filename_prefix="after_cancel")), TIMEOUT)
    assert saved_image(host, Run(*after)).shape == (SETTINGS.height, SETTINGS.width, 3)


def test_cancel_inside_a_long_decode(host):
    """Cancel while the VAE decodes a tiled image (576x512: two tiles of the full-size VAE): the decode stops within
    the tile that is running (between the decoder's blocks), named as the interrupted node, with no image saved."""
    graph = swiftdit_graph(Settings(width=576, height=512, steps=1, seed=9, filename_prefix="decode_cancelled"))
    prompt_id, events, asked = host.run_interrupted(
        graph, lambda event: event["type"] == "executing" and event["data"].get("node") == DECODE, TIMEOUT)
    assert events[-1]["type"] == "execution_interrupted", [e["type"] for e in events]
    assert events[-1]["data"]["node_id"] == DECODE
    tiles = of_type(events, "progress", node=DECODE)
    assert not tiles, f"{len(tiles)} decode tiles finished after Cancel"
    print(f"\ncancel in the decode: interrupted {events[-1]['received'] - asked:.2f} s after Cancel")
    assert not host.wait(prompt_id, 30)["outputs"].get(SAVE)


def test_models_kept_across_prompts_and_freed_on_unload(host):
    def graph(seed):
        return swiftdit_graph(Settings(seed=seed, steps=1, filename_prefix=f"keep{seed}"))

    def run(seed):
        r = Run(*host.run(graph(seed), TIMEOUT))
        assert r.status == "success", _error_text(r)
        return r

    # Two prompts queued back to back: each model is loaded at most once (whatever earlier tests left loaded
    # is reused), and a third prompt loads nothing. The server runs with --cache-none, so this is our own
    # model cache, not ComfyUI's node output cache.
    mark = host.log_mark()
    queued = [host.post(graph(seed)) for seed in (1, 2)]
    for prompt_id in queued:
        assert host.wait(prompt_id, TIMEOUT)["status"]["status_str"] == "success"
    loads = re.findall(r"SwiftDiT: loaded (\S+)", host.log_since(mark))
    assert len(loads) == len(set(loads)), f"a model was loaded twice for two queued prompts: {loads}"
    mark = host.log_mark()
    kept = run(3)
    assert "SwiftDiT: loaded" not in host.log_since(mark), "a model was reloaded for a later prompt"

    freed = host.free_until(r"SwiftDiT: freed (\d+) models")
    assert freed, f"no 'SwiftDiT: freed' line after POST /free:\n{host.log_tail()}"
    assert int(freed.group(1)) == 3  # DiT, text encoder, VAE

    mark = host.log_mark()
    reloaded_run = run(4)
    reloaded = host.log_since(mark)
    for name in ("z_image_turbo_bf16.safetensors", "qwen_3_4b.safetensors", "ae.safetensors"):
        assert f"SwiftDiT: loaded {name}" in reloaded, reloaded
    print(f"\nmodels kept: {kept.seconds:.1f} s; after unload (reload): {reloaded_run.seconds:.1f} s")


# 136 px -> 17 latent columns: not a whole number of 2x2 patches (EmptySD3LatentImage's step 16 is a frontend
# hint only; the server accepts 136). The wrong-family file is a Qwen3 text encoder put in models/unet under a
# DiT-like name by tests/host/conftest.py.
NAN = float("nan")  # passes ComfyUI's own min/max checks: the node must refuse it
ERROR_CASES = {
    "latent off the patch grid": (Settings(width=136), SAMPLER, "SwiftDiTZImageSampler", "latent_image"),
    "wrong-family file": (
        Settings(unet_name="not_z_image_qwen3.safetensors"),
        MODEL_LOADER,
        "SwiftDiTZImageLoader",
        "unet_name",
    ),
    "cfg NaN": (Settings(cfg=NAN), SAMPLER, "SwiftDiTZImageSampler", "cfg"),
    # ComfyUI v0.3.75 checks no V3 combo against its options: the sampler does
    "sampler_name unknown": (Settings(sampler_name="dpmpp_2m"), SAMPLER, "SwiftDiTZImageSampler", "sampler_name"),
    "scheduler unknown": (Settings(scheduler="bogus"), SAMPLER, "SwiftDiTZImageSampler", "scheduler"),
    "denoise NaN": (Settings(denoise=NAN), SAMPLER, "SwiftDiTZImageSampler", "denoise"),
    "shift NaN": (Settings(shift=NAN), SAMPLING, "SwiftDiTZImageModelSamplingAuraFlow", "shift"),
    "shift 0": (Settings(shift=0.0), SAMPLING, "SwiftDiTZImageModelSamplingAuraFlow", "shift"),
    "gpu_budget_gb NaN": (Settings(gpu_budget_gb=NAN), MODEL_LOADER, "SwiftDiTZImageLoader", "gpu_budget_gb"),
    "LoRA strength NaN": (Settings(), LORA_NODE, "SwiftDiTZImageLoraLoaderModelOnly", "strength_model"),
    # A pass over 8192x8192 (262144 rows of the full-width model) needs about 70 GiB on the host path: refused before
    # any work, and the server goes on (the tests after this one).
    "8192x8192 too large": (Settings(width=8192, height=8192), SAMPLER, "SwiftDiTZImageSampler", "largest image"),
}


def with_lora(graph: dict, strength: float) -> dict:
    """graph with our LoRA node between the loader and ModelSamplingAuraFlow (conftest's LoRA file)."""
    graph[LORA_NODE] = {"class_type": "SwiftDiTZImageLoraLoaderModelOnly",
                        "inputs": {"model": [MODEL_LOADER, 0], "lora_name": LORA, "strength_model": strength}}
    graph[SAMPLING]["inputs"]["model"] = [LORA_NODE, 0]
    return graph


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_the_node_and_the_input(host, case):
    settings, node, node_type, name = ERROR_CASES[case]
    graph = swiftdit_graph(settings)
    if node == LORA_NODE:
        graph = with_lora(graph, NAN)
    entry, events, _ = host.run(graph, TIMEOUT)
    assert entry["status"]["status_str"] == "error"
    assert not [e for e in events if e["type"] == "execution_success"]
    errors = of_type(events, "execution_error")
    assert len(errors) == 1 and events[-1]["type"] in TERMINAL_EVENTS
    error = errors[0]
    assert (error["node_id"], error["node_type"]) == (node, node_type)
    message = error["exception_message"]
    display = host.object_info(node_type)[node_type]["display_name"]
    assert node_type in message or display in message, message
    assert name in message, message
    assert DECODE not in error["executed"]


def test_missing_files_are_refused_together_before_the_run(host):
    """Three files that are not in ComfyUI's folders: the queue refuses the graph at once (HTTP 400), each loader
    named by its display name and input, rather than the first loader failing when it runs."""
    graph = swiftdit_graph(Settings(unet_name="gone_dit.safetensors", clip_name="gone_te.safetensors",
                                    vae_name="gone_vae.safetensors"))
    with pytest.raises(HostError) as refused:
        host.post(graph)
    errors = json.loads(str(refused.value).split(": ", 2)[2])["node_errors"]
    assert sorted(errors) == sorted([MODEL_LOADER, TEXT_LOADER, VAE_LOADER])
    for node, (display, name) in {MODEL_LOADER: ("Z-Image Loader (SwiftDiT)", "unet_name"),
                                  TEXT_LOADER: ("Z-Image Text Encoder Loader (SwiftDiT)", "clip_name"),
                                  VAE_LOADER: ("Z-Image VAE Loader (SwiftDiT)", "vae_name")}.items():
        [error] = errors[node]["errors"]
        assert f"{display} · {name}: 'gone_" in error["details"] and "put the file there" in error["details"]
