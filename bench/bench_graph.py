"""Whole graphs in a real ComfyUI v0.3.75 server, as a user runs them: for each graph, on a server of its own,
  1. cold: from the server's start to the first image, every load and build included;
  2. a new prompt and seed (the text encoder runs again);
  3. the same prompt, a new seed (ComfyUI's cache keeps the encoding);
  (2 and 3 each --repeats times, 3 by default: new prompts of several lengths, then new seeds of the last; their
  medians, every run listed under the table)
  4. cold after a restart: a second server on the same machine, from its start to the first image (Triton's cache on
     disk kept from the first: what every start after the first on a machine costs);
  5. (ours, --prebuild) cold after `swiftdit prebuild`: a new machine's Triton cache filled once from the graph's
     model files (timed: case 0), then a server from its start to the first image;
with the peak memory of the server process on the card and in host RAM over each case (sampled every 0.1 s).
Z-Image Turbo: the stock template graph (CLIPLoader + CLIPTextEncode, UNETLoader BF16, ModelSamplingAuraFlow,
KSampler, VAELoader + VAEDecode) against our workflow (workflows/api/z_image_turbo_t2i.json on the INT8 ConvRot file),
1024x1024, 8 steps. FLUX.3 Klein and Krea 2 (which ComfyUI v0.3.75 lacks): our workflows against diffusers' pipelines
end to end (bench/graph_peers.py: Flux3DistilledAutoBlocks, 16 steps; Krea2Pipeline, 8 steps; BF16), each in a
process of its own started by this one (cold: from the spawn to the first image; the prompt is re-encoded on every
call, as a plain user of the pipeline gets it), from the same random files converted once, untimed, to diffusers'
layout. The peers' memory is sampled as the server's (the process on the card, host RSS); torch's
max_memory_allocated of each case is given under the table.

Random weights of the real sizes under the templates' file names, written once under .cache/bench_graph/ (Z-Image:
host/checkpoints.py's DiT with Qwen3-4B's 2560-wide caption rows, a random Qwen3-4B in ComfyUI's layout from
tests/fixtures/real_size_shapes.json, the FLUX.1 VAE; Klein and Krea 2: tests/real_size.py).

    python bench/bench_graph.py [--only z_image flux3_klein krea2] [--report FILE]    # on a GPU
    python bench/bench_graph.py --smoke    # on the CPU: host/checkpoints.py's tiny set, our Z-Image graph, and
                                           # the two diffusers peers on tiny random files (64x64, 2 steps)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from host import checkpoints  # noqa: E402
from host.graphs import Settings, krea2_graph, swiftdit_graph  # noqa: E402
from host.server import ComfyHost, card_gb, node_seconds, of_type  # noqa: E402

COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
FILES = ROOT / ".cache" / "bench_graph"
FOLDERS = ("diffusion_models", "text_encoders", "vae", "loras")
PROMPTS = ("a red fox sitting in fresh snow, golden hour", "a lighthouse on a cliff at dusk, oil painting",
           "macro photograph of dew on a spider web at sunrise, shallow depth of field, soft green background",
           "a bowl of ramen", "an astronaut reading a newspaper on a park bench in autumn, leaves falling, film grain, "
           "wide shot, muted colours, 35 mm")
TIMEOUT = 900.0
BUILD_LINE = re.compile(r"SwiftDiT: .*(Triton kernels|kernels not built|run fused|layers failed|as it launched"
                        r"|captured a CUDA)")
# Qwen3-4B (Z-Image's text encoder) has Qwen3-VL-4B's text model's sizes and names under `model.`.
QWEN3_4B_FROM = "qwen3vl_4b_int8_convrot.safetensors"


@dataclass
class Peaks:
    """The most memory the server process held on the card and in host RAM while it ran (a sampling thread)."""
    pid: int
    card_gb: float = 0.0
    host_gb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Peaks:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil
        while not self._stop.is_set():
            try:
                self.host_gb = max(self.host_gb, psutil.Process(self.pid).memory_info().rss / 1e9)
            except psutil.Error:
                pass
            self.card_gb = max(self.card_gb, card_gb(self.pid))
            self._stop.wait(0.1)


def with_prompt(graph: dict, prompt: str, seed: int, prefix: str) -> dict:
    """graph with its text encode's prompt, every sampler's seed and the SaveImage prefix set."""
    graph = json.loads(json.dumps(graph))
    for body in graph.values():
        inputs = body["inputs"]
        if "text" in inputs and "clip" in inputs:
            inputs["text"] = prompt
        if "seed" in inputs:
            inputs["seed"] = seed
        if body["class_type"] in ("SaveImage", "SwiftDiTSaveImage"):
            inputs["filename_prefix"] = prefix
    return graph


def stock_z_image(size: int, steps: int) -> dict:
    """The official image_z_image_turbo template's graph (reference/templates.md section 3), as the frontend queues
    it: stock nodes only, the BF16 files."""
    return {
        "30": {"class_type": "CLIPLoader", "inputs": {"clip_name": checkpoints.TEXT_ENCODER, "type": "lumina2",
                                                      "device": "default"}},
        "27": {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPTS[0], "clip": ["30", 0]}},
        "33": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["27", 0]}},
        "13": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "28": {"class_type": "UNETLoader", "inputs": {"unet_name": checkpoints.DIT_BF16, "weight_dtype": "default"}},
        "11": {"class_type": "ModelSamplingAuraFlow", "inputs": {"model": ["28", 0], "shift": 3.0}},
        "3": {"class_type": "KSampler", "inputs": {"model": ["11", 0], "seed": 0, "steps": steps, "cfg": 1.0,
                                                  "sampler_name": "res_multistep", "scheduler": "simple",
                                                  "positive": ["27", 0], "negative": ["33", 0],
                                                  "latent_image": ["13", 0], "denoise": 1.0}},
        "29": {"class_type": "VAELoader", "inputs": {"vae_name": checkpoints.VAE}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["29", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "stock"}},
    }


def ours_z_image(size: int, steps: int) -> dict:
    """workflows/api/z_image_turbo_t2i.json on the INT8 ConvRot file at the asked size and steps."""
    graph = json.loads((ROOT / "workflows" / "api" / "z_image_turbo_t2i.json").read_text())
    for body in graph.values():
        inputs = body["inputs"]
        if body["class_type"] == "SwiftDiTZImageLoader":
            inputs["unet_name"] = checkpoints.DIT_INT8
        if "width" in inputs and "height" in inputs:
            inputs["width"] = inputs["height"] = size
        if "steps" in inputs:
            inputs["steps"] = steps
    return graph


def workflow(name: str) -> dict:
    return json.loads((ROOT / "workflows" / "api" / name).read_text())


def graphs(args) -> dict[str, tuple[str, dict]]:
    """label -> (family, API graph) of the run."""
    if args.smoke:  # the tiny set's Qwen3 is too small for the stock CLIPLoader, which builds a full Qwen3-4B
        return {"Z-Image ours (tiny, CPU)": ("z_image", swiftdit_graph(Settings(unet_name=checkpoints.DIT_INT8)))}
    out = {}
    if "z_image" in args.only:
        out["Z-Image stock BF16"] = ("z_image", stock_z_image(1024, 8))
        out["Z-Image ours INT8 ConvRot"] = ("z_image", ours_z_image(1024, 8))
    if "flux3_klein" in args.only:
        out["FLUX.3 Klein ours INT8"] = ("flux3_klein", workflow("flux3_klein_t2i.json"))
    if "krea2" in args.only:
        out["Krea 2 ours INT8"] = ("krea2", krea2_graph(0))
    return out


# family -> (the diffusers peer's label, our row's label)
PEERS = {"flux3_klein": ("FLUX.3 Klein diffusers BF16", "FLUX.3 Klein ours INT8"),
         "krea2": ("Krea 2 diffusers BF16", "Krea 2 ours INT8")}
PEER_SCRIPT = ROOT / "bench" / "graph_peers.py"


def run_peer(family: str, models: Path, smoke: bool, repeats: int = 1) -> list[dict]:
    """The three cases of the family's diffusers pipeline in a process of its own (bench/graph_peers.py), after an
    untimed one that writes the diffusers-layout copy of the files (once)."""
    label = PEERS[family][0] + (" (tiny, CPU)" if smoke else "")
    flag = ["--smoke"] if smoke else []
    repo = models / f"diffusers_{family}"
    subprocess.run([sys.executable, str(PEER_SCRIPT), "prepare", family, str(models), str(repo), *flag], check=True)
    rows = []
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, str(PEER_SCRIPT), "run", family, str(repo), "--t0", repr(t0),
                             "--prompts", *PROMPTS, "--repeats", str(repeats), *flag], stdout=subprocess.PIPE,
                            text=True)
    peaks = Peaks(proc.pid).__enter__()
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        peaks.__exit__()
        case = json.loads(line)
        rows.append({"graph": label, "case": case["case"], "seconds": case["seconds"], "card_gb": peaks.card_gb,
                     "host_gb": max(peaks.host_gb, case["host_gb"]), "alloc_gb": case["card_gb"]})
        print(f"| {label} | {case['case']} | {case['seconds']:.2f} | {peaks.card_gb:.1f} | "
              f"{rows[-1]['host_gb']:.1f} |", flush=True)
        peaks = Peaks(proc.pid).__enter__()
    peaks.__exit__()
    if proc.wait() != 0 or len(rows) != 1 + 2 * repeats:
        raise RuntimeError(f"{label}: exit {proc.returncode}, {len(rows)} runs")
    if not smoke:  # the next family's copy needs the room (about 34 GB for Krea 2's)
        shutil.rmtree(repo)
    return merged(rows)


def merged(rows: list[dict]) -> list[dict]:
    """A row a case: a repeated case's median run (by seconds), with every run's seconds under "runs"."""
    out = {}
    for r in rows:
        out.setdefault((r["graph"], r["case"]), []).append(r)
    merged_rows = []
    for runs in out.values():
        mid = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]
        merged_rows.append(mid | {"runs": [r["seconds"] for r in runs]} if len(runs) > 1 else mid)
    return merged_rows


def write_files(smoke: bool, families: list[str]) -> Path:
    """The model folders of the run (written once): the tiny Z-Image set on the CPU, else the real sizes of the
    families' files (the device's disk, 64 GB, holds every family's files or one diffusers copy beside some)."""
    if smoke:
        return checkpoints.ensure(layers=1).root
    import torch
    from safetensors.torch import save_file

    import real_size
    from swiftdit.quantize import quantize_file, streamed_safetensors
    shapes = json.loads(real_size.SHAPES.read_text())
    real_size.write(FILES, "cuda", {file: tensors for file, tensors in shapes.items()
                                    if set(real_size.FILES[file][1]) & set(families)})
    if "z_image" not in families:
        return FILES
    dit, te, vae = (FILES / "diffusion_models" / checkpoints.DIT_BF16,
                    FILES / "text_encoders" / checkpoints.TEXT_ENCODER, FILES / "vae" / checkpoints.VAE)
    if not dit.exists():
        save_file(checkpoints.dit_state_dict(30, cap_dim=2560, device="cuda"), str(dit))
    if not (FILES / "diffusion_models" / checkpoints.DIT_INT8).exists():
        quantize_file(dit, FILES / "diffusion_models" / checkpoints.DIT_INT8, device="cuda")
    if not te.exists():
        text = {k: shape for k, (shape, _) in shapes[QWEN3_4B_FROM].items() if k.startswith("model.")}
        with streamed_safetensors(te, {k: ("BF16", s) for k, s in text.items()}, {}) as put:
            for key, shape in text.items():
                put(key, real_size.random_tensor(key, shape, torch.device("cuda")).to(torch.bfloat16).cpu())
    if not vae.exists():
        save_file(checkpoints.vae_state_dict(), str(vae))
    return FILES


def run_cases(label: str, graph: dict, models: Path, smoke: bool, logs: Path | None,
              prebuild: bool = False, repeats: int = 1, restart: bool = True) -> list[dict]:
    """The cases of one graph: 1-3 on a server of its own, whose Triton cache starts empty (a new machine; cases 2
    and 3 `repeats` times each: graph_peers.timed_cases), then 4 on a second server that finds the first's (unless
    not restart); with prebuild, case 5 on a third server after `swiftdit prebuild` of the graph's model files into
    a new empty cache; a row a case (the servers' logs copied into logs)."""
    from graph_peers import timed_cases
    with tempfile.TemporaryDirectory(prefix="bench_graph_") as base:
        previous = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = str(Path(base) / "triton")  # the servers inherit it
        try:
            rows = merged(one_server(label, graph, models, smoke, logs, Path(base) / "first",
                                     timed_cases(list(PROMPTS), repeats)))
            if restart:
                rows += one_server(label, graph, models, smoke, logs, Path(base) / "restart",
                                   (("4 cold after a restart", PROMPTS[0], 4),))
            if prebuild:
                os.environ["TRITON_CACHE_DIR"] = str(Path(base) / "triton_prebuilt")
                rows.append(prebuilt(label, graph, models))
                rows += one_server(label, graph, models, smoke, logs, Path(base) / "prebuilt",
                                   (("5 cold after swiftdit prebuild", PROMPTS[0], 5),))
            return rows
        finally:
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = previous


MODEL_INPUTS = {"unet_name": "diffusion_models", "clip_name": "text_encoders"}  # a loader's file input: its folder


def prebuilt(label: str, graph: dict, models: Path) -> dict:
    """`swiftdit prebuild` of the graph's DiT and text encoder files (into TRITON_CACHE_DIR): its row, case 0."""
    files = sorted({str(models / MODEL_INPUTS[k] / v) for body in graph.values() for k, v in body["inputs"].items()
                    if k in MODEL_INPUTS})
    t0 = time.monotonic()
    # As the servers run (host/run_comfy.py): the test host's torchvision needs its ops shim to import.
    run = ("import sys; from host.run_comfy import TorchvisionOpsShim; sys.meta_path.insert(0, TorchvisionOpsShim()); "
           "from swiftdit.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", run, "prebuild", *files], cwd=ROOT, text=True, capture_output=True)
    seconds = time.monotonic() - t0
    said = (done.stdout + done.stderr).strip().replace("\n", "; ")
    print(f"| {label} | 0 swiftdit prebuild (exit {done.returncode}) | {seconds:.2f} | - | - | {said} |", flush=True)
    return {"graph": label, "case": "0 swiftdit prebuild", "seconds": seconds, "card_gb": 0.0, "host_gb": 0.0,
            "nodes": said, "ready": 0.0}


def one_server(label: str, graph: dict, models: Path, smoke: bool, logs: Path | None, base: Path,
               cases: tuple[tuple[str, str, int], ...]) -> list[dict]:
    """cases (name, prompt, seed) one after another on a new server in base; the first timed from the server's
    start."""
    rows = []
    server = ComfyHost(COMFYUI_TREE, base, sys.executable, cpu=smoke, cache_none=False)
    server.link_models({f: models / f for f in FOLDERS if (models / f).is_dir()})
    started = time.monotonic()
    try:
        server.start(timeout=300)
        ready = time.monotonic() - started  # the server's own start: the same work for stock and ours, and noisy
        for case, prompt, seed in cases:
            with Peaks(server.proc.pid) as peaks:
                entry, events, seconds = server.run(with_prompt(graph, prompt, seed, f"bench_{seed}"), TIMEOUT)
            status = entry["status"]["status_str"]
            if status != "success":
                raise RuntimeError(f"{label}, {case}: {status} {of_type(events, 'execution_error')[:1]}\n"
                                   f"{server.log_tail()}")
            if case == cases[0][0]:
                seconds = time.monotonic() - started
            nodes = ", ".join([f"server start {ready:.2f}"] * (case == cases[0][0]) + [
                f"{graph[n]['class_type']} {s:.3f}" for n, s in node_seconds(events).items() if s >= 0.005])
            rows.append({"graph": label, "case": case, "seconds": seconds, "card_gb": peaks.card_gb,
                         "host_gb": peaks.host_gb, "nodes": nodes, "ready": ready if case == cases[0][0] else 0.0})
            print(f"| {label} | {case} | {seconds:.2f} | {peaks.card_gb:.1f} | {peaks.host_gb:.1f} | {nodes} |",
                  flush=True)
    finally:
        server.stop()
        if logs is not None:
            shutil.copy(server.log_path, logs / f"server_{label.replace(' ', '_')}_{base.name}.log")
    for line in Path(server.log_path).read_text(errors="replace").splitlines():
        if BUILD_LINE.search(line):  # where the first prompt's kernels were built (or why not)
            print(f"  {label}, {base.name}: {line.strip()}", flush=True)
    return rows


def baseline_case(case: str) -> str:
    """The peer's case ours' case is measured against: stock's and diffusers' cold for case 5 (cold after the
    prebuild), else the same case."""
    return "1 cold" if case.startswith("5 ") else case


def ratios(rows: list[dict]) -> list[str]:
    """Stock's seconds over ours, case by case, for Z-Image (the goal: at least 2 for cases 2 and 3); diffusers'
    over ours for FLUX.3 Klein and Krea 2 (the goal: at least 2), with torch's peak allocation of each peer case."""
    by = {(r["graph"], r["case"]): r for r in rows}
    out = []
    for family, (peer, ours_label) in PEERS.items():
        for case in sorted({r["case"] for r in rows}):
            theirs = by.get((peer, baseline_case(case)))
            ours = by.get((ours_label, case))
            if theirs and ours:
                out.append(f"- {peer.split(' diffusers')[0]}, case {case}: diffusers {theirs['seconds']:.2f} s / ours "
                           f"{ours['seconds']:.2f} s = {theirs['seconds'] / ours['seconds']:.2f}x")
    out += [f"- {r['graph']}, case {r['case']}: torch max_memory_allocated {r['alloc_gb']:.2f} GB"
            for r in rows if "alloc_gb" in r]
    out += [f"- {r['graph']}, case {r['case']}, seconds a node (of 0.005 or more): {r['nodes']}"
            for r in rows if r.get("nodes")]
    out += [f"- {r['graph']}, case {r['case']}: the median of " + " / ".join(f"{t:.2f}" for t in r["runs"]) + " s"
            for r in rows if r.get("runs")]
    for case in sorted({r["case"] for r in rows}):
        stock = by.get(("Z-Image stock BF16", baseline_case(case)))
        ours = by.get(("Z-Image ours INT8 ConvRot", case))
        if stock and ours:
            out.append(f"- Z-Image, case {case}: stock {stock['seconds']:.2f} s / ours {ours['seconds']:.2f} s = "
                       f"{stock['seconds'] / ours['seconds']:.2f}x; peak host RSS {ours['host_gb']:.1f} against "
                       f"{stock['host_gb']:.1f} GB")
            if stock.get("ready") and ours.get("ready"):  # a cold case: what follows the servers' own start
                theirs, mine = stock["seconds"] - stock["ready"], ours["seconds"] - ours["ready"]
                out.append(f"  - after the server's start ({stock['ready']:.2f} s stock, {ours['ready']:.2f} s ours): "
                           f"stock {theirs:.2f} s / ours {mine:.2f} s = {theirs / mine:.2f}x")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=["z_image", "flux3_klein", "krea2"])
    p.add_argument("--smoke", action="store_true", help="the CPU, the tiny Z-Image set, our graph only")
    p.add_argument("--report", help="also write the table to this markdown file")
    p.add_argument("--side", choices=("ours", "peers", "both"), default="both",
                   help="the server graphs, the diffusers peers, or both (a device call carries ComfyUI's packages "
                        "or the peers' diffusers and transformers: not both within its 64 MiB)")
    p.add_argument("--prebuild", action="store_true",
                   help="ours also cold after `swiftdit prebuild` (case 5; the prebuild's seconds: case 0)")
    p.add_argument("--repeats", type=int, default=3,
                   help="cases 2 and 3 each this many times (new prompts; new seeds of the last), their medians")
    p.add_argument("--no-restart", action="store_true", help="without case 4 (cold after a restart)")
    p.add_argument("--stacks", help="each server's threads' Python stacks sampled every 10 ms into this folder "
                                    "(host/stack_sampler.py: stacks_<pid>.txt; bench/stacks_report.py reads them)")
    args = p.parse_args(argv)
    if args.stacks:
        Path(args.stacks).mkdir(parents=True, exist_ok=True)
        os.environ["SWIFTDIT_STACKS"] = str(Path(args.stacks).resolve())  # the servers' environment is ours
    if args.side != "peers" and not (COMFYUI_TREE / "main.py").is_file():
        p.error(f"no ComfyUI tree at {COMFYUI_TREE}: run tests/run.sh (or on the device: bench/device_carry.sh)")
    models = write_files(args.smoke, [f for f in args.only if args.side != "peers" or f in PEERS])
    logs = Path(args.report).parent if args.report else None
    header = ["| graph | case | seconds | peak card (GB) | peak host RSS (GB) |", "|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    rows = [] if args.side == "peers" else [
        row for label, (_, graph) in graphs(args).items()
        for row in run_cases(label, graph, models, args.smoke, logs, args.prebuild and "stock" not in label,
                             args.repeats, not args.no_restart)]
    if args.side != "ours":
        peer_models = models
        if args.smoke:
            import graph_peers
            graph_peers.torchvision_shim()
            peer_models = graph_peers.write_smoke_files(ROOT / ".cache" / "bench_graph_smoke")
        rows += [row for family in PEERS if family in args.only
                 for row in run_peer(family, peer_models, args.smoke, args.repeats)]
    summary = ratios(rows)
    print("\n".join(["", *summary]))
    if args.report:
        lines = header + [f"| {r['graph']} | {r['case']} | {r['seconds']:.2f} | {r['card_gb']:.1f} | "
                          f"{r['host_gb']:.1f} |" for r in rows]
        Path(args.report).write_text("\n".join([*lines, "", *summary]) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
