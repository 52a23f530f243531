"""INT8 x INT8 -> INT32 products with the matrix cores kept busy across K steps: the bf16-rows form of
kernels/int8_linear.py written in Gluon (Triton's explicit-layout language), to be timed against it.

The math is int8_linear's (its reference() is this kernel's): acc = q wᵀ exact in int32, y = float(acc) * (s_x[m] *
s_w[n]) + bias[n] rounded once (no fused multiply-add), out = bf16(y).
Why a second kernel: Triton's own pipeliner keeps no integer wgmma in flight across K steps. At the H200 tile it
emits `wgmma.wait_group 0` after every K step for int8 (the MMA pipeline drains each step), while the same loop in fp8
or bf16 waits for 1 (tests/kernels/sm90_builds.py shows both). Here the loop is written out: a ring of STAGES shared
buffers filled by TMA, each K step's MMA issued asynchronously, then a wait that leaves one group in flight, and the
slot the previous MMA read refilled only after that wait. Integer wgmma takes n <= 224, so a 256-wide tile issues two
n = 128 instructions a k32 step, as Triton's does.
Not used by the block yet (no CPU interpreter runs Gluon): tests/kernels/test_int8_linear_gluon.py checks it on the
GPU and its build in CI; bench_int8_linear.py times it.
"""
from __future__ import annotations

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # TMA's global-to-shared copy: async_load from Triton 3.7 (the H200's 3.6 names it async_copy_global_to_shared).
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
except ImportError:  # a Triton without Gluon (before 3.5): int8_linear.py is the kernel then
    gluon = None

TILE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "STAGES": 4, "num_warps": 8}


def available() -> bool:
    return gluon is not None


if gluon is not None:
    @gluon.jit
    def _int8_linear_gluon_kernel(a_desc, b_desc, sx_ptr, sw_ptr, bias_ptr, out_ptr, M, N, K,
                                  HAS_BIAS: gl.constexpr, WIDE: gl.constexpr, GROUP_M: gl.constexpr,
                                  STAGES: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        # Tile order as int8_linear's _tile_of: GROUP_M row tiles walk the column tiles together (weights stay in L2).
        tiles_m = gl.cdiv(M, BLOCK_M)
        tiles_n = gl.cdiv(N, BLOCK_N)
        tile = gl.program_id(0)
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_m) * BLOCK_M
        off_n = ((tile % per_group) // group_m) * BLOCK_N

        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                             instr_shape=[16, 128, 32])
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        steps = gl.cdiv(K, BLOCK_K)
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        for s in gl.static_range(STAGES - 1):  # the first STAGES - 1 K steps in flight (TMA zero-fills past K)
            mbarrier.expect(ready.index(s), nbytes, pred=s < steps)
            tma_load(a_desc, [off_m, s * BLOCK_K], ready.index(s), a_ring.index(s),
                                            pred=s < steps)
            tma_load(b_desc, [off_n, s * BLOCK_K], ready.index(s), b_ring.index(s),
                                            pred=s < steps)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=acc_layout)
        for i in range(steps):
            slot = i % STAGES
            mbarrier.wait(ready.index(slot), phase=(i // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc, is_async=True)
            # One group stays in flight: step i - 1's MMA is done, so the slot it read takes step i + STAGES - 1.
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_ring.index(slot), b_ring.index(slot)))
            refill = i + STAGES - 1
            free = refill % STAGES
            mbarrier.expect(ready.index(free), nbytes, pred=refill < steps)
            tma_load(a_desc, [off_m, refill * BLOCK_K], ready.index(free), a_ring.index(free),
                                            pred=refill < steps)
            tma_load(b_desc, [off_n, refill * BLOCK_K], ready.index(free), b_ring.index(free),
                                            pred=refill < steps)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))

        # Epilogue in the accumulator's own layout (no shared-memory round trip): scales, bias, one bf16 rounding.
        rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        mmask = rm < M
        nmask = rn < N
        sx = gl.load(sx_ptr + rm, mask=mmask, other=0.0)
        sw = gl.load(sw_ptr + rn, mask=nmask, other=0.0)
        y = acc.to(gl.float32) * (gl.expand_dims(sx, 1) * gl.expand_dims(sw, 0))
        if HAS_BIAS:
            y = y + gl.expand_dims(gl.load(bias_ptr + rn, mask=nmask, other=0.0).to(gl.float32), 0)
        offs = gl.expand_dims(rm.to(gl.int64) if WIDE else rm, 1) * N + gl.expand_dims(rn, 0)  # 32-bit: fewer spills
        gl.store(out_ptr + offs, y.to(gl.bfloat16), mask=gl.expand_dims(mmask, 1) & gl.expand_dims(nmask, 0))


def int8_linear_gluon(q, s_x, w, s_w, bias=None, *, out=None, tile=None):
    """bf16 [M, N] = (q wᵀ) * s_x[m] * s_w[n] + bias[n], as int8_linear (no LoRA, no other form). CUDA (Hopper),
    K a multiple of 16 (TMA's 16-byte rows). tile: TILE's keys (tests, timing)."""
    if gluon is None:
        raise RuntimeError("int8_linear_gluon: this Triton has no Gluon (3.5 or later needed); use int8_linear")
    t = {**TILE, **(tile or {})}
    (m, k), n = q.shape, w.shape[0]
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != k or k % 16 or not q.is_cuda:
        raise ValueError(f"int8_linear_gluon: codes must be CUDA int8 [M, K] and [N, K], K a multiple of 16, got "
                         f"{tuple(q.shape)} {q.dtype} and {tuple(w.shape)} {w.dtype}")
    out = torch.empty(m, n, dtype=torch.bfloat16, device=q.device) if out is None else out
    if m == 0:
        return out
    q, w = q.contiguous(), w.contiguous()
    a_desc = TensorDescriptor.from_tensor(q, [t["BLOCK_M"], t["BLOCK_K"]],
                                          gl.NVMMASharedLayout.get_default_for([t["BLOCK_M"], t["BLOCK_K"]], gl.int8))
    b_desc = TensorDescriptor.from_tensor(w, [t["BLOCK_N"], t["BLOCK_K"]],
                                          gl.NVMMASharedLayout.get_default_for([t["BLOCK_N"], t["BLOCK_K"]], gl.int8))
    sx, sw = s_x.float().contiguous().reshape(-1), s_w.float().contiguous().reshape(-1)
    grid = (triton.cdiv(m, t["BLOCK_M"]) * triton.cdiv(n, t["BLOCK_N"]),)
    # enable_fp_fusion=False: the scale product and the bias add round separately, as the reference's do.
    _int8_linear_gluon_kernel[grid](a_desc, b_desc, sx, sw, bias if bias is not None else sx, out, m, n, k,
                                    HAS_BIAS=bias is not None, WIDE=m * n >= 2**31, GROUP_M=t["GROUP_M"],
                                    STAGES=t["STAGES"], num_warps=t["num_warps"], enable_fp_fusion=False)
    return out
