"""The GPU kernels of one call, grouped by name, most time first: where a benchmark's milliseconds go."""
from __future__ import annotations

import torch


def print_profile(call, rows: int = 30, host: bool = False) -> None:
    """The table, then the kernels' summed time against the call's wall-clock time: a GPU idle much of the call
    waits on the host (launches, Python, copies that synchronize). host: then the Python functions of another
    call by their own time (cProfile), where that host time goes."""
    import time

    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    averages = prof.key_averages()
    print(averages.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=70), flush=True)
    busy_ms = sum(event.self_device_time_total for event in averages) / 1e3
    print(f"kernels {busy_ms:.1f} ms of the call's {wall_ms:.1f} ms wall-clock (profiled): the GPU busy "
          f"{100 * busy_ms / wall_ms:.0f}% of it", flush=True)
    if host:
        print_host_profile(call, rows)


def print_host_profile(call, rows: int = 30) -> None:
    """The Python functions of one call (the GPU synchronized after it) by their own time, then by cumulative."""
    import cProfile
    import io
    import pstats
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    torch.cuda.synchronize()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        print(f"\n## host functions by {order}\n" + text.getvalue().split("\n\n", 1)[-1], flush=True)
