"""./demo.sh: our Z-Image workflow and the stock graph on a real ComfyUI server, same files and seed."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from host import checkpoints, server
from host.graphs import Settings, stock_graph
from host.images import load, psnr
from host.server import ComfyHost, HostError, of_type
from swiftdit.workflow_api import to_api

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "z_image_turbo_t2i.json"
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
DEFAULT_OUTPUT = ROOT / "demo_output"
# The workflow's 1024x1024 is 4096 image tokens; 256x256 is 256, about 2 s a step for each graph on 2 CPU
# cores with the full-width random DiT, so the workflow's own 8 steps are kept: both run in under a minute.
DEFAULT_SIZE = 256
# Node classes of workflows/z_image_turbo_t2i.json whose inputs the demo reads or sets (the rest stays).
LATENT, SAMPLER, ENCODE = "EmptySD3LatentImage", "SwiftDiTZImageSampler", "SwiftDiTZImageTextEncode"
LOADER, SAMPLING, TE_LOADER, VAE_LOADER = (
    "SwiftDiTZImageLoader",
    "SwiftDiTZImageModelSamplingAuraFlow",
    "SwiftDiTZImageTextEncoderLoader",
    "SwiftDiTZImageVAELoader",
)


class DemoError(Exception):
    """Something the user can act on: printed without a traceback, exit status 1."""


@dataclass
class Result:
    name: str
    seconds: float  # POST /prompt until the terminal event: loading, encoding, sampling, decoding, saving
    sampling: float | None  # the sampler node alone (from its `executing` event to the next node's)
    image: Path


def log(message: str) -> None:
    print(message, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="./demo.sh",
        description="Run workflows/z_image_turbo_t2i.json (SwiftDiT nodes) and the stock ComfyUI graph on a "
        "real ComfyUI v0.3.75 server, on the same random-weight Z-Image files and seed, and compare them.",
    )
    p.add_argument("--width", type=int, default=DEFAULT_SIZE, help=f"image width (default {DEFAULT_SIZE})")
    p.add_argument("--height", type=int, default=DEFAULT_SIZE, help=f"image height (default {DEFAULT_SIZE})")
    p.add_argument(
        "--steps", type=int, default=None, help="sampler steps (default: the workflow's, 8)"
    )
    p.add_argument("--seed", type=int, default=None, help="sampler seed (default: the workflow's, 0)")
    p.add_argument("--prompt", default=None, help="positive prompt (default: the workflow's)")
    p.add_argument(
        "--int8",
        action="store_true",
        help="also run our workflow on the INT8 ConvRot file (z_image_turbo_int8_convrot.safetensors)",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="where the images are copied (default demo_output/; existing files are never replaced)",
    )
    p.add_argument("--port", type=int, default=0, help="server port (default: any free port)")
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds allowed for each graph (default 1800)"
    )
    args = p.parse_args(argv)
    # EmptySD3LatentImage makes width/8 x height/8 latents and Z-Image patches them 2x2: multiples of 16.
    for name in ("width", "height"):
        value = getattr(args, name)
        if value < 16 or value % 16:
            p.error(f"--{name} must be a multiple of 16, at least 16 (got {value})")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1 (got {args.steps})")
    if args.seed is not None and args.seed < 0:
        p.error(f"--seed must be 0 or more (got {args.seed})")
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be 0..65535 (got {args.port})")
    return args


def the_node(prompt: dict, class_type: str) -> dict:
    """The one node of a class in the workflow: the demo sets its inputs, so there must be exactly one."""
    found = [node for node in prompt.values() if node["class_type"] == class_type]
    if len(found) != 1:
        raise DemoError(f"{WORKFLOW.name}: expected one {class_type} node, found {len(found)}")
    return found[0]


def node_id(prompt: dict, class_type: str) -> str:
    return next(i for i, node in prompt.items() if node["class_type"] == class_type)


def workflow_prompt(object_info: dict, args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The workflow in API form as the frontend would queue it, with the demo's overrides; a line for each."""
    try:
        workflow = json.loads(WORKFLOW.read_text(encoding="utf-8"))
        prompt = to_api(workflow, object_info)
    except (OSError, ValueError) as e:
        raise DemoError(f"cannot convert {WORKFLOW}: {e}") from None
    changes = []

    def override(class_type: str, name: str, value) -> None:
        inputs = the_node(prompt, class_type)["inputs"]
        if value is not None and inputs.get(name) != value:
            changes.append(f"{class_type}.{name}: {inputs.get(name)!r} -> {value!r}")
            inputs[name] = value

    override(LATENT, "width", args.width)
    override(LATENT, "height", args.height)
    override(SAMPLER, "steps", args.steps)
    override(SAMPLER, "seed", args.seed)
    override(ENCODE, "text", args.prompt)
    return prompt, changes


def stock_settings(prompt: dict) -> Settings:
    """host.graphs Settings holding the workflow's own values, so the stock graph runs what ours runs."""
    sampler = the_node(prompt, SAMPLER)["inputs"]
    latent = the_node(prompt, LATENT)["inputs"]
    return Settings(
        prompt=the_node(prompt, ENCODE)["inputs"]["text"],
        width=latent["width"],
        height=latent["height"],
        steps=sampler["steps"],
        seed=sampler["seed"],
        cfg=sampler["cfg"],
        shift=the_node(prompt, SAMPLING)["inputs"]["shift"],
        sampler_name=sampler["sampler_name"],
        scheduler=sampler["scheduler"],
        denoise=sampler["denoise"],
        unet_name=the_node(prompt, LOADER)["inputs"]["unet_name"],
        clip_name=the_node(prompt, TE_LOADER)["inputs"]["clip_name"],
        vae_name=the_node(prompt, VAE_LOADER)["inputs"]["vae_name"],
        filename_prefix="stock",
    )


def run_graph(
    host: ComfyHost, name: str, prompt: dict, sampler_id: str, timeout: float
) -> tuple[Path, float, float | None]:
    """Queue a graph, wait for its terminal event; the saved image, total seconds and sampler seconds."""
    started: dict[str | None, float] = {}

    def stamp(event: dict) -> None:
        # ComfyUI sends `executing` as each node starts (node None when the prompt ends): the sampler's time
        # is from its own event to the next one's.
        if event.get("type") == "executing":
            started.setdefault((event.get("data") or {}).get("node"), time.monotonic())

    with host.events() as stream:
        t0 = time.monotonic()
        prompt_id = host.post(prompt, stream.client_id)
        events = stream.collect(prompt_id, timeout, stamp)
        seconds = time.monotonic() - t0
    entry = host.wait(prompt_id, timeout=60)
    if entry["status"]["status_str"] != "success":
        errors = of_type(events, "execution_error")
        detail = (
            f"{errors[0]['node_type']} (node {errors[0]['node_id']}): {errors[0]['exception_message']}"
            if errors
            else json.dumps(entry["status"])
        )
        raise DemoError(f"{name} failed: {detail}\nserver log: {host.log_path}\n{host.log_tail(2000)}")
    files = host.output_files(entry)
    if len(files) != 1:
        raise DemoError(f"{name}: expected one saved image, the server lists {len(files)}")
    sampling = None
    if sampler_id in started:
        later = [t for t in started.values() if t > started[sampler_id]]
        end = min(later) if later else time.monotonic()
        sampling = end - started[sampler_id]
    return files[0], seconds, sampling


def copy_new(src: Path, folder: Path, stem: str) -> Path:
    """Copy src to folder/stem.png, or stem-2.png, stem-3.png, ...: an existing file is never replaced."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(1, 100_000):
            dst = folder / (f"{stem}.png" if n == 1 else f"{stem}-{n}.png")
            try:
                with open(src, "rb") as inp, open(dst, "xb") as out:  # "x": fails if the name is taken
                    shutil.copyfileobj(inp, out)
                return dst
            except FileExistsError:
                continue
    except OSError as e:
        raise DemoError(f"cannot write the image into {folder}: {e}") from None
    raise DemoError(f"{folder}: no free name for {stem}-N.png")


def check_port(port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise DemoError(
                f"port {port} is busy ({e.strerror}): is another ComfyUI running? Pass another --port, or "
                f"leave --port out to use any free one"
            ) from None


def start_host(models: checkpoints.ModelSet, base: Path, port: int) -> ComfyHost:
    if not (COMFYUI_TREE / "main.py").is_file():
        raise DemoError(f"no ComfyUI tree at {COMFYUI_TREE}: run ./demo.sh (host/install.sh unpacks it)")
    if port:
        # ComfyHost picks a free port itself; a fixed one is asked for only through --port.
        server.free_port = lambda: port
    host = ComfyHost(COMFYUI_TREE, base, sys.executable)
    host.link_models(models.folders)
    log(f"starting ComfyUI v0.3.75 (CPU) with this pack; log: {host.log_path}")
    t0 = time.monotonic()
    try:
        host.start(timeout=180)
    except BaseException as e:
        host.stop()  # a Ctrl-C while it starts must not leave the server running in its own session
        if not isinstance(e, HostError):
            raise
        text = str(e)
        if "address already in use" in text.lower():
            raise DemoError(
                f"port {host.port} was taken before ComfyUI bound it: run again\n{text}"
            ) from None
        raise DemoError(f"the ComfyUI server did not start (log {host.log_path}):\n{text}") from None
    log(f"server up at {host.url} in {time.monotonic() - t0:.1f} s")
    return host


def table(results: list[Result], reference: Result) -> str:
    rows = [("graph", "total", "sampler", "image", f"PSNR vs {reference.name}")]
    for r in results:
        quality = "-" if r is reference else f"{psnr(load(reference.image), load(r.image)):.1f} dB"
        sampling = "-" if r.sampling is None else f"{r.sampling:.1f} s"
        try:
            shown = r.image.relative_to(Path.cwd())
        except ValueError:
            shown = r.image
        rows.append((r.name, f"{r.seconds:.1f} s", sampling, str(shown), quality))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def demo(args: argparse.Namespace, base: Path) -> None:
    log("SwiftDiT demo: the Z-Image checkpoint set is RANDOM WEIGHTS made on this machine (none ship);")
    log("the images are noise-like patterns, useful only to compare the two graphs.")
    check_port(args.port)  # before the slow steps: a busy port is the user's to fix
    models = checkpoints.ensure(layers=1, log=lambda m: log(f"{m}; first run only: about 30 s, 2.9 GB"))
    log(f"models: {models.root}")
    host = start_host(models, base, args.port)
    try:
        object_info = host.object_info()
        if LOADER not in object_info:  # ComfyUI starts without a pack it cannot import: say why, from its log
            raise DemoError(f"{host.pack_import_error() or 'the pack loaded no nodes'}; log: {host.log_path}")
        prompt, changes = workflow_prompt(object_info, args)
        settings = stock_settings(prompt)
        log(f"workflow: {WORKFLOW.relative_to(ROOT)}, queued as stored except:")
        for line in changes or ["(nothing)"]:
            log(f"  {line}")
        log(
            f"settings: {settings.width}x{settings.height}, {settings.steps} steps, seed {settings.seed}, "
            f"{settings.sampler_name}/{settings.scheduler}, cfg {settings.cfg}, shift {settings.shift}"
        )
        stem = f"z_image_{settings.width}x{settings.height}_s{settings.steps}_seed{settings.seed}"
        results = []
        runs = [("SwiftDiT workflow", prompt, node_id(prompt, SAMPLER), "swiftdit")]
        stock = stock_graph(settings)
        runs.append(("ComfyUI stock nodes", stock, node_id(stock, "KSampler"), "stock"))
        if args.int8:
            int8 = json.loads(json.dumps(prompt))
            the_node(int8, LOADER)["inputs"]["unet_name"] = checkpoints.DIT_INT8
            runs.append(("SwiftDiT workflow INT8", int8, node_id(int8, SAMPLER), "swiftdit_int8"))
        for name, graph, sampler_id, suffix in runs:
            log(f"running {name} ...")
            saved, seconds, sampling = run_graph(host, name, graph, sampler_id, args.timeout)
            image = copy_new(saved, args.output_dir, f"{stem}_{suffix}")
            log(f"  {seconds:.1f} s -> {image}")
            results.append(Result(name, seconds, sampling, image))
    finally:
        # A second Ctrl-C must not cut the stop short and leave the server running: ignored until it is down.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log("stopping the ComfyUI server")
        host.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    log("")
    log(table(results, results[0]))
    log("total: POST /prompt to the last event: loading files, text encoding, sampling, VAE decode, saving.")
    log("sampler: that node alone. SwiftDiT's loader nodes read their file when it is first used, so its")
    log("sampler time also holds loading the DiT (the stock UNETLoader loads before). Both graphs take their")
    log("conditioning from SwiftDiT's text encoder nodes (loaded once, in the first graph's time).")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (e.g. `timeout`, a closed terminal) must stop the server as Ctrl-C does: unwind through finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    (ROOT / ".cache").mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="demo-server-", dir=ROOT / ".cache"))
    failed = False
    try:
        demo(args, base)
        return 0
    except DemoError as e:
        failed = True
        print(f"demo: {e}", file=sys.stderr)
        return 1
    except HostError as e:
        failed = True
        print(f"demo: ComfyUI: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted; the ComfyUI server is stopped", file=sys.stderr)
        return 130
    finally:
        # Keep the server folder when its log can tell what went wrong; otherwise leave nothing behind.
        if failed and (base / "server.log").is_file():
            print(f"demo: server folder kept for its log: {base / 'server.log'}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
