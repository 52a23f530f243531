"""Where a server's threads spend their time: every `interval` seconds, each thread's Python stack is recorded, and
the counts are written as collapsed stacks (`second;thread;outer;...;inner count` a line, the second since the
sampler started: flame graph tools' input once the first field is cut) every few seconds and at exit, so a server
that is killed still leaves them. A Python sampler runs only when it gets the
GIL: a thread that waits for it shows at the line where it waits, and a C call that holds it shows as fewer samples.
run_comfy.py starts one where SWIFTDIT_STACKS names a folder (a file a process: stacks_<pid>.txt, its command line
first)."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections import Counter


def frame_name(frame) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}"


class StackSampler:
    def __init__(self, path: str, interval: float = 0.01, depth: int = 40, flush_every: float = 2.0):
        self.path, self.interval, self.depth, self.flush_every = path, interval, depth, flush_every
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="stack-sampler", daemon=True)
        self.started = time.monotonic()

    def start(self) -> StackSampler:
        self.thread.start()
        atexit.register(self.write)
        return self

    def sample(self) -> None:
        names = {t.ident: t.name for t in threading.enumerate()}
        me = threading.get_ident()
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = []
            while frame is not None and len(stack) < self.depth:
                stack.append(frame_name(frame))
                frame = frame.f_back
            key = ";".join([str(int(time.monotonic() - self.started)), names.get(ident, str(ident)).replace(";", ","),
                            *reversed(stack)])
            with self.lock:
                self.counts[key] += 1

    def write(self) -> None:
        with self.lock:
            lines = [f"{stack} {n}\n" for stack, n in self.counts.most_common()]
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"# {' '.join(sys.argv)}\n")
            f.writelines(lines)
        os.replace(tmp, self.path)

    def run(self) -> None:
        flushed = time.monotonic()
        while True:
            time.sleep(self.interval)
            self.sample()
            if time.monotonic() - flushed > self.flush_every:
                self.write()
                flushed = time.monotonic()
