"""Triton kernels built in worker processes into Triton's on-disk cache, from which the calling process then loads
them (dit_core/gpu/builds.py's process form: a compiler front end that holds the GIL does not overlap on threads).
Each worker registers the kernels' top package bare from its folder (its __init__ may import ComfyUI), imports each
kernel's module and preloads the kernel's specialization (Triton's JITFunction.preload)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

log = logging.getLogger(__name__)

# A worker: the kernels' top package registered bare from its folder (its __init__ may import ComfyUI), each job's
# module imported, its kernel built into Triton's on-disk cache. A job that fails is left to this process.
_WORKER = """
import importlib, json, sys, types
jobs = json.load(sys.stdin)
for top, folder in {(j["module"].split(".")[0], j["folder"]) for j in jobs}:
    sys.modules.setdefault(top, types.ModuleType(top)).__path__ = [folder]
for job in jobs:
    try:
        kernel = importlib.import_module(job["module"])
        for part in job["name"].split("."):
            kernel = getattr(kernel, part)
        kernel.preload(job["specialization"])
    except Exception as e:
        print(f"{job['module']}.{job['name']}: {type(e).__name__}: {e}", file=sys.stderr)
"""


def build_in_processes(held: list[tuple], workers: int) -> None:
    """The held kernels built into Triton's on-disk cache by `workers` processes, each a share of them."""
    jobs = []
    for jit_function, specialization in held:
        module = sys.modules[jit_function.fn.__module__]
        top = sys.modules[module.__name__.split(".")[0]]
        jobs.append({"module": module.__name__, "name": jit_function.fn.__qualname__, "specialization": specialization,
                     "folder": list(top.__path__)[0] if hasattr(top, "__path__") else os.path.dirname(top.__file__)})
    started = [subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(workers)]
    for i, proc in enumerate(started):
        proc.stdin.write(json.dumps(jobs[i::workers]))
        proc.stdin.close()
    for proc in started:
        said = proc.stderr.read()
        if proc.wait() != 0 or said:
            log.info("SwiftDiT: a build worker left kernels to build here (exit %d): %s", proc.returncode,
                     said.strip()[-500:])
