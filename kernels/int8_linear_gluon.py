"""INT8 x INT8 -> INT32 products with the matrix cores kept busy across K steps: kernels/int8_linear.py's three
output forms (bf16 rows, SwiGLU, the gated residual) written in Gluon (Triton's explicit-layout language), to be timed
against it.

The math is int8_linear's (its reference() is this kernel's): acc = q wᵀ exact in int32, y = float(acc) * (s_x[m] *
s_w[n]) + bias[n] rounded once (no fused multiply-add), out = bf16(y); SwiGLU: bf16(silu(g) u) of the bf16 pairs;
gated: residual + gate[row_map[m]] * y in f32.
Why a second kernel: Triton's own pipeliner keeps no integer wgmma in flight across K steps. At the H200 tile it
emits `wgmma.wait_group 0` after every K step for int8 (the MMA pipeline drains each step), while the same loop in
fp8 or bf16 waits for 1 (docs/benchmarks.md). Here the loop is written out: a ring of STAGES shared buffers filled
by TMA, each K step's MMA issued asynchronously, then a wait that leaves one group in flight, and the slot the
previous MMA read refilled only after that wait; a persistent program runs its tiles' K steps as one run. Integer
wgmma takes n <= 224, so a 256-wide tile issues two n = 128 instructions a k32 step, as Triton's does.
Not used by the block yet (no CPU interpreter runs Gluon): tests/kernels/test_int8_linear_gluon.py checks it on the
GPU and its build in CI; bench_int8_linear.py times it.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # TMA's global-to-shared copy: async_load from Triton 3.7 (the H200's 3.6 names it async_copy_global_to_shared).
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
except ImportError:  # a Triton without Gluon (before 3.5): int8_linear.py is the kernel then
    gluon = None

# STAGES (when not given): 4 for bf16 rows and SwiGLU (a 4 x 48 KB ring and 32 KB of output: 224 of the H200's 227
# KB), 3 for the gated form (its f32 half tile is 64 KB).
TILE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "PERSISTENT": True}


def available() -> bool:
    return gluon is not None


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


if gluon is not None:
    @gluon.jit
    def _tile_offsets(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Row and column offsets of a tile, in int8_linear's _tile_of order: GROUP_M row tiles walk the column
        tiles together (their weight columns stay in L2)."""
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        return (first_m + (tile % per_group) % group_m) * BLOCK_M, ((tile % per_group) // group_m) * BLOCK_N

    @gluon.jit
    def _load_step(a_desc, b_desc, a_ring, b_ring, ready, p, last, first, stride, steps, tiles_m, tiles_n,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        """TMA of K step p of this program's run (its tile first + (p // steps) stride, step p % steps) into ring
        slot p % STAGES, signalling ready[slot]; nothing past step `last` (TMA zero-fills past K and the edges)."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        off_m, off_n = _tile_offsets(first + (p // steps) * stride, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
        k = (p % steps) * BLOCK_K
        slot = p % STAGES
        mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=p <= last)
        tma_load(a_desc, [off_m, k], ready.index(slot), a_ring.index(slot), pred=p <= last)
        tma_load(b_desc, [off_n, k], ready.index(slot), b_ring.index(slot), pred=p <= last)

    @gluon.constexpr_function
    def ACC_LAYOUT(num_warps):
        """The accumulator's: warps along the rows, two n = 128 integer wgmma a 256-wide tile per k32 step."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 128, 32])

    @gluon.jit
    def _start(a_desc, b_desc, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        """This program's run (tiles first, first + stride, ..., their K steps in one ring: one tile when the grid
        is a program a tile), the ring allocated and its first STAGES - 1 steps in flight: (a_ring, b_ring, ready,
        tiles_m, tiles_n, first, stride, steps, run)."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        tiles_m = gl.cdiv(M, BLOCK_M)
        tiles_n = gl.cdiv(N, BLOCK_N)
        first = gl.program_id(0)
        stride = gl.num_programs(0)
        steps = gl.cdiv(K, BLOCK_K)
        run = gl.cdiv(tiles_m * tiles_n - first, stride) * steps  # K steps of all this program's tiles
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        for s in gl.static_range(STAGES - 1):
            _load_step(a_desc, b_desc, a_ring, b_ring, ready, s, run - 1, first, stride, steps, tiles_m, tiles_n,
                       GROUP_M, STAGES)
        return a_ring, b_ring, ready, tiles_m, tiles_n, first, stride, steps, run

    @gluon.jit
    def _tile_products(a_desc, b_desc, a_ring, b_ring, ready, acc, t, steps, run, first, stride, tiles_m, tiles_n,
                       GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        """acc = the products of the program's t-th tile over K (int32, exact), its MMAs done."""
        for i in range(steps):
            c = t * steps + i
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), phase=(c // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc, use_acc=i > 0,
                                is_async=True)
            # One group stays in flight: step c - 1's MMA is done, so the slot it read takes step c + STAGES - 1
            # (the next tile's first steps while this tile ends).
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_ring.index(slot), b_ring.index(slot)))
            _load_step(a_desc, b_desc, a_ring, b_ring, ready, c + STAGES - 1, run - 1, first, stride, steps, tiles_m,
                       tiles_n, GROUP_M, STAGES)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    @gluon.jit
    def _int8_linear_gluon_kernel(a_desc, b_desc, out_desc, sx_ptr, sw_ptr, bias_ptr, gate_ptr, map_ptr, M, N, K,
                                  HAS_BIAS: gl.constexpr, FORM: gl.constexpr, ONE_GATE_ROW: gl.constexpr,
                                  GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        # A program's tiles are one run of K steps (_start): the ring and its phases carry from tile to tile, so the
        # next tile's first loads are in flight during this tile's last MMAs and epilogue.
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        a_ring, b_ring, ready, tiles_m, tiles_n, first, stride, steps, run = _start(a_desc, b_desc, M, N, K, GROUP_M,
                                                                                   STAGES)
        # The output's buffer, a column half of the tile: bf16 rows, SwiGLU's output, or the f32 residual (gated).
        out_tile = gl.allocate_shared_memory(out_desc.dtype, out_desc.block_type.shape, out_desc.layout)
        residual_in = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(residual_in, count=1)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=ACC_LAYOUT(num_warps))
        for t in range(run // steps):
            acc = _tile_products(a_desc, b_desc, a_ring, b_ring, ready, acc, t, steps, run, first, stride, tiles_m,
                                 tiles_n, GROUP_M, STAGES)
            off_m, off_n = _tile_offsets(first + t * stride, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
            y = _scaled(acc, off_m, off_n, sx_ptr, sw_ptr, bias_ptr, M, N, HAS_BIAS, BLOCK_M, BLOCK_N)
            if FORM == 1:
                _gated_halves(y, t, off_m, off_n, out_desc, out_tile, residual_in, gate_ptr, map_ptr, M, N,
                              ONE_GATE_ROW, BLOCK_M, BLOCK_N)
            elif FORM == 2:  # interleaved column pairs (gate 2j, up 2j + 1) to silu(gate) up: half the columns
                gate, up = gl.split(gl.reshape(y.to(gl.bfloat16).to(gl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
                _store_out((gl.div_rn(gate, 1.0 + gl.exp(-gate)) * up).to(gl.bfloat16), out_desc, out_tile, off_m,
                           off_n // 2)
            else:  # bf16 rows, a column half at a time (a half-size buffer leaves room for a 4-stage ring)
                halves = gl.split(gl.permute(gl.reshape(y.to(gl.bfloat16), [BLOCK_M, 2, BLOCK_N // 2]), [0, 2, 1]))
                for h in gl.static_range(2):
                    _store_out(halves[h], out_desc, out_tile, off_m, off_n + h * (BLOCK_N // 2))
        tma.store_wait(0)
        mbarrier.invalidate(residual_in)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))

    @gluon.jit
    def _store_out(part, out_desc, out_tile, off_m, off_n):
        """part to the output at (off_m, off_n) through out_tile and TMA: no per-value pointers or masks (TMA clips the
        edges), and the store runs on while the next MMAs start; the last store must have left the buffer first."""
        tma.store_wait(0)
        out_tile.store(part)
        fence_async_shared()
        tma_store(out_desc, [off_m, off_n], out_tile)

    @gluon.jit
    def _gated_halves(y, t, off_m, off_n, res_desc, res_tile, residual_in, gate_ptr, map_ptr, M, N,
                      ONE_GATE_ROW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """residual += gate[row_map] * y over the tile, a column half at a time through res_tile (64 KB of f32):
        TMA in, the update in registers, TMA out; the gate row as a vector when the tile's rows share one."""
        HALF: gl.constexpr = BLOCK_N // 2
        halves = gl.split(gl.permute(gl.reshape(y, [BLOCK_M, 2, HALF]), [0, 2, 1]))
        for h in gl.static_range(2):
            part = halves[h]
            col = off_n + h * HALF
            tma.store_wait(0)  # the last store out of res_tile is done
            mbarrier.expect(residual_in, res_desc.block_type.nbytes)
            tma_load(res_desc, [off_m, col], residual_in, res_tile)
            mbarrier.wait(residual_in, phase=(t * 2 + h) & 1)
            r = res_tile.load(part.type.layout)
            rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, part.type.layout))
            rn = col + gl.arange(0, HALF, layout=gl.SliceLayout(0, part.type.layout))
            if ONE_GATE_ROW:
                res_tile.store(r + gl.expand_dims(gl.load(gate_ptr + rn, mask=rn < N, other=0.0), 0) * part)
            else:
                rows = gl.load(map_ptr + rm, mask=rm < M, other=0)
                lo = gl.min(gl.where(rm < M, rows, 1 << 30), axis=0)
                hi = gl.max(gl.where(rm < M, rows, -1), axis=0)
                # (Each branch stores: a gate vector and a gate tile are two types to the compiler's if.)
                if lo == hi:  # one gate row for the tile (a packed sequence's run): a vector
                    shared = gl.load(gate_ptr + lo * N + rn, mask=rn < N, other=0.0)
                    res_tile.store(r + gl.expand_dims(shared, 0) * part)
                else:
                    res_tile.store(r + part * gl.load(gate_ptr + gl.expand_dims(rows, 1) * N + gl.expand_dims(rn, 0),
                                                      mask=gl.expand_dims(rm < M, 1) & gl.expand_dims(rn < N, 0),
                                                      other=0.0))
            fence_async_shared()
            tma_store(res_desc, [off_m, col], res_tile)

    @gluon.jit
    def _scaled(acc, off_m, off_n, sx_ptr, sw_ptr, bias_ptr, M, N, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr):
        """y (f32) of a tile, in the accumulator's layout: the scales, then the bias."""
        rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
        sx = gl.load(sx_ptr + rm, mask=rm < M, other=0.0)
        sw = gl.load(sw_ptr + rn, mask=rn < N, other=0.0)
        y = acc.to(gl.float32) * (gl.expand_dims(sx, 1) * gl.expand_dims(sw, 0))
        if HAS_BIAS:
            y = y + gl.expand_dims(gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32), 0)
        return y


def _descriptor(tensor, block, dtype):
    """A TMA descriptor of tensor by blocks of `block`, in the default swizzle for the matrix cores."""
    return TensorDescriptor.from_tensor(tensor, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def _grid(m: int, n: int, t: dict, device: torch.device) -> tuple:
    """A program an SM (PERSISTENT: each runs every SM-count-th tile), else a program a tile."""
    tiles = triton.cdiv(m, t["BLOCK_M"]) * triton.cdiv(n, t["BLOCK_N"])
    return (min(tiles, _sm_count(device)) if t["PERSISTENT"] else tiles,)


def _launch(q, s_x, w, s_w, bias, out, form, gate, row_map, tile):
    """The kernel over codes q [M, K] and w [N, K] into out (bf16 rows, SwiGLU's half, or the f32 residual), a TMA
    box of BLOCK_M x BLOCK_N / 2 at a time."""
    if gluon is None:
        raise RuntimeError("int8_linear_gluon: this Triton has no Gluon (3.5 or later needed); use int8_linear")
    t = {**TILE, "STAGES": 3 if form == 1 else 4, **(tile or {})}
    (m, k), n = q.shape, w.shape[0]
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != k or k % 16 or not q.is_cuda:
        raise ValueError(f"int8_linear_gluon: codes must be CUDA int8 [M, K] and [N, K], K a multiple of 16 (TMA's "
                         f"16-byte rows), got {tuple(q.shape)} {q.dtype} and {tuple(w.shape)} {w.dtype}")
    if not out.is_contiguous() or out.data_ptr() % 16 or out.shape[1] * out.element_size() % 16:
        raise ValueError(f"int8_linear_gluon: the output [{m}, {out.shape[1]}] must be contiguous, 16-byte aligned, "
                         f"its rows a multiple of 16 bytes (TMA)")
    if m == 0:
        return out
    bm, bn, bk = t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"]
    absent = s_w  # pointer arguments the kernel never reads (their constexpr flag is off)
    # enable_fp_fusion=False: products and sums round separately, as the reference's do.
    _int8_linear_gluon_kernel[_grid(m, n, t, q.device)](
        _descriptor(q.contiguous(), [bm, bk], gl.int8), _descriptor(w.contiguous(), [bn, bk], gl.int8),
        _descriptor(out, [bm, bn // 2], gl.float32 if form == 1 else gl.bfloat16),
        s_x.float().contiguous().reshape(-1), s_w.float().contiguous().reshape(-1),
        bias if bias is not None else absent, gate.float().contiguous() if gate is not None else absent,
        row_map.to(torch.int32).contiguous() if row_map is not None else absent, m, n, k,
        HAS_BIAS=bias is not None, FORM=form, ONE_GATE_ROW=gate is not None and gate.shape[0] == 1,
        GROUP_M=t["GROUP_M"], STAGES=t["STAGES"], num_warps=t["num_warps"], enable_fp_fusion=False)
    return out


def int8_linear_gluon(q, s_x, w, s_w, bias=None, *, out=None, tile=None, swiglu=False):
    """bf16 [M, N] = (q wᵀ) * s_x[m] * s_w[n] + bias[n] as int8_linear (no LoRA); with swiglu, SiLU(gate) up of the
    interleaved column pairs, bf16 [M, N / 2]. CUDA (Hopper), K a multiple of 16, the output's N of 8. tile: TILE's
    keys (tests, timing)."""
    m, n = q.shape[0], w.shape[0] // 2 if swiglu else w.shape[0]
    if swiglu and w.shape[0] % 2:
        raise ValueError(f"int8_linear_gluon: swiglu takes interleaved gate and up rows, an even count, got "
                         f"{w.shape[0]}")
    out = torch.empty(m, n, dtype=torch.bfloat16, device=q.device) if out is None else out
    if out.shape != (m, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"int8_linear_gluon: out must be bf16 [{m}, {n}]")
    return _launch(q, s_x, w, s_w, bias, out, 2 if swiglu else 0, None, None, tile)


def int8_linear_gluon_gated(q, s_x, w, s_w, bias=None, *, residual, gate, row_map, tile=None):
    """residual (f32 [M, N], in place) += gate[row_map[m]] * ((q wᵀ) * s_x[m] * s_w[n] + bias[n]), as
    int8_linear_gated (no LoRA). N a multiple of 4 (TMA's 16-byte rows); gate under 2^31 values."""
    m, n = q.shape[0], w.shape[0]
    if residual.shape != (m, n) or residual.dtype != torch.float32:
        raise ValueError(f"int8_linear_gluon_gated: residual must be f32 [{m}, {n}]")
    if gate.dim() != 2 or gate.shape[1] != n or row_map.shape != (m,) or gate.numel() >= 2**31:
        raise ValueError(f"int8_linear_gluon_gated: gate must be [R, {n}] (under 2^31 values) and row_map [{m}]")
    return _launch(q, s_x, w, s_w, bias, residual, 1, gate, row_map, tile)
