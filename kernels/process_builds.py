"""Triton kernels built in worker processes into Triton's on-disk cache, from which the calling process then loads
them (dit_core/gpu/builds.py's process form: a compiler front end that holds the GIL does not overlap on threads,
and slows the load it runs beside).

A fresh worker spends seconds importing torch, Triton and the kernels' modules (fresh workers built a first Z-Image
step's kernels in 14.98 s against 5.98 on threads, H100), so BuildWorkers starts them ahead, when the server starts,
and keeps them warm until they wait `idle_s` for a job. Each worker registers the kernels' top package bare from
its folder (its __init__ may import ComfyUI), imports the kernels' modules, then builds one job (a kernel's
module, name and specialization: Triton's JITFunction.preload) a line of its stdin, answering one line each."""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_WORKER = """
import importlib, json, select, sys, types
setup = json.loads(sys.argv[1])
for top, folder in setup["tops"].items():
    sys.modules.setdefault(top, types.ModuleType(top)).__path__ = [folder]
for name in setup["modules"]:
    try:
        importlib.import_module(name)
    except Exception:
        pass  # a job that needs it says why
while select.select([sys.stdin], [], [], setup["idle_s"])[0]:
    line = sys.stdin.readline()
    if not line:
        break
    job, said = json.loads(line), ""
    try:
        kernel = importlib.import_module(job["module"])
        for part in job["name"].split("."):
            kernel = getattr(kernel, part)
        kernel.preload(job["specialization"])
    except Exception as e:
        said = f"{job['module']}.{job['name']}: {type(e).__name__}: {e}"
    print(json.dumps(said), flush=True)
"""


def _top_folder(module_name: str) -> tuple[str, str]:
    top = sys.modules[module_name.split(".")[0]]
    return top.__name__, list(top.__path__)[0] if hasattr(top, "__path__") else os.path.dirname(top.__file__)


def _job(jit_function, specialization: str) -> dict:
    return {"module": jit_function.fn.__module__, "name": jit_function.fn.__qualname__,
            "specialization": specialization}


class _Worker:
    def __init__(self, setup: str):
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, setup], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, job: dict) -> str | None:
        """job built: "" when built, its error, or None when the worker has gone (idle, or killed)."""
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):
            return None
        return json.loads(line) if line else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # its read ends: it exits
            self.proc.wait()


@dataclass
class BuildWorkers:
    """Worker processes that build held kernels (JITFunction, specialization) into Triton's on-disk cache: `count`
    of them, started by start() (at once, not waited for) or by the first build; each exits after `idle_s` without
    a job, and a build that finds one gone starts another (cold). Builds from several threads share them."""
    count: int
    modules: tuple[str, ...]
    idle_s: float = 300.0
    _free: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _started: bool = False

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                for _ in range(self.count):
                    self._free.put(self._new())

    def _new(self) -> _Worker:
        return _Worker(json.dumps({"tops": dict(_top_folder(m) for m in self.modules), "modules": self.modules,
                                   "idle_s": self.idle_s}))

    def build(self, held: list[tuple]) -> list[str]:
        """held's kernels built, each by a free worker; what any said it could not build (those build in this
        process on first launch, where the error surfaces)."""
        self.start()

        def one(job: dict) -> str:
            worker = self._free.get()
            try:
                said = worker.ask(job)
                if said is None:  # gone since its last job: a new one, once
                    worker = self._new()
                    said = worker.ask(job)
                return said if said is not None else f"{job['module']}.{job['name']}: its worker exited"
            finally:
                self._free.put(worker)
        with ThreadPoolExecutor(self.count, thread_name_prefix="swiftdit-build-worker") as pool:
            said = [s for s in pool.map(one, [_job(*h) for h in held]) if s]
        if said:
            log.info("SwiftDiT: build workers left %d kernels to build here: %s", len(said), "; ".join(said)[-500:])
        return said

    def stop(self) -> None:
        """Every worker stopped (each exits when its stdin closes)."""
        with self._lock:
            while True:
                try:
                    self._free.get_nowait().stop()
                except queue.Empty:
                    break
            self._started = False


def build_in_processes(held: list[tuple], workers: int) -> None:
    """The held kernels built into Triton's on-disk cache by `workers` fresh processes (bench_first_step's cold
    form; a server keeps warm ones: BuildWorkers)."""
    pool = BuildWorkers(workers, tuple(sorted({j.fn.__module__ for j, _ in held})), idle_s=60.0)
    try:
        pool.build(held)
    finally:
        pool.stop()

