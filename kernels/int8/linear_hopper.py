"""The INT8 linears on Hopper with the work split between warps: a producer warp loads, two warpgroups multiply.

Issue 4. kernels/int8/linear.py's three forms (bf16 rows, SwiGLU, the gated residual) and kernels/int8/qkv_rope_linear.py's
fused QKV in Gluon, their math and references unchanged (bit for bit; the QKV's q and k within one bf16 step). Triton's
pipeliner waits for each integer wgmma before the next K step's loads; here `warp_specialize` gives one warp (24
registers) the TMA loads into a ring of STAGES buffers. A program an SM takes its 128 x 128 tiles in turn, two consumer
warpgroups every other one (ping-pong): each waits for a slot, issues its MMAs asynchronously, keeps one group in flight
and frees the slot behind it (`empty`); once one's K loop is issued the other's may start (`turn`: so one's epilogue
runs under the other's products, and the ring's barriers stay within a phase of the step awaited, which their parity
alone names). Outputs leave by TMA from each consumer's box; the gated and QKV epilogues are
kernels/int8/hopper_epilogues.py's. On the H200 its products run at 1.2-1.5x
Triton's rate and up to 1.25x one consumer's; two programs an SM were slower. GPU only (else `unusable`).
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from ..gluon_builds import build_failure
from .hopper_epilogues import axis_ends
from .tiles import BF16, GATED, SWIGLU, sm_count
from ..jit import gluon_jit

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .hopper_epilogues import (addend_box, fetch_box, gated_epilogue, qkv_epilogue, store_box, tma_load,
                                        turned_hidden, turned_v)
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None

QKV_ROPE = 3  # the fused QKV, a form past int8_tiles' BF16, GATED, SWIGLU
# A ring of 5 x 32 KB beside the consumers' two 32 KB output boxes (SwiGLU's 16 KB: 6), 224 of the H200's 227 KB.
TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "STAGES": 5, "SWIGLU_STAGES": 6}
PART_COLUMNS = TILE["BLOCK_N"] // 2  # the gated epilogue's column halves: the width of the norm parts it writes
UNBUILT: dict[int, str] = {}  # form (GELU's bf16 rows: GELU_ROWS) -> why this Triton could not build it (Gluon's API
# moves between releases)
GELU_ROWS = 4


def unusable(q: torch.Tensor, out: torch.Tensor, row_bytes: int) -> str | None:
    """None when this kernel can take the call (Hopper, Gluon, TMA's 16-byte rows and bases), else why not (the
    operands asked first, so that the CPU's tests reach that answer too)."""
    aligned = q.shape[1] % 16 == row_bytes % 16 == q.data_ptr() % 16 == out.data_ptr() % 16 == 0
    if not (aligned and q.stride() == (q.shape[1], 1) and out.is_contiguous()):
        return "TMA needs 16-byte rows and bases"
    if gluon is None or os.environ.get("TRITON_INTERPRET") == "1":
        return "off, no Gluon, or interpreted"  # (the words tests match)
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "not a Hopper GPU (wgmma)"
    return None


if gluon is not None:
    @gluon_jit
    def _tile_offsets(t, tiles_m, tiles_n, GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Row and column offsets of the program's t-th tile: GROUP_M row tiles walk the column tiles together (weights
        stay in L2)."""
        tile = gl.program_id(0) + t * gl.num_programs(0)
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        return (first_m + (tile % per_group) % group_m) * BLOCK_M, ((tile % per_group) // group_m) * BLOCK_N

    @gluon_jit
    def _schedule(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
        """(tiles_m, tiles_n, K steps, the program's tile count): the run every partition walks in the same order."""
        tiles_m, tiles_n = gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N)
        return tiles_m, tiles_n, gl.cdiv(K, BLOCK_K), gl.cdiv(tiles_m * tiles_n - gl.program_id(0), gl.num_programs(0))

    @gluon_jit
    def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M: gl.constexpr,
                  STAGES: gl.constexpr):
        """K step c of the program's run (its tiles in order, their steps in order) into slot c % STAGES, once a
        consumer has freed the slot from step c - STAGES."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        tiles_m, tiles_n, steps, run = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for t in range(run):
            off_m, off_n = _tile_offsets(t, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
            for i in range(steps):
                c = t * steps + i
                slot = c % STAGES
                mbarrier.wait(empty.index(slot), ((c // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma_load(a_desc, [off_m, i * BLOCK_K], ready.index(slot), a_ring.index(slot))  # zeros past K, M, N
                tma_load(b_desc, [off_n, i * BLOCK_K], ready.index(slot), b_ring.index(slot))

    @gluon_jit
    def _products(a_ring, b_ring, ready, empty, first, steps, their_turn, layout: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """A tile's int32 products over K (exact) from the run's steps first.. first + steps - 1, every slot freed;
        their_turn arrived once the last MMA is issued, so the other consumer's K loop follows on the matrix cores."""
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=layout)
        for i in range(steps):
            c = first + i
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc, use_acc=i > 0,
                                is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_ring.index(slot), b_ring.index(slot)))
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=i > 0)  # step c - 1's MMA is done
        mbarrier.arrive(their_turn)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((first + steps - 1) % STAGES))
        return acc

    @gluon_jit
    def _consumer(a_desc, b_desc, out_desc, add_desc, a_ring, b_ring, ready, empty, turn, out_tiles, fetched, sx_ptr,
                  sw_ptr, bias_ptr, gate_ptr, map_ptr, norm_ptr, cos_ptr, sin_ptr, M, N, K, HD, eps, FORM: gl.constexpr,
                  HAS_BIAS: gl.constexpr, ONE_GATE_ROW: gl.constexpr, HAS_ADDEND: gl.constexpr, HAS_NORM: gl.constexpr,
                  D: gl.constexpr, ANGLES: gl.constexpr, TURN: gl.constexpr, GELU: gl.constexpr,
                  GROUP_M: gl.constexpr, STAGES: gl.constexpr, W: gl.constexpr):
        """Consumer W's tiles (the program's W-th, W + 2-th, ...): their products once the other consumer's K loop is
        issued, then the form's epilogue (int8_linear's y, rounded once) while the other's products run. HAS_NORM:
        the QKV reads its heads' norm gains at norm_ptr; the gated form writes the updated rows' norm parts there."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 32])
        out_tile = out_tiles.index(W)
        tiles_m, tiles_n, steps, run = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for t in range(W, run, 2):
            off_m, off_n = _tile_offsets(t, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
            if FORM == 1 and HAS_ADDEND:
                fetch_box(add_desc, addend_box(out_tile, add_desc), fetched.index(W), off_m, off_n)
            elif FORM == 1:
                fetch_box(out_desc, out_tile, fetched.index(W), off_m, off_n)
            if t > 0:  # the other consumer's tile t - 1 is issued: the ring's barriers are a phase from ours at most
                mbarrier.wait(turn.index(W), ((t - 1) // 2) & 1)
            rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
            acc = _products(a_ring, b_ring, ready, empty, t * steps, steps, turn.index(1 - W), layout, BLOCK_M,
                            BLOCK_N, STAGES)
            # (The scales asked for before the K loop ran 1-6% slower on every shape: registers held through it.)
            sx = gl.load(sx_ptr + rm, mask=rm < M, other=0.0)
            sw = gl.load(sw_ptr + rn, mask=rn < N, other=0.0)
            y = acc.to(gl.float32) * (gl.expand_dims(sx, 1) * gl.expand_dims(sw, 0))
            if HAS_BIAS:
                y = y + gl.expand_dims(gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32), 0)
            if FORM == 1:
                gated_epilogue(y, off_m, off_n, out_desc, out_tile, fetched.index(W), gate_ptr, map_ptr, add_desc,
                               norm_ptr, M, N, ONE_GATE_ROW, HAS_ADDEND, HAS_NORM)
            elif FORM == 2:  # interleaved column pairs (gate 2j, up 2j + 1): products.swiglu_pairs' math
                gate, up = gl.split(gl.reshape(y.to(gl.bfloat16).to(gl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
                act = gate / (1.0 + gl.exp(-gate)) * up
                if TURN:
                    act = turned_hidden(act)
                store_box(act.to(gl.bfloat16), out_desc, out_tile, [off_m, off_n // 2])
            elif FORM == 3:
                qkv_epilogue(y.to(gl.bfloat16).to(gl.float32), off_m, off_n, out_desc, out_tile, norm_ptr, cos_ptr,
                             sin_ptr, M, HD, eps, HAS_NORM, D, ANGLES, TURN)
            else:
                if GELU:  # products.gelu_rows' math (the division approximate, as SwiGLU's)
                    u = y.to(gl.bfloat16).to(gl.float32)
                    y = u / (1.0 + gl.exp(-(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))))
                    if TURN:
                        y = turned_v(y)
                store_box(y.to(gl.bfloat16), out_desc, out_tile, [off_m, off_n])
        tma.store_wait(0)

    @gluon_jit
    def _int8_linear_hopper_kernel(a_desc, b_desc, out_desc, add_desc, sx_ptr, sw_ptr, bias_ptr, gate_ptr, map_ptr,
                                   norm_ptr, cos_ptr, sin_ptr, M, N, K, HD, eps, FORM: gl.constexpr,
                                   HAS_BIAS: gl.constexpr, ONE_GATE_ROW: gl.constexpr, HAS_ADDEND: gl.constexpr,
                                   HAS_NORM: gl.constexpr, D: gl.constexpr, ANGLES: gl.constexpr,
                                   TURN: gl.constexpr, GELU: gl.constexpr, GROUP_M: gl.constexpr,
                                   STAGES: gl.constexpr):
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        # each consumer's output box (the gated form's residual, read and written in it)
        out_tiles = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # a consumer's K loop may start
        fetched = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # its residual half is in
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        for w in gl.static_range(2):
            mbarrier.init(turn.index(w), count=1)
            mbarrier.init(fetched.index(w), count=1)
        fence_async_shared()
        # Warps 0-3 and 4-7 the consumers (wgmma wants whole warpgroups), warp 8 the producer. The consumers' arguments
        # are written out twice: a tuple built beforehand and extended by W reaches them without its constexprs.
        gl.warp_specialize([
            (_consumer, (a_desc, b_desc, out_desc, add_desc, a_ring, b_ring, ready, empty, turn, out_tiles, fetched,
                         sx_ptr, sw_ptr, bias_ptr, gate_ptr, map_ptr, norm_ptr, cos_ptr, sin_ptr, M, N, K, HD, eps,
                         FORM, HAS_BIAS, ONE_GATE_ROW, HAS_ADDEND, HAS_NORM, D, ANGLES, TURN, GELU, GROUP_M,
                         STAGES, 0)),
            (_consumer, (a_desc, b_desc, out_desc, add_desc, a_ring, b_ring, ready, empty, turn, out_tiles, fetched,
                         sx_ptr, sw_ptr, bias_ptr, gate_ptr, map_ptr, norm_ptr, cos_ptr, sin_ptr, M, N, K, HD, eps,
                         FORM, HAS_BIAS, ONE_GATE_ROW, HAS_ADDEND, HAS_NORM, D, ANGLES, TURN, GELU, GROUP_M,
                         STAGES, 1)),
            (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, STAGES)),
        ], [4, 1], [224, 24])


def tma_descriptor(tensor, block, dtype):  # TMA by blocks of `block`, in the matrix cores' default swizzle
    return TensorDescriptor.from_tensor(tensor, block, _swizzle(tuple(block), dtype))


@functools.cache
def _swizzle(block: tuple[int, ...], dtype):
    # Made once a box and type: Gluon builds a layout in Python (a fifth of a launch's host time in LTX-2.5's step)
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def launch(q, s_x, w, s_w, bias, out, form, *, gate=None, row_map=None, addend=None, parts=None, norms=None,
           cos=None, sin=None, angles=None, heads_d=0, head=128, eps=1e-6, turn=False, gelu=False,
           group_m=TILE["GROUP_M"]):
    """Codes q [M, K] and w [N, K] into out (bf16 [M, N]; GATED: the f32 residual [M, N] in place, the bf16 addend
    [M, N] added to the product where given, the updated rows' norm parts into parts [2, N / 64, M] f32 where given
    (kernels/int8/row_stats.py); SWIGLU: bf16 [M, N / 2]; QKV_ROPE: bf16 [3, M, heads_d], turned by cos
    and sin [M, head / 2] or, where given, by angles: (positions [M, 4], freqs [2, head / 2], the first columns of
    axes 1-3), int8_hopper_epilogues' factors; gelu: BF16's rows through GELU; turn: QKV_ROPE's v and GELU's rows
    turned (turned_v), SWIGLU's rows turned (turned_hidden)); group_m: row tiles walking the columns together
    (kernels.Choices.group_m); True, or False where nothing ran (UNBUILT says why, or an addend TMA cannot read; the
    callers run Triton's kernels). The callers ask `unusable` first."""
    built_as = GELU_ROWS if gelu else form
    if built_as in UNBUILT or (addend is not None and (addend.data_ptr() % 16 or addend.stride() != (w.shape[0], 1)
                                                   or w.shape[0] % 8)):
        return False
    (m, k), n = q.shape, w.shape[0]
    bm, bn, bk = TILE["BLOCK_M"], TILE["BLOCK_N"], TILE["BLOCK_K"]
    box, dtype = {BF16: ([bm, bn], gl.bfloat16), GATED: ([bm, bn // 2], gl.float32),
                  SWIGLU: ([bm, bn // 2], gl.bfloat16), QKV_ROPE: ([1, bm, bn], gl.bfloat16)}[form]
    absent = s_x  # pointer arguments the kernel never reads (their constexpr flag or form is off)

    def run():  # (a Triton whose Gluon differs fails here, in the descriptors or the build: nothing has run)
        rope = [table.float().contiguous() for table in (angles[:2] if angles is not None else (cos, sin))] \
            if form == QKV_ROPE else [absent, absent]
        # enable_fp_fusion=False: products and sums round separately, as the references' do.
        _int8_linear_hopper_kernel[(min(triton.cdiv(m, bm) * triton.cdiv(n, bn), sm_count(q.device)),)](
            tma_descriptor(q, [bm, bk], gl.int8), tma_descriptor(w.contiguous(), [bn, bk], gl.int8),
            tma_descriptor(out, box, dtype), tma_descriptor(addend, box, gl.bfloat16) if addend is not None else absent,
            s_x.float().contiguous().reshape(-1), s_w.float().contiguous().reshape(-1),
            bias if bias is not None else absent, gate.float().contiguous() if gate is not None else absent,
            row_map.to(torch.int32).contiguous() if row_map is not None else absent,
            next((t for t in (norms, parts) if t is not None), absent), *rope, m, n, k, heads_d, eps, FORM=form,
            HAS_BIAS=bias is not None, ONE_GATE_ROW=gate is not None and gate.shape[0] == 1,
            HAS_ADDEND=addend is not None, HAS_NORM=norms is not None or parts is not None, D=head,
            ANGLES=axis_ends(angles[2]) if angles is not None else 0, TURN=turn, GELU=gelu, GROUP_M=group_m,
            STAGES=TILE["SWIGLU_STAGES" if form == SWIGLU else "STAGES"], num_warps=4, enable_fp_fusion=False)
    why = build_failure(run)
    if why is not None:
        UNBUILT[built_as] = why
        logging.getLogger(__name__).warning("int8_linear_hopper: form %d not built (%s); Triton's kernels run it",
                                            built_as, why)
        return False
    return True
