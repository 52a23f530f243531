"""Worker processes for sequence parallelism: start N ranks, run one function on each, hand back rank 0's result.

Each rank is a spawned process (torch.multiprocessing; CUDA and gloo threads do not survive a fork) that joins a
process group on a free local port, with a timeout on every collective, runs fn(Ranks, *args) and leaves the group.
A rank that raises stops the others: the parent sees its process end, ends the rest, and raises RankFailed naming
the rank that failed first and its error. Rank 0's result comes back through a file (a pipe that fills would stall
the rank that writes it while the parent waits for it to exit).
"""
from __future__ import annotations

import json
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .shards import Ranks

RESULT = "rank0.pt"
POLL_S = 0.05


class RankFailed(RuntimeError):
    """A rank raised (or died): rank, its error's one line, and the traceback it printed."""

    def __init__(self, rank: int, world: int, error: str, trace: str = ""):
        super().__init__(f"sequence parallel: rank {rank} of {world} failed: {error}")
        self.rank, self.error, self.trace = rank, error, trace


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, backend: str, timeout_s: float, threads: int, fn: Callable,
               args: tuple, folder: str) -> None:
    """One rank's process: join, run, leave; on an error, record it (time, one line, traceback) and re-raise."""
    if threads:
        torch.set_num_threads(threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        result = fn(Ranks.current(), *args)
        if rank == 0:
            torch.save(result, Path(folder) / RESULT)
    except BaseException as e:
        record = {"time": time.time(), "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(record))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _first_failure(folder: Path, world: int, fallback: tuple[int, str]) -> RankFailed:
    """The rank whose error came first (the others' are usually their collectives losing it), else fallback."""
    records = []
    for r in range(world):
        f = folder / f"rank{r}.json"
        if f.exists():
            records.append((json.loads(f.read_text()), r))
    if not records:
        return RankFailed(fallback[0], world, fallback[1])
    record, rank = min(records, key=lambda x: x[0]["time"])
    return RankFailed(rank, world, record["error"], record["trace"])


def _stop(processes) -> None:
    """End every rank still running (TERM, then KILL after a grace), and reap them all."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def run_ranks(world: int, fn: Callable, args: tuple = (), timeout_s: float = 120.0, backend: str = "gloo",
              threads: int = 1):
    """fn(ranks, *args) on `world` spawned ranks (fn and args picklable: fn a module-level function); rank 0's
    result. timeout_s bounds each collective and the whole run; threads: torch's threads a rank (0: torch's
    default). Raises RankFailed naming the first rank that failed, TimeoutError when the run overstays."""
    if world < 1:
        raise ValueError(f"sequence parallel: a world of {world} ranks; give 1 or more")
    with tempfile.TemporaryDirectory(prefix="swiftdit_ranks_") as tmp:
        folder = Path(tmp)
        context = mp.start_processes(_rank_main, args=(world, free_port(), backend, timeout_s, threads, fn, args,
                                                       tmp), nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=POLL_S):
                if time.monotonic() > deadline:
                    alive = [r for r, p in enumerate(context.processes) if p.is_alive()]
                    raise TimeoutError(f"sequence parallel: ranks {alive} of {world} still running after "
                                       f"{timeout_s:g} s; stopped them")
        except mp.ProcessRaisedException as e:
            raise _first_failure(folder, world, (e.error_index, str(e).strip().splitlines()[-1])) from None
        except mp.ProcessExitedException as e:
            raise _first_failure(folder, world, (e.error_index, f"exited with code {e.exit_code}")) from None
        finally:
            _stop(context.processes)
        return torch.load(folder / RESULT, weights_only=False)
