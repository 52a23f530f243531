"""The INT8 GEMM's tiles (kernels/int8/linear.py, kernels/int8/qkv_rope_linear.py): the candidates an autotuner tries, the
ones fixed on Hopper from the H200 sweep, M's autotune bucket, and the launch grid.

Issue 4. A tile is a triton.Config of BLOCK_M x BLOCK_N x BLOCK_K with GROUP_M (row tiles that walk the column tiles
together), num_warps and num_stages, and three ways to run: TMA (Hopper's tensor memory accelerator loads the tiles),
PERSISTENT (one program an SM walks the tiles), SUBTILE (the epilogue takes the tile's columns in 2 or 4 parts).
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
except ImportError:  # torch without Triton: the references still import
    triton = None


def config(block_m, block_n, block_k, num_warps, num_stages, group_m=8, tma=False, persistent=False,
            subtile=0):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m,
                          "TMA": tma, "PERSISTENT": persistent, "SUBTILE": subtile},
                         num_warps=num_warps, num_stages=num_stages)


def candidate_tiles(gated: bool) -> list:
    """The tiles worth trying on this GPU: pointer loads sized for 100 KB (Ada), 164 KB (Ampere) and 228 KB (Hopper)
    of shared memory (HOPPER.md: M 64/128 per warpgroup, K-major int8 operands, 3-4 stages), plus TMA tiles, one
    program a tile or persistent, where there is TMA (Hopper and later). The H200 sweep kept those that won or came
    close on a Z-Image shape. Gated 128 x 256 tiles fit in shared memory only with the subtiled
    epilogue, and not persistent."""
    configs = [config(128, 256, 128, 8, 3), config(128, 128, 128, 8, 4), config(64, 128, 128, 4, 4),
               config(128, 256, 64, 8, 3), config(128, 128, 64, 4, 3)]
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        configs += [config(128, 128, 128, 8, 4, tma=True), config(128, 128, 128, 8, 4, tma=True, persistent=True)]
        configs += [config(128, 256, 128, 8, 4, tma=True, subtile=2)] if gated else [
            config(128, 256, 128, 8, 4, tma=True), config(128, 256, 128, 8, 4, tma=True, persistent=True),
            config(256, 128, 128, 8, 4, tma=True, persistent=True)]
    return configs


# The INT8 GEMMs' output forms (their kernels' FORM; kernels/int8/linear.py, kernels/int8/linear_hopper.py): bf16 rows,
# the gated residual update, SwiGLU of column pairs as bf16 rows.
BF16, GATED, SWIGLU = 0, 1, 2

# Hopper (sm_90), by output form (BF16, GATED, SWIGLU): the sweep's winners, so nothing is timed on
# a shape's first run and one compiled kernel serves every shape. bf16 and gated: within 2% of the best candidate on
# each of Z-Image's four shapes, the best on the other seven. SwiGLU (its epilogue writes half the columns, so
# the persistent bf16 tile fits): about 9% faster than the subtiled tile at w1+w3. "qkv_rope"
# (kernels/int8/qkv_rope_linear.py, two whole heads a tile): one program a tile, about 6% faster than
# persistent at Z-Image's QKV. Tiles two programs an SM run (128 x 128, 4 warps, 3 stages) are not used:
# barely faster at out, 2-6% slower at the other shapes, and a Z-Image step slower with them for bf16 rows,
# SwiGLU and QKV.
HOPPER_TILES = {0: config(128, 256, 128, 8, 4, tma=True, persistent=True),
                1: config(128, 256, 128, 8, 4, tma=True, subtile=2),
                2: config(128, 256, 128, 8, 4, tma=True, persistent=True),
                "qkv_rope": config(128, 256, 128, 8, 4, tma=True)} if triton is not None else {}


@functools.cache
def _is_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def fixed_tiles(form: int | str, device: torch.device, k: int) -> dict | None:
    """The launch's tiles where they are fixed (Hopper, K a multiple of 16 as TMA needs), else None: autotuned."""
    if not _is_hopper(device) or k % 16:
        return None
    return launch_of(HOPPER_TILES[form])


def launch_of(tile) -> dict:
    """A tile (triton.Config) as int8_linear's and qkv_rope_linear's `tiles` argument."""
    return {**tile.kwargs, "num_warps": tile.num_warps, "num_stages": tile.num_stages}


def tune_bucket(m: int) -> int:
    """M's autotune bucket: the next power of two (at least 64); tiles that win at 4608 rows win near it."""
    return max(64, 1 << (m - 1).bit_length())


def tma_where_it_can(configs, named_args, **kwargs):
    """TMA descriptors need 16-byte row strides: K % 16 (ConvRot's groups are 16 to 256 wide, so always)."""
    return [c for c in configs if not c.kwargs["TMA"] or named_args["K"] % 16 == 0]


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _scratch_buffer(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _descriptor_scratch() -> None:
    """Device-side TMA descriptors live in a global scratch buffer Triton asks an allocator for (128 bytes a
    descriptor); torch's allocator serves it, so it is stream- and graph-safe. Triton keeps the allocator in a
    ContextVar, which a thread does not inherit: set where this thread's context has Triton's null one (a capture's
    stand-in, dit_core/gpu/step_graph.addresses_for_triton, stays)."""
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch_buffer)


def launch_grid(m: int, n: int, device: torch.device, tiles_run: int | None = None):
    """The grid of an [m, n] output for a config (one program a tile, or one an SM for PERSISTENT) running its first
    tiles_run tiles (all when None; kernels/int8/split_tail.py runs the rest), with the TMA descriptors' scratch allocator
    in place (kernels/int8/qkv_rope_linear.py launches the same way)."""
    _descriptor_scratch()
    sms = sm_count(device)

    def grid(meta):
        tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
        tiles = tiles if tiles_run is None else min(tiles, tiles_run)
        return (min(sms, tiles) if meta["PERSISTENT"] else tiles,)
    return grid
