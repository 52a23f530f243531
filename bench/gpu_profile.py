"""The GPU kernels of one call, grouped by name, most time first: where a benchmark's milliseconds go."""
from __future__ import annotations

import torch


def print_profile(call, rows: int = 30) -> None:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=70),
          flush=True)
