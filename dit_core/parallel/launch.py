"""Worker processes for sequence parallelism: N ranks kept alive between calls (RankPool: a model loaded once stays
loaded), or started for one call and torn down after it (run_ranks).

Each rank is a spawned process (torch.multiprocessing; CUDA and gloo threads do not survive a fork) that joins a
process group on a free local port, with a timeout on every collective, then runs what the parent sends it,
fn(ranks, state, *args) with its own `state` dict kept between calls, and answers; rank 0's answer carries the result.
A rank that raises reports its error and leaves: the parent ends every rank and raises RankFailed naming the rank
that failed first and its error; a rank that dies without a word (killed) is found by its exit code. A failed or
overdue pool is closed: a process group that lost a rank cannot go on.
"""
from __future__ import annotations

import functools
import os
import queue
import socket
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Self

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .shards import Ranks

# A rank's first code (run by exec: nothing of ours can be unpickled before it): the engine's top package registered
# bare from its folder, so that what the parent pickles by module name imports here whatever the package is named
# (ComfyUI names a custom node's package by its folder's path) and without its __init__ (which would import
# ComfyUI); then the rank's loop.
_RANK_MAIN = """
import importlib, sys, types
sys.modules[top] = types.ModuleType(top)
sys.modules[top].__path__ = [folder]
importlib.import_module(module)._serve(*args)
"""

POLL_S = 0.05
PARENT_CHECK_S = 1.0
STOP_GRACE_S = 5.0


class RankFailed(RuntimeError):
    """A rank raised (or died): rank, its error's one line, and its traceback."""

    def __init__(self, rank: int, world: int, error: str, trace: str = ""):
        super().__init__(f"sequence parallel: rank {rank} of {world} failed: {error}")
        self.rank, self.error, self.trace = rank, error, trace


class Cancelled(RuntimeError):
    """A call stopped at a check: every rank at the same one (the pool stays up)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moved(value, device: torch.device | str | None, copy: bool = False):
    """value with each tensor (in tuples, lists, dicts) on device (None: as it is); copy: copied even where it is
    there already."""
    if device is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=copy)
    if isinstance(value, (tuple, list)):
        return type(value)(moved(v, device, copy) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device, copy) for k, v in value.items()}
    return value


def on_host(result):
    """result with each tensor copied to the host: a CUDA tensor cannot outlive its rank, and a copy is out of reach
    of the rank's later work."""
    return moved(result, "cpu", copy=True)


def _agreed_check(ranks: Ranks, stop, outbox, device: str):
    """A step's check() (after each block): the ranks agree whether to stop (the flag's max over them), so all stop
    at the same block, raising Cancelled; else rank 0 reports the blocks done so far ("progress", 0, n)."""
    done = 0

    def check() -> None:
        nonlocal done
        flag = torch.tensor([float(stop.is_set())], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ranks.group)
        if flag.item():
            raise Cancelled(f"sequence parallel: rank {ranks.rank} stopped after {done} blocks, as asked")
        done += 1
        if ranks.rank == 0:
            outbox.put(("progress", 0, done))
    return check


def _next_job(inbox, parent: int):
    """The next (fn, args) from inbox, or None: asked to leave, or the parent is gone (killed: no rank outlives it)."""
    while True:
        try:
            return inbox.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _serve(rank: int, world: int, port: int, backend: str, timeout_s: float, threads: int, inbox, outbox, stop,
           parent: int) -> None:
    """One rank's process: join the group, then run each (fn, args) from inbox until None, with state["check"] a
    fresh _agreed_check, answering on outbox ("done", rank, result: rank 0's, on_host), ("cancelled", rank, None),
    or ("error", rank, time, one line, traceback), after which it leaves."""
    if threads:
        torch.set_num_threads(threads)
    code = 1
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        ranks, state = Ranks.current(), {}
        while (job := _next_job(inbox, parent)) is not None:
            fn, args = job
            state["check"] = _agreed_check(ranks, stop, outbox, "cuda" if backend == "nccl" else "cpu")
            try:
                result = fn(ranks, state, *args)
            except Cancelled:
                outbox.put(("cancelled", rank, None))
                continue
            outbox.put(("done", rank, on_host(result) if rank == 0 else None))
        code = 0
    except BaseException as e:  # noqa: BLE001 - a rank reports whatever ends it, then leaves
        outbox.put(("error", rank, time.time(), f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # answers flushed, then out without the interpreter's teardown (1.6 s for 4 ranks on 2 cores, for nothing)
        outbox.close()
        outbox.join_thread()
        os._exit(code)


def _shutdown(processes: list, inboxes: list, graceful: bool = True) -> None:
    """Ask every rank to leave (graceful; else not: after a failure the others may sit in a collective), then end
    those that do not (TERM, then KILL after a grace), and reap them all."""
    for p, inbox in zip(processes, inboxes):
        inbox.cancel_join_thread()  # this process's exit must not wait on a rank that no longer reads
        if graceful and p.is_alive():
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + (STOP_GRACE_S if graceful else 0.0)
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


@contextmanager
def _main_module_hidden():
    """spawn's children import the parent's __main__ first (as __mp_main__): under ComfyUI that is its main.py, whose
    top level parses arguments and runs every custom node's prestartup script. A rank needs none of it."""
    main = sys.modules["__main__"]
    spec, has_file = getattr(main, "__spec__", None), hasattr(main, "__file__")
    file = getattr(main, "__file__", None)
    main.__spec__ = None
    if has_file:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if has_file:
            main.__file__ = file


def _rank_process(ctx, rank: int, args: tuple):
    """rank's process (not started): _RANK_MAIN, then _serve(*args)."""
    top = __name__.split(".")[0]
    folder = list(sys.modules[top].__path__)[0]
    return ctx.Process(target=exec, args=(_RANK_MAIN, {"top": top, "folder": folder, "module": __name__,
                                                       "args": args}),
                       daemon=True, name=f"swiftdit_rank{rank}")


class RankPool:
    """`world` ranks (spawned processes in one process group) that stay up between calls. pool(fn, *args) runs
    fn(ranks, state, *args) on every rank (fn and args picklable: fn a module-level function; args shared between
    the ranks, read-only) and returns rank 0's result; state is the rank's own dict, kept between calls (a loaded
    model). timeout_s bounds each collective and each call; threads: torch's threads a rank (0: torch's default).
    close() (or leaving a with block, or the pool being collected) stops the ranks."""

    def __init__(self, world: int, timeout_s: float = 120.0, backend: str = "gloo", threads: int = 1):
        if world < 1:
            raise ValueError(f"sequence parallel: a world of {world} ranks; give 1 or more")
        ctx = mp.get_context("spawn")
        self.world, self.timeout_s = world, timeout_s
        self._inboxes = [ctx.Queue() for _ in range(world)]
        self._outbox, self._stop_asked = ctx.Queue(), ctx.Event()
        port = free_port()
        self._processes = [_rank_process(ctx, r, (r, world, port, backend, timeout_s, threads, self._inboxes[r],
                                                  self._outbox, self._stop_asked, os.getpid()))
                           for r in range(world)]
        with _main_module_hidden():
            for p in self._processes:
                p.start()
        self._closer = weakref.finalize(self, _shutdown, self._processes, self._inboxes)

    @property
    def open(self) -> bool:
        return self._closer.alive

    @property
    def alive(self) -> list[int]:
        """The ranks whose processes are running."""
        return [r for r, p in enumerate(self._processes) if p.is_alive()]

    def close(self) -> None:
        self._stop(graceful=True)

    def _stop(self, graceful: bool) -> None:
        if self._closer.detach() is not None:
            _shutdown(self._processes, self._inboxes, graceful)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, fn: Callable, *args, timeout_s: float | None = None, check: Callable | None = None,
                 progress: Callable[[int], None] | None = None):
        """fn(ranks, state, *args) on every rank: rank 0's result. timeout_s: this call's bound (None: the pool's).
        check(), called here while the ranks work, may raise to stop them (ComfyUI's interrupt): the ranks stop at
        their next state["check"]() (a family's step calls it after each block) and the pool, still up, raises
        what check raised. progress(n): blocks done so far, as rank 0 reports them."""
        if not self.open:
            raise RuntimeError("sequence parallel: this pool of ranks is closed (a rank failed, a call overstayed, "
                               "or it was closed); start a new one")
        self._stop_asked.clear()
        try:
            for inbox in self._inboxes:
                inbox.put((fn, args))
            result, interrupt = self._collect(self.timeout_s if timeout_s is None else timeout_s, check, progress)
        except BaseException:
            self._stop(graceful=False)
            raise
        if interrupt is not None:
            raise interrupt
        return result

    def _collect(self, timeout_s: float, check: Callable | None, progress: Callable[[int], None] | None):
        """Every rank's answer to one call: (rank 0's result, what check raised or None), or the first failure
        raised."""
        waiting, result, interrupt = set(range(self.world)), None, None
        deadline = time.monotonic() + timeout_s
        while waiting:
            if check is not None and interrupt is None:
                try:
                    check()
                except BaseException as e:  # noqa: BLE001 - raised again once every rank has stopped
                    interrupt = e
                    self._stop_asked.set()
            try:
                message = self._outbox.get(timeout=POLL_S)
            except queue.Empty:
                for r in sorted(waiting):
                    code = self._processes[r].exitcode
                    if code is not None:
                        raise self._first_error([], RankFailed(r, self.world, f"its process exited with code {code} "
                                                               "without a word (killed?)"))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sequence parallel: ranks {sorted(waiting)} of {self.world} had not answered "
                                       f"after {timeout_s:g} s; stopped them")
                continue
            kind, rank, value = message[:3]
            if kind == "error":
                raise self._first_error([message], None)
            if kind == "progress":
                if progress is not None:
                    progress(value)
                continue
            waiting.discard(rank)
            if kind == "done" and rank == 0:
                result = value
            elif kind == "cancelled" and interrupt is None:
                interrupt = Cancelled("sequence parallel: the ranks stopped at a check, as asked")
        return result, interrupt

    def _first_error(self, errors: list, fallback: RankFailed | None) -> RankFailed:
        """The error that came first among those reported by now (the others are usually their collectives losing
        that rank), else fallback."""
        time.sleep(POLL_S)  # let ranks whose error is on its way report it
        while True:
            try:
                message = self._outbox.get_nowait()
            except queue.Empty:
                break
            if message[0] == "error":
                errors.append(message)
        if not errors:
            return fallback
        _, rank, _, error, trace = min(errors, key=lambda m: m[2])
        return RankFailed(rank, self.world, error, trace)


def _stateless(fn: Callable, ranks: Ranks, state: dict, *args):
    return fn(ranks, *args)


def run_ranks(world: int, fn: Callable, args: tuple = (), timeout_s: float = 120.0, backend: str = "gloo",
              threads: int = 1):
    """fn(ranks, *args) once on `world` fresh ranks, torn down after: rank 0's result. Raises as RankPool's calls
    (RankFailed naming the first rank that failed; TimeoutError)."""
    with RankPool(world, timeout_s, backend, threads) as pool:
        return pool(functools.partial(_stateless, fn), *args)
