"""The /object_info of a ComfyUI tree with this pack, without starting a server (a child process imports them).

    python host/object_info.py COMFYUI_ROOT OUT.json [PACK]

What a node list needs from a server: every class of NODE_CLASS_MAPPINGS after ComfyUI's own extra nodes and
the pack are loaded, described as GET /object_info describes it (V3 classes by their own GET_NODE_INFO_V1).
Model-file combos list nothing: no models folder is set up. Used by tests that check reduced graphs without a
server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[1]


def _describe(nodes, name: str) -> dict:
    """One class as server.py's node_info gives it (v0.3.75), for classic and V3 classes alike."""
    cls = nodes.NODE_CLASS_MAPPINGS[name]
    if hasattr(cls, "GET_NODE_INFO_V1"):
        return cls.GET_NODE_INFO_V1()
    inputs = cls.INPUT_TYPES()
    return {"input": inputs, "input_order": {k: list(v) for k, v in inputs.items()},
            "output": list(cls.RETURN_TYPES),
            "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)),
            "name": name, "display_name": nodes.NODE_DISPLAY_NAME_MAPPINGS.get(name, name),
            "category": getattr(cls, "CATEGORY", "sd"), "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
            "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", "nodes")}


def _main(root: str, out: str, pack: str) -> None:
    # This file's folder (host/) must not be on the path: its server.py would shadow ComfyUI's, and the pack's
    # own `nodes` package would shadow ComfyUI's nodes.py.
    here = (PACK_ROOT, PACK_ROOT / "host")
    sys.path[:] = [root] + [p for p in sys.path[1:] if Path(p or ".").resolve() not in here]
    sys.path.append(str(PACK_ROOT))  # for the torchvision shim only (`host` is found after ComfyUI's modules)
    from host.run_comfy import TorchvisionOpsShim
    sys.meta_path.insert(0, TorchvisionOpsShim())
    os.chdir(root)
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    # main.py imports ComfyUI's `utils` package before nodes.py puts comfy/ first on the path (where comfy/utils.py
    # would then stand for it, and comfy_extras/nodes_images.py would not load)
    import utils.extra_config  # noqa: F401
    import nodes

    asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
    if not asyncio.run(nodes.load_custom_node(pack)):
        raise SystemExit(f"host/object_info.py: the pack at {pack} did not load")
    info = {}
    for name in nodes.NODE_CLASS_MAPPINGS:
        try:
            info[name] = _describe(nodes, name)
        except Exception as e:  # the server skips such a node too (and logs it)
            print(f"host/object_info.py: {name}: {e}", file=sys.stderr)
    with open(out, "w", encoding="utf-8") as f:  # not stdout: ComfyUI may print there while it loads
        json.dump(info, f, default=str)


def object_info(root: str | os.PathLike, pack: str | os.PathLike = PACK_ROOT, python: str = sys.executable,
                timeout: float = 300.0) -> dict:
    """The node list, computed in a child process (ComfyUI's `nodes` module must not meet this process's)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "object_info.json"
        done = subprocess.run([python, str(Path(__file__).resolve()), str(root), str(out), str(pack)],
                              capture_output=True, text=True, timeout=timeout, check=False, cwd=str(root))
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"host/object_info.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text(encoding="utf-8"))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: host/object_info.py COMFYUI_ROOT OUT.json [PACK]")
    _main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]),
          os.path.abspath(sys.argv[3] if len(sys.argv) == 4 else PACK_ROOT))
