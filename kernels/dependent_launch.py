"""Programmatic dependent launch (Hopper and later): a kernel's programs are placed on the SMs while the kernel before
it finishes, and wait for it (griddepcontrol.wait) before they touch memory.

Issue 4. A Z-Image step at 1024^2 is about 500 launches back to back (15 a block); at each boundary the card idles
while the last programs drain and the next kernel's start (replaying the step's CUDA graph takes about 2 ms more
than its kernels' sum). A kernel launched with PDL runs `wait_then_release` first: it waits until the kernel before
has completed and its writes are visible (no load or store comes before), then lets the kernel after it launch
(griddepcontrol.launch_dependents), whose programs take the SMs as this one's finish and wait in turn. The order of
every read and write is the stream's: outputs are bit for bit those without PDL.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # torch without Triton (or a Triton without these): the references still import
    triton = tl = None
triton_jit = triton.jit if triton is not None else (lambda fn: fn)

ENABLED = True  # the benches time the step with and without (bench/step_variants.py)


@functools.cache
def _hopper_or_later(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def launch_flags(device: torch.device) -> dict:
    """The kernel's PDL flag and Triton's launch option, on for a CUDA device of compute capability 9.0 or later."""
    on = ENABLED and device.type == "cuda" and _hopper_or_later(device)
    return {"PDL": on, "launch_pdl": on}


@triton_jit
def wait_then_release(PDL: tl.constexpr):
    """A PDL kernel's first statement: wait for the kernel before, then let the kernel after launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
