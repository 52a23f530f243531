"""The INT8 linears on Hopper with the work split between warps: a producer warp loads, a warpgroup multiplies.

Issue 4. kernels/int8_linear.py's three forms (bf16 rows, SwiGLU, the gated residual) and kernels/qkv_rope_linear.py's
fused QKV in Gluon, their math and references unchanged (tests/kernels/test_int8_linear_hopper.py: bit for bit, the
QKV's q and k within one bf16 step). Triton's pipeliner waits for each integer wgmma before the next K step's loads;
here `warp_specialize` gives one warp (24 registers) the TMA loads into a ring of STAGES buffers, and the default
warpgroup waits for a slot, issues its MMAs asynchronously, keeps one group in flight and frees the slot behind it
(`empty`). A program an SM takes its 128 x 128 tiles in turn; outputs leave by TMA, and what an epilogue reads
besides the products (the gated residual tile, the QKV's cos and sin rows) is loaded during the K loop. Measured on
the H200 (docs/benchmarks.md, docs/gpu_path.md): products 1.13-1.36x the Triton kernel's (1300-1490 TOPS); ping-pong
consumers faulted on Triton 3.6, two programs an SM were slower. GPU only; where `unusable` objects, Triton's kernels.
"""
from __future__ import annotations

import logging
import os

import torch

from .int8_tiles import BF16, GATED, SWIGLU, sm_count

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # TMA's copies: async_load / async_store from Triton 3.7 (the H200's 3.6 has only the long names).
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None

QKV_ROPE = 3  # the fused QKV, a form past int8_tiles' BF16, GATED, SWIGLU
# A ring of 6 x 32 KB (5 with the gated form's 64 KB residual tile, 4 with the fused QKV's 64 KB of cos and sin rows
# beside its output box): 224 of the H200's 227 KB of shared memory.
TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "STAGES": 6, "GATED_STAGES": 5, "QKV_STAGES": 4}
# SWIFTDIT_HOPPER_GEMM=0 runs the Triton kernels everywhere (benchmarks time both in one run).
ENABLED = os.environ.get("SWIFTDIT_HOPPER_GEMM", "1") != "0"
UNBUILT: dict[int, str] = {}  # form -> why this Triton could not build it (Gluon's API moves between releases)


def unusable(q: torch.Tensor, out: torch.Tensor, row_bytes: int) -> str | None:
    """None when this kernel can take the call (Hopper, Gluon, TMA's 16-byte rows and bases), else why not."""
    if not ENABLED or gluon is None or os.environ.get("TRITON_INTERPRET") == "1":
        return "off, no Gluon, or interpreted"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "not a Hopper GPU (wgmma)"
    k = q.shape[1]
    aligned = k % 16 == row_bytes % 16 == q.data_ptr() % 16 == out.data_ptr() % 16 == 0
    return None if aligned and q.stride() == (k, 1) and out.is_contiguous() else "TMA needs 16-byte rows and bases"


if gluon is not None:
    @gluon.jit
    def _tile_offsets(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Row and column offsets of a tile: GROUP_M row tiles walk the column tiles together (weights stay in L2)."""
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        return (first_m + (tile % per_group) % group_m) * BLOCK_M, ((tile % per_group) // group_m) * BLOCK_N

    @gluon.jit
    def _schedule(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
        """(tiles_m, tiles_n, K steps, the program's tile count): the run both partitions walk in the same order."""
        tiles_m = gl.cdiv(M, BLOCK_M)
        tiles_n = gl.cdiv(N, BLOCK_N)
        return tiles_m, tiles_n, gl.cdiv(K, BLOCK_K), gl.cdiv(tiles_m * tiles_n - gl.program_id(0), gl.num_programs(0))

    @gluon.jit
    def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M: gl.constexpr,
                  STAGES: gl.constexpr):
        """K step c of the program's run (its tiles in order, their steps in order) into slot c % STAGES, once the
        consumer has freed the slot from step c - STAGES."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        tiles_m, tiles_n, steps, run = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for t in range(run):
            off_m, off_n = _tile_offsets(gl.program_id(0) + t * gl.num_programs(0), tiles_m, tiles_n, GROUP_M,
                                         BLOCK_M, BLOCK_N)
            for i in range(steps):
                c = t * steps + i
                slot = c % STAGES
                mbarrier.wait(empty.index(slot), ((c // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma_load(a_desc, [off_m, i * BLOCK_K], ready.index(slot), a_ring.index(slot))  # zeros past K, M, N
                tma_load(b_desc, [off_n, i * BLOCK_K], ready.index(slot), b_ring.index(slot))

    @gluon.jit
    def _products(a_ring, b_ring, ready, empty, t, steps, pre_a_desc, pre_b_desc, pre_tile, prefetched, off_m, col_a,
                  col_b, layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  PREFETCH: gl.constexpr):
        """The program's t-th tile's int32 products over K (exact), every slot it read freed; PREFETCH: pre_tile's two
        boxes loaded by TMA after the third K step, when the last epilogue's reads and stores of it are long done."""
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=layout)
        for i in range(steps):
            c = t * steps + i
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc, use_acc=i > 0,
                                is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_ring.index(slot), b_ring.index(slot)))
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=i > 0)  # step c - 1's MMA is done
            if PREFETCH:
                if i == min(2, steps - 1):
                    tma.store_wait(0)
                    fence_async_shared()  # the last epilogue's reads of pre_tile before TMA writes it
                    mbarrier.expect(prefetched, pre_a_desc.block_type.nbytes + pre_b_desc.block_type.nbytes)
                    tma_load(pre_a_desc, [off_m, col_a], prefetched, pre_tile.index(0))
                    tma_load(pre_b_desc, [off_m, col_b], prefetched, pre_tile.index(1))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((t * steps + steps - 1) % STAGES))
        return acc

    @gluon.jit
    def _store(part, out_desc, out_tile, coords):
        """part to the output at coords through out_tile and TMA (clipped at the edges), once the last store left."""
        tma.store_wait(0)
        out_tile.store(part)
        fence_async_shared()
        tma_store(out_desc, coords, out_tile)

    @gluon.jit
    def _gated(y, t, off_m, off_n, res_desc, res_tile, prefetched, gate_ptr, map_ptr, M, N,
               ONE_GATE_ROW: gl.constexpr):
        """residual += gate[row_map] * y on the prefetched residual, a column half at a time (gate rows as vectors)."""
        BLOCK_M: gl.constexpr = y.shape[0]
        HALF: gl.constexpr = y.shape[1] // 2
        halves = gl.split(gl.permute(gl.reshape(y, [BLOCK_M, 2, HALF]), [0, 2, 1]))
        mbarrier.wait(prefetched, t & 1)
        for h in gl.static_range(2):
            part = halves[h]
            col = off_n + h * HALF
            r = res_tile.index(h).load(part.type.layout)
            rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, part.type.layout))
            rn = col + gl.arange(0, HALF, layout=gl.SliceLayout(0, part.type.layout))
            if ONE_GATE_ROW:
                res_tile.index(h).store(r + gl.expand_dims(gl.load(gate_ptr + rn, mask=rn < N, other=0.0), 0) * part)
            else:
                rows = gl.load(map_ptr + rm, mask=rm < M, other=0)
                lo = gl.min(gl.where(rm < M, rows, 1 << 30), axis=0)
                hi = gl.max(gl.where(rm < M, rows, -1), axis=0)
                if lo == hi:  # one gate row for the tile (a packed sequence's run): a vector
                    shared = gl.load(gate_ptr + lo * N + rn, mask=rn < N, other=0.0)
                    res_tile.index(h).store(r + gl.expand_dims(shared, 0) * part)
                else:
                    gates = gl.load(gate_ptr + gl.expand_dims(rows, 1) * N + gl.expand_dims(rn, 0),
                                    mask=gl.expand_dims(rm < M, 1) & gl.expand_dims(rn < N, 0), other=0.0)
                    res_tile.index(h).store(r + part * gates)
            fence_async_shared()
            tma_store(res_desc, [off_m, col], res_tile.index(h))

    @gluon.jit
    def _qkv_rope(y, t, off_m, off_n, out_desc, out_tile, nw_ptr, rope_tile, prefetched, HD, eps,
                  HAS_NORM: gl.constexpr, D: gl.constexpr):
        """qkv_rope_linear's head math on a tile of whole heads of q, k or v, into [3, M, heads D] by a 3-D TMA box."""
        BLOCK_M: gl.constexpr = y.shape[0]
        BLOCK_N: gl.constexpr = y.shape[1]
        R: gl.constexpr = D // 2
        which = off_n // HD  # 0 q, 1 k, 2 v
        mbarrier.wait(prefetched, t & 1)  # the tile's cos and sin rows (zeros past M: rows the store clips)
        if which < 2:  # (each branch stores: the head math leaves its values in another layout than y's)
            # [BM, heads, 2 halves, R] -> each head's first and second half: n[j] and its rotary partner n[j + R].
            a, b = gl.split(gl.permute(gl.reshape(y, [BLOCK_M, BLOCK_N // D, 2, R]), [0, 1, 3, 2]))
            j = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(1, a.type.layout)))
            if HAS_NORM:
                ms = gl.div_rn(gl.sum(a * a, axis=2) + gl.sum(b * b, axis=2), D * 1.0)
                inv = gl.expand_dims(gl.div_rn(1.0, gl.sqrt_rn(ms + eps)), 2)
                a = (a * inv) * gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + j), 0), 1)
                b = (b * inv) * gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + R + j), 0), 1)
            cos = gl.expand_dims(rope_tile.index(0).load(gl.SliceLayout(1, a.type.layout)), 1)
            sin = gl.expand_dims(rope_tile.index(1).load(gl.SliceLayout(1, a.type.layout)), 1)
            turned = gl.join(a * cos - b * sin, b * cos + a * sin)  # [BM, heads, R, 2]
            turned = gl.reshape(gl.permute(turned, [0, 1, 3, 2]), [BLOCK_M, BLOCK_N]).to(gl.bfloat16)
            _store(gl.reshape(turned, [1, BLOCK_M, BLOCK_N]), out_desc, out_tile, [which, off_m, off_n - which * HD])
        else:  # v
            _store(gl.reshape(y.to(gl.bfloat16), [1, BLOCK_M, BLOCK_N]), out_desc, out_tile, [2, off_m, off_n - 2 * HD])

    @gluon.jit
    def _consumer(a_desc, b_desc, out_desc, a_ring, b_ring, ready, empty, out_tile, pre_tile, prefetched, sx_ptr,
                  sw_ptr, bias_ptr, gate_ptr, map_ptr, nw_ptr, cos_desc, sin_desc, M, N, K, HD, eps, FORM: gl.constexpr,
                  HAS_BIAS: gl.constexpr, ONE_GATE_ROW: gl.constexpr, HAS_NORM: gl.constexpr, D: gl.constexpr,
                  GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        """The program's tiles: their products, then the form's epilogue (int8_linear's y, rounded once)."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 32])
        tiles_m, tiles_n, steps, run = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for t in range(run):
            off_m, off_n = _tile_offsets(gl.program_id(0) + t * gl.num_programs(0), tiles_m, tiles_n, GROUP_M,
                                         BLOCK_M, BLOCK_N)
            if FORM == 1:  # the residual tile's column halves
                acc = _products(a_ring, b_ring, ready, empty, t, steps, out_desc, out_desc, pre_tile, prefetched, off_m,
                                off_n, off_n + BLOCK_N // 2, layout, BLOCK_M, BLOCK_N, STAGES, True)
            else:  # the fused QKV's rotary rows (cos, sin); the other forms prefetch nothing
                acc = _products(a_ring, b_ring, ready, empty, t, steps, cos_desc, sin_desc, pre_tile, prefetched, off_m,
                                0, 0, layout, BLOCK_M, BLOCK_N, STAGES, FORM == 3)
            rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
            sx = gl.load(sx_ptr + rm, mask=rm < M, other=0.0)
            sw = gl.load(sw_ptr + rn, mask=rn < N, other=0.0)
            y = acc.to(gl.float32) * (gl.expand_dims(sx, 1) * gl.expand_dims(sw, 0))
            if HAS_BIAS:
                y = y + gl.expand_dims(gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32), 0)
            if FORM == 1:
                _gated(y, t, off_m, off_n, out_desc, pre_tile, prefetched, gate_ptr, map_ptr, M, N, ONE_GATE_ROW)
            elif FORM == 2:  # interleaved column pairs (gate 2j, up 2j + 1): int8_products.swiglu_pairs' math
                gate, up = gl.split(gl.reshape(y.to(gl.bfloat16).to(gl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
                _store((gate / (1.0 + gl.exp(-gate)) * up).to(gl.bfloat16), out_desc, out_tile, [off_m, off_n // 2])
            elif FORM == 3:
                _qkv_rope(y.to(gl.bfloat16).to(gl.float32), t, off_m, off_n, out_desc, out_tile, nw_ptr, pre_tile,
                          prefetched, HD, eps, HAS_NORM, D)
            else:
                _store(y.to(gl.bfloat16), out_desc, out_tile, [off_m, off_n])
        tma.store_wait(0)

    @gluon.jit
    def _int8_linear_hopper_kernel(a_desc, b_desc, out_desc, sx_ptr, sw_ptr, bias_ptr, gate_ptr, map_ptr, nw_ptr,
                                   cos_desc, sin_desc, M, N, K, HD, eps, FORM: gl.constexpr, HAS_BIAS: gl.constexpr,
                                   ONE_GATE_ROW: gl.constexpr, HAS_NORM: gl.constexpr, D: gl.constexpr,
                                   GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        # pre_tile: what _products prefetches (the gated residual's column halves, stored from too; the QKV's cos, sin)
        if FORM == 1:
            pre_tile = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
            out_tile = pre_tile
        else:
            out_tile = gl.allocate_shared_memory(out_desc.dtype, out_desc.block_type.shape, out_desc.layout)
            if FORM == 3:
                pre_tile = gl.allocate_shared_memory(cos_desc.dtype, [2] + cos_desc.block_type.shape, cos_desc.layout)
            else:
                pre_tile = out_tile  # (not read)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        prefetched = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        mbarrier.init(prefetched, count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_consumer, (a_desc, b_desc, out_desc, a_ring, b_ring, ready, empty, out_tile, pre_tile, prefetched, sx_ptr,
                         sw_ptr, bias_ptr, gate_ptr, map_ptr, nw_ptr, cos_desc, sin_desc, M, N, K, HD, eps, FORM,
                         HAS_BIAS, ONE_GATE_ROW, HAS_NORM, D, GROUP_M, STAGES)),
            (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, STAGES)),
        ], [1], [24])


def _descriptor(tensor, block, dtype):  # TMA by blocks of `block`, in the matrix cores' default swizzle
    return TensorDescriptor.from_tensor(tensor, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def launch(q, s_x, w, s_w, bias, out, form, *, gate=None, row_map=None, norms=None, cos=None, sin=None, heads_d=0,
           head=128, eps=1e-6):
    """Codes q [M, K] and w [N, K] into out: bf16 [M, N], f32 residual [M, N] in place (GATED), bf16 [M, N / 2]
    (SWIGLU) or bf16 [3, M, heads_d] (QKV_ROPE); True, or False where nothing ran (not buildable here: UNBUILT says
    why, and the callers run the Triton kernels). The callers ask `unusable` first."""
    if form in UNBUILT:
        return False
    t = TILE
    (m, k), n = q.shape, w.shape[0]
    bm, bn, bk = t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"]
    box, dtype = {BF16: ([bm, bn], gl.bfloat16), GATED: ([bm, bn // 2], gl.float32),
                  SWIGLU: ([bm, bn // 2], gl.bfloat16), QKV_ROPE: ([1, bm, bn], gl.bfloat16)}[form]
    absent = s_x  # pointer arguments the kernel never reads (their constexpr flag or form is off)
    try:  # (a Triton whose Gluon differs fails here, in the descriptors or the build: nothing has run)
        a_desc = _descriptor(q, [bm, bk], gl.int8)
        rope = [_descriptor(table.float().contiguous(), [bm, head // 2], gl.float32) for table in (cos, sin)] if (
            form == QKV_ROPE) else [a_desc, a_desc]  # (not read)
        # enable_fp_fusion=False: products and sums round separately, as the references' do.
        _int8_linear_hopper_kernel[(min(triton.cdiv(m, bm) * triton.cdiv(n, bn), sm_count(q.device)),)](
            a_desc, _descriptor(w.contiguous(), [bn, bk], gl.int8), _descriptor(out, box, dtype),
            s_x.float().contiguous().reshape(-1), s_w.float().contiguous().reshape(-1),
            bias if bias is not None else absent, gate.float().contiguous() if gate is not None else absent,
            row_map.to(torch.int32).contiguous() if row_map is not None else absent,
            norms if norms is not None else absent, *rope, m, n, k, heads_d, eps, FORM=form,
            HAS_BIAS=bias is not None, ONE_GATE_ROW=gate is not None and gate.shape[0] == 1,
            HAS_NORM=norms is not None, D=head, GROUP_M=t["GROUP_M"],
            STAGES=t[{GATED: "GATED_STAGES", QKV_ROPE: "QKV_STAGES"}.get(form, "STAGES")], num_warps=4,
            enable_fp_fusion=False)
    except (triton.compiler.errors.CompilationError, triton.runtime.errors.OutOfResources, TypeError,
            AttributeError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "PassManager" not in str(e):
            raise  # a launch's own error, not a build's
        UNBUILT[form] = f"Triton {triton.__version__}: {type(e).__name__}: {(str(e).strip() or '-').splitlines()[-1]}"
        logging.getLogger(__name__).warning("int8_linear_hopper: form %d not built (%s); Triton's kernels run it",
                                            form, UNBUILT[form])
        return False
    return True
