"""Plain bf16 rows to INT8 ConvRot codes in one pass over memory on Hopper (Gluon): the rotated rows stay in shared
memory until their row scales are known.

Issue 4. kernels/int8/quant.py's math for rows with no prologue (here the MLP's hidden rows after UP's SwiGLU
epilogue: `chosen`), group 256, bit for bit its kernels' (the same matrix-core sums: u_a (H_64 / 2) by wgmma, then
the radix-4 butterfly; tests/kernels/test_int8_quant_hopper.py). Its two launches move 7 bytes a value (x read,
the rotated rows written and read back, the codes written); this one 3: x read once by TMA, the codes written.
A work item is 64 rows x G groups (a chunk of a row block's columns). Its rotated rows are rounded to bf16 into the
shared memory x came in, and its rows' partial absmax go to global memory. Once every chunk of the row block has
counted itself in (an int32 counter a row block, in kernels/int8/arrival_counters.py's kept buffers), each item reads all
the partial maxima and writes its codes from shared memory. Items are taken in order from a ticket counter, and a
program takes its next ticket only once its row block's chunks are all in (holding two tickets of one row block, it
would wait for itself). So the items a program waits for are held by running programs, whatever else the card runs
(a row block's chunks need only that many programs resident). The last of a row block's items to leave sets its
counter back to 0; the last program to finish, the tickets'. (Two item buffers, the next item's loads under this
one's wait and codes, measured slower on the H200: 72 KB a program, one group an item, 36 waits a row block.)
GPU only (Hopper, Gluon, TMA), else `unusable` says why and kernels/int8/quant.py's passes run.
"""
from __future__ import annotations

import os

import torch

from .arrival_counters import kept
from .hadamard import hadamard_bf16
from .linear_hopper import tma_descriptor
from .tiles import sm_count
from ..jit import gluon_jit

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .hopper_epilogues import tma_load
    cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # (Triton 3.7 on; the H200's 3.6)
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None

BLOCK_M, BLOCK_Q, GROUP = 64, 64, 256  # a wgmma's 64 rows; a group as 4 blocks of 64 columns (kernels/int8/hadamard.py)
UNBUILT: list[str] = []  # why this Triton could not build the kernel (Gluon's API moves between releases)


def unusable(x: torch.Tensor, group: int) -> str | None:
    """None when this kernel can take plain rows x [M, K] of ConvRot group `group`, else why not (the inputs asked
    first, so that the CPU's tests reach those answers too)."""
    if group != GROUP or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] % GROUP:
        return "not bf16 rows of whole 256-groups"
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        return "TMA needs 16-byte rows and bases"
    if gluon is None or UNBUILT or os.environ.get("TRITON_INTERPRET") == "1":
        return "off, no Gluon, unbuilt or interpreted"  # (the words tests match)
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) != (9, 0):
        return "not a Hopper GPU (wgmma)"
    return None


def chosen(m: int, k: int) -> bool:
    """Whether quantize_rows takes this kernel for plain rows [m, k]: only where it is faster than the Triton
    passes on the H200, the MLP's hidden rows of a 1024^2 image. Where the Triton passes' rotated rows stay in
    L2 (the attention outputs) or the rows are few, the row blocks' waits for their chunks cost what the bytes
    saved."""
    return m >= 2048 and k >= 8192


def groups_per_item(groups: int) -> int:
    """The groups a work item takes: 2 where they divide the row's (72 KB of shared memory: three programs an SM),
    else 3, else 1. (1 group makes 36 chunks a Klein hidden row block, 3 allow only two programs an SM: both
    slower.)"""
    return next(g for g in (2, 3, 1) if groups % g == 0)


if gluon is not None:
    @gluon_jit
    def bf16_rounded(x):  # f32 to the nearest bf16 (ties to even: cvt.rn), as f32
        return x.to(gl.bfloat16).to(gl.float32)

    @gluon_jit
    def radix4_bf16(z0, z1, z2, z3):
        """kernels/hadamard.radix4_rounded's butterfly on a group's four blocks z_a (the 1/2 of 1/sqrt(256) is in
        their operand), each output rounded to bf16 (held in f32); kernels/int8/quant_turned_hopper.py's too."""
        p, m, r, t = z0 + z1, z2 - z3, z0 - z1, z2 + z3
        return bf16_rounded(p + m), bf16_rounded(p - m), bf16_rounded(r + t), bf16_rounded(t - r)

    @gluon_jit
    def _ticket(work_ptr):
        return gl.atomic_add(work_ptr, 1, sem="relaxed", scope="gpu")

    @gluon_jit
    def _rotate_item(xs, hs, ready, phase, G: gl.constexpr, layout: gl.constexpr):
        """The item's groups rotated and rounded to bf16 in place of x in xs; returns each row's absmax."""
        BM: gl.constexpr = xs.shape[1]
        BQ: gl.constexpr = xs.shape[2]
        top = gl.zeros([BM], gl.float32, gl.SliceLayout(1, layout))
        zero = gl.zeros([BM, BQ], gl.float32, layout)
        for g in range(G):  # (not unrolled: registers for one group's values only)
            mbarrier.wait(ready.index(g), phase)
            z0 = warpgroup_mma(xs.index(4 * g), hs, zero, use_acc=False, is_async=True)
            z1 = warpgroup_mma(xs.index(4 * g + 1), hs, zero, use_acc=False, is_async=True)
            z2 = warpgroup_mma(xs.index(4 * g + 2), hs, zero, use_acc=False, is_async=True)
            z3 = warpgroup_mma(xs.index(4 * g + 3), hs, zero, use_acc=False, is_async=True)
            z0, z1, z2, z3 = warpgroup_mma_wait(num_outstanding=0, deps=(z0, z1, z2, z3))
            y0, y1, y2, y3 = radix4_bf16(z0, z1, z2, z3)
            top = gl.maximum(top, gl.max(gl.maximum(gl.maximum(gl.abs(y0), gl.abs(y1)),
                                                    gl.maximum(gl.abs(y2), gl.abs(y3))), axis=1))
            xs.index(4 * g).store(y0.to(gl.bfloat16))  # (the wgmmas read these blocks: they are done)
            xs.index(4 * g + 1).store(y1.to(gl.bfloat16))
            xs.index(4 * g + 2).store(y2.to(gl.bfloat16))
            xs.index(4 * g + 3).store(y3.to(gl.bfloat16))
        return top

    @gluon_jit
    def _plain_quant_kernel(x_desc, h_desc, q_ptr, s_ptr, pmax_ptr, count_ptr, work_ptr, M, K, CHUNKS, ITEMS,
                            G: gl.constexpr):
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BQ: gl.constexpr = x_desc.block_type.shape[1]
        acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BQ, 16])
        # The codes' tiles: 16 values (16 bytes of codes) a thread, a row's 64 across 4 threads.
        io: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4], warps_per_cta=[4, 1],
                                            order=[1, 0])
        xs = gl.allocate_shared_memory(gl.bfloat16, [4 * G, BM, BQ], x_desc.layout)
        hs = gl.allocate_shared_memory(gl.bfloat16, [BQ, BQ], h_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [G + 1, 1], mbarrier.MBarrierLayout())
        for g in gl.static_range(G + 1):
            mbarrier.init(ready.index(g), count=1)
        fence_async_shared()
        mbarrier.expect(ready.index(G), h_desc.block_type.nbytes)
        tma_load(h_desc, [0, 0], ready.index(G), hs)
        mbarrier.wait(ready.index(G), 0)
        rows_acc = gl.arange(0, BM, layout=gl.SliceLayout(1, acc))
        rows_io = gl.arange(0, BM, layout=gl.SliceLayout(1, io))
        cols_io = gl.arange(0, BQ, layout=gl.SliceLayout(0, io))
        item = _ticket(work_ptr + 1)
        phase = item * 0  # (a tensor: it changes in the loop)
        while item < ITEMS:
            block = item // CHUNKS
            chunk = item - block * CHUNKS
            off_m = block * BM
            c0 = chunk * (4 * G * BQ)
            for g in gl.static_range(G):  # (zeros past M)
                mbarrier.expect(ready.index(g), 4 * x_desc.block_type.nbytes)
                for a in gl.static_range(4):
                    tma_load(x_desc, [off_m, c0 + (4 * g + a) * BQ], ready.index(g), xs.index(4 * g + a))
            top = _rotate_item(xs, hs, ready, phase, G, acc)
            gl.store(pmax_ptr + chunk * M + off_m + rows_acc, top, mask=off_m + rows_acc < M)
            cta_barrier()  # every thread's partial maxima (and bf16 rows) stored before the count says so
            gl.atomic_add(count_ptr + block, 1, sem="release", scope="gpu")
            while gl.atomic_add(count_ptr + block, 0, sem="acquire", scope="gpu") < CHUNKS:
                pass
            # The next ticket, under the codes: taken once this item waits for nothing (a program holding two of a
            # row block's tickets, one to be done after the other, would wait for itself).
            after = _ticket(work_ptr + 1)
            rm = off_m + rows_io
            amax = gl.zeros([BM], gl.float32, gl.SliceLayout(1, io))
            for c in range(CHUNKS):
                amax = gl.maximum(amax, gl.load(pmax_ptr + c * M + rm, mask=rm < M, other=0.0, cache_modifier=".cg"))
            if gl.atomic_add(count_ptr + block, 1, sem="relaxed", scope="gpu") == 2 * CHUNKS - 1:
                gl.atomic_xchg(count_ptr + block, 0, sem="relaxed", scope="gpu")  # every sibling has read the count
            s = gl.maximum(gl.div_rn(amax, 127.0), 1e-30)
            if chunk == 0:
                gl.store(s_ptr + rm, s, mask=rm < M)
            inverse = gl.expand_dims(gl.div_rn(1.0, bf16_rounded(s)), 1)  # kernels/int8/codes.py's product
            at = gl.expand_dims(rm.to(gl.int64) * K + c0, 1) + gl.expand_dims(cols_io, 0)
            inside = gl.expand_dims(rm < M, 1)
            for j in range(4 * G):
                code = bf16_rounded(xs.index(j).load(io).to(gl.float32) * inverse)
                code = gl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=r,r", [code], dtype=gl.float32,
                                                 is_pure=True, pack=1)
                code = gl.minimum(gl.maximum(code, -128.0), 127.0)
                gl.store(q_ptr + at + j * BQ, code.to(gl.int8), mask=inside)
            cta_barrier()  # every read of xs done before the next item's loads overwrite it
            fence_async_shared()
            phase ^= 1
            item = after
        if gl.atomic_add(work_ptr + 2, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) - 1:
            gl.atomic_xchg(work_ptr + 1, 0, sem="relaxed", scope="gpu")  # every program has taken its last ticket
            gl.atomic_xchg(work_ptr + 2, 0, sem="relaxed", scope="gpu")


def launch(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, groups: int | None = None,
           programs_per_sm: int = 4) -> bool:
    """Codes and scales of plain bf16 rows x [M, K] (`unusable` asked first); False where nothing ran (no counters
    during a CUDA graph's capture before any warm-up made them, or a build error: UNBUILT says why). groups: the
    groups an item takes (groups_per_item's by default); programs_per_sm: programs launched an SM (162 registers a
    thread allow 3 at once; the others start as those end, and find tickets or none: 4 were about 8% faster
    than 3 at Klein's hidden rows)."""
    m, k = x.shape
    g = groups or groups_per_item(k // GROUP)
    chunks = k // (GROUP * g)
    blocks = triton.cdiv(m, BLOCK_M)
    counters = kept(x.device, blocks + 3)  # [row blocks..., (unused), tickets, finished programs]
    if counters is None or not (codes.is_contiguous() and scales.is_contiguous()):
        return False
    programs = min(blocks * chunks, sm_count(x.device) * programs_per_sm)
    pmax = torch.empty(chunks, m, dtype=torch.float32, device=x.device)
    h = hadamard_bf16(BLOCK_Q, x.device, halved=True)
    try:
        _plain_quant_kernel[(programs,)](
            tma_descriptor(x, [BLOCK_M, BLOCK_Q], gl.bfloat16),
            tma_descriptor(h, [BLOCK_Q, BLOCK_Q], gl.bfloat16), codes, scales, pmax, counters,
            counters[blocks:], m, k, chunks, blocks * chunks, G=g, num_warps=4, enable_fp_fusion=False)
    except (triton.compiler.errors.CompilationError, triton.runtime.errors.OutOfResources, TypeError,
            AttributeError) as e:
        UNBUILT.append(f"Triton {triton.__version__}: {type(e).__name__}: {(str(e).strip() or '-').splitlines()[-1]}")
        return False
    return True
