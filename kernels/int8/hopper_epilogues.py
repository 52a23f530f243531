"""The epilogues of kernels/int8/linear_hopper.py (Gluon): the gated residual and the fused QKV's head math, each on
a consumer's 128 x 128 tile y = bf16-or-f32 values of q w^T s_x s_w + bias, while the other consumer's products run.

Issue 4. Gated: residual[rows, cols] += gate[row_map[row], cols] * (y (+ addend[rows, cols], bf16)), by column halves
through the consumer's box (an addend's half passes through it before each residual half); where asked, each updated
half's row sums and centred squares (the next norm's parts: kernels/int8/row_stats.py, runs of 64 columns), so the next
block's norm needs no pass over the residual.
QKV: for q and k, RMS over each head (x gain), then the split-half rotary: (a, b) -> (a cos - b sin, b cos + a sin)
for pair (j, j + R) of a head of D = 2 R. Its cos and sin come from the tables [M, R] or, where the caller has the
angles' factors, are made here from angle[row, j] = f32(positions[row, axis(j)] x freq[j]), axis(j) the axis whose
columns hold j and freq[j] = hi[j] + lo[j] the float64 frequency as two f32 (rotary_angles'): the product's rounding
error by an fma, p = P hi, angle = p + (fma(P, hi, -p) + P lo), rounds to the tables' f32 angle (checked equal on
Z-Image's and FLUX.3's positions to 1023). Reduced by whole turns, 2 pi = 6.28125 + 1.9353071795864769e-3 (the first
part exact in a product with any turn count below 2^15), then cos.approx and sin.approx (absolute error about 1e-6
on [-pi, pi]): cos and sin within about 1e-6 of the tables'. Why: the tables' 128 loaded values a thread, with the
head math's, spilled 664 bytes a thread; made here, none (the QKV 10-14% faster on the H200).
"""
from __future__ import annotations

import torch

from ..jit import gluon_jit

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    # TMA's copies: async_load / async_store from Triton 3.7 (the H200's 3.6 has only the long names).
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None


def axis_ends(ends) -> int:
    """The constexpr of the angles' factors: 1 << 24 | the first columns of axes 1, 2, 3 (8 bits each)."""
    if len(ends) != 3 or not all(0 <= e < 256 for e in ends) or list(ends) != sorted(ends):
        raise ValueError(f"rotary axes' first columns must be 3 nondecreasing values below 256, got {ends}")
    return 1 << 24 | ends[0] | ends[1] << 8 | ends[2] << 16


def angles_reference(positions: torch.Tensor, freqs: torch.Tensor, ends) -> torch.Tensor:
    """angle[row, j] = f32(positions[row, axis(j)] x (hi[j] + lo[j])), freqs = [hi; lo] [2, R]: the epilogue's
    angles, as plain torch (float64 holds the product exactly enough)."""
    axis = torch.bucketize(torch.arange(freqs.shape[1], device=freqs.device), torch.tensor(ends, device=freqs.device),
                           right=True)
    return (positions.double()[:, axis] * (freqs[0].double() + freqs[1].double())).float()


if gluon is not None:
    @gluon_jit
    def store_box(part, out_desc, out_tile, coords):
        """part to the output at coords through out_tile and TMA (clipped at the edges), once its last store left."""
        tma.store_wait(0)
        out_tile.store(part)
        fence_async_shared()
        tma_store(out_desc, coords, out_tile)

    @gluon_jit
    def fetch_box(res_desc, res_tile, fetched, off_m, col):
        """The residual's box at (off_m, col) into res_tile by TMA (`fetched` says when), once its last store left."""
        tma.store_wait(0)
        mbarrier.expect(fetched, res_desc.block_type.nbytes)
        tma_load(res_desc, [off_m, col], fetched, res_tile)

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.7 on; the H200's 3.6 has the private name
        @gluon_jit
        def addend_box(res_tile, add_desc):
            """The residual's box seen as the addend's (bf16, half its bytes): the two take turns in it."""
            return res_tile.reinterpret(gl.bfloat16, add_desc.block_type.shape, add_desc.layout)
    else:
        @gluon_jit
        def addend_box(res_tile, add_desc):
            return res_tile._reinterpret(gl.bfloat16, add_desc.block_type.shape, add_desc.layout)

    @gluon_jit
    def gated_epilogue(y, off_m, off_n, res_desc, res_tile, fetched, gate_ptr, map_ptr, add_desc, parts_ptr, M, N,
                       ONE_GATE_ROW: gl.constexpr, HAS_ADDEND: gl.constexpr, HAS_PARTS: gl.constexpr):
        """residual += gate[row_map] * (y + addend) by column halves through res_tile, the first half's addend (else
        its residual) asked for before the K loop. With an addend, each half's addend then its residual pass
        through the box: four phases a tile (their waits exposed, as DOWN's long K loop hides them). HAS_PARTS:
        each half's parts of the updated rows to parts_ptr [2, N / HALF, M]."""
        BLOCK_M: gl.constexpr = y.shape[0]
        HALF: gl.constexpr = y.shape[1] // 2
        halves = gl.split(gl.permute(gl.reshape(y, [BLOCK_M, 2, HALF]), [0, 2, 1]))
        if not ONE_GATE_ROW:
            rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, halves[0].type.layout))
            rows = gl.load(map_ptr + rm, mask=rm < M, other=0)
            lo = gl.min(gl.where(rm < M, rows, 1 << 30), axis=0)
            hi = gl.max(gl.where(rm < M, rows, -1), axis=0)
        for h in gl.static_range(2):
            part = halves[h]
            col = off_n + h * HALF
            if HAS_ADDEND:
                add_tile = addend_box(res_tile, add_desc)
                if h == 1:
                    fetch_box(add_desc, add_tile, fetched, off_m, col)
                mbarrier.wait(fetched, 0)
                part = part + add_tile.load(part.type.layout).to(gl.float32)
                fetch_box(res_desc, res_tile, fetched, off_m, col)
            elif h == 1:  # (the first half was asked for before the K loop)
                fetch_box(res_desc, res_tile, fetched, off_m, col)
            rn = col + gl.arange(0, HALF, layout=gl.SliceLayout(0, part.type.layout))
            if ONE_GATE_ROW:
                part = gl.expand_dims(gl.load(gate_ptr + rn, mask=rn < N, other=0.0), 0) * part
            else:  # the gate rows of the tile's rows (a packed sequence's runs: one or two), a vector each, each
                # multiplying its rows in place (a gathered [rows, columns] load held 64-bit addresses a value: spills)
                for g in range(lo, hi + 1):
                    vector = gl.expand_dims(gl.load(gate_ptr + g * N + rn, mask=rn < N, other=0.0), 0)
                    part = gl.where(gl.expand_dims(rows == g, 1), vector * part, part)
            mbarrier.wait(fetched, 1 if HAS_ADDEND else h)  # (two or four phases a tile)
            r = part + res_tile.load(part.type.layout)  # (the residual read last: fewer registers held)
            res_tile.store(r)
            fence_async_shared()
            tma_store(res_desc, [off_m, col], res_tile)
            if HAS_PARTS:  # (rows past M: masked; a half past N: none, N a multiple of HALF)
                rp = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, part.type.layout))
                sums = gl.sum(r, axis=1)
                centred = r - gl.expand_dims(sums * (1.0 / HALF), 1)  # (a power of two: the mean exact)
                at = (col // HALF) * M + rp
                gl.store(parts_ptr + at, sums, mask=(rp < M) & (col < N))
                gl.store(parts_ptr + (N // HALF) * M + at, gl.sum(centred * centred, axis=1), mask=(rp < M) & (col < N))

    @gluon_jit
    def _approx(x, op: gl.constexpr):  # one PTX instruction a value (cvt.rni, cos.approx, sin.approx)
        return gl.inline_asm_elementwise(op + ".f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)

    @gluon_jit
    def rotary_turns(pos_ptr, freq_ptr, rm, j, M, ANGLES: gl.constexpr):
        """cos and sin [BM, 1, R] of angle positions[row, axis(j)] x freq[j] (positions [M, 4], freq [2, R]: hi; lo;
        ANGLES: axis_ends), reduced by whole turns, then the MUFU's."""
        R: gl.constexpr = j.shape[0]
        jj = gl.expand_dims(j, 0)
        p0 = gl.expand_dims(gl.load(pos_ptr + rm * 4, mask=rm < M, other=0.0), 1)
        p1 = gl.expand_dims(gl.load(pos_ptr + rm * 4 + 1, mask=rm < M, other=0.0), 1)
        p2 = gl.expand_dims(gl.load(pos_ptr + rm * 4 + 2, mask=rm < M, other=0.0), 1)
        p3 = gl.expand_dims(gl.load(pos_ptr + rm * 4 + 3, mask=rm < M, other=0.0), 1)
        p = gl.where(jj < (ANGLES & 255), p0, gl.where(jj < ((ANGLES >> 8) & 255), p1,
                                                       gl.where(jj < ((ANGLES >> 16) & 255), p2, p3)))
        hi, lo = gl.expand_dims(gl.load(freq_ptr + j), 0), gl.expand_dims(gl.load(freq_ptr + R + j), 0)
        near = p * hi
        angle = near + (gl.fma(p, hi, -near) + p * lo)
        turns = _approx(angle * 0.15915494309189535, "cvt.rni.f32")
        r = (angle - turns * 6.28125) - turns * 1.9353071795864769e-3
        return gl.expand_dims(_approx(r, "cos.approx.ftz"), 1), gl.expand_dims(_approx(r, "sin.approx.ftz"), 1)

    @gluon_jit
    def turned_v(y):
        """Each 64 columns of the tile y [BM, BN] (bf16 values in f32, wgmma's accumulator layout) times (H4 / 2)
        (x) I_16: the top base-4 digit d of the column j = 16 d + e (qkv_rope_linear's turn_v). In that layout a
        thread holds columns 8 i + 2 t + b of its rows (t its lane mod 4), so d's two bits (4 and 5) lie in its own
        registers: out_s = sum / 2 - x_(3 - s) (H4 = ones - 2 antidiagonal), no data moved between threads. (The
        whole of H_64 so, its lower digits by warp shuffles, made the Klein QKV 19% slower on the H200: 802
        shuffles a tile.)"""
        BM: gl.constexpr = y.shape[0]
        BN: gl.constexpr = y.shape[1]
        x = h4_halved_pair(gl.permute(gl.reshape(y, [BM, BN // 64, 2, 2, 16]), [0, 1, 4, 2, 3]))  # [.., bit 5, bit 4]
        # y's own layout again: the same registers' columns, so no data moves (the build tests count shuffles)
        return gl.convert_layout(gl.reshape(gl.permute(x, [0, 1, 3, 4, 2]), [BM, BN]), y.type.layout)

    @gluon_jit
    def h4_halved_pair(x):
        """(H4 / 2) along a digit held in x's last two axes [.., 2 (its high bit), 2 (its low bit)]: out_s = sum / 2 -
        x_(3 - s) (H4 = ones - 2 antidiagonal), splits and joins of the registers holding x (turned_v,
        turned_hidden; kernels/int8/quant_turned_hopper.py's butterflies; quant_turned.turned_f32's sums)."""
        lo0, lo1 = gl.split(x)
        x0, x2 = gl.split(lo0)
        x1, x3 = gl.split(lo1)
        half = ((x0 + x1) + (x2 + x3)) * 0.5
        return gl.join(gl.join(half - x3, half - x1), gl.join(half - x2, half - x0))

    @gluon_jit
    def turned_hidden(act):
        """Each 64 columns of SwiGLU's f32 tile act [BM, BH] (int8_linear's turn_hidden) turned along digits d2, then
        d1 of j = 16 d2 + 4 d1 + d0 (quant_turned.turned_f32's order). act's column j comes from the accumulator's
        columns 2j and 2j + 1, which a thread holds at 8 i + 2 t (+1): j = 4 i + t, so j's bits 2-5, both digits,
        lie in its own registers, as d2 does for turned_v."""
        BM: gl.constexpr = act.shape[0]
        BH: gl.constexpr = act.shape[1]
        x = gl.reshape(act, [BM, BH // 64, 2, 2, 2, 2, 4])  # [.., d2 high, d2 low, d1 high, d1 low, d0]
        x = h4_halved_pair(gl.permute(x, [0, 1, 4, 5, 6, 2, 3]))  # [.., d1 high, d1 low, d0, d2 high, d2 low]
        x = h4_halved_pair(gl.permute(x, [0, 1, 5, 6, 4, 2, 3]))  # [.., d2 high, d2 low, d0, d1 high, d1 low]
        x = gl.reshape(gl.permute(x, [0, 1, 2, 3, 5, 6, 4]), [BM, BH])
        return gl.convert_layout(x, act.type.layout)  # (the same registers: the build tests count shuffles)

    @gluon_jit
    def qkv_epilogue(y, off_m, off_n, out_desc, out_tile, nw_ptr, cos_ptr, sin_ptr, M, HD, eps,
                     HAS_NORM: gl.constexpr, D: gl.constexpr, ANGLES: gl.constexpr, TURN_V: gl.constexpr):
        """qkv_rope_linear's head math on a tile of whole heads of q, k or v, into [3, M, heads D] by a 3-D TMA
        box."""
        BLOCK_N: gl.constexpr = y.shape[1]
        R: gl.constexpr = D // 2
        which = off_n // HD  # 0 q, 1 k, 2 v
        if which < 2:  # (each branch stores: the head math leaves its values in another layout than y's)
            # [BM, heads, 2 halves, R] -> each head's first and second half: n[j] and its rotary partner n[j + R].
            # (By row halves, one half's cos and sin rows held at a time, it spilled no registers but ran 7% slower.)
            a, b = gl.split(gl.permute(gl.reshape(y, [y.shape[0], BLOCK_N // D, 2, R]), [0, 1, 3, 2]))
            j = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(1, a.type.layout)))
            if HAS_NORM:
                ms = gl.div_rn(gl.sum(a * a, axis=2) + gl.sum(b * b, axis=2), D * 1.0)
                inv = gl.expand_dims(gl.div_rn(1.0, gl.sqrt_rn(ms + eps)), 2)
                a = (a * inv) * gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + j), 0), 1)
                b = (b * inv) * gl.expand_dims(gl.expand_dims(gl.load(nw_ptr + which * D + R + j), 0), 1)
            rm = off_m + gl.arange(0, y.shape[0], layout=gl.SliceLayout(1, gl.SliceLayout(1, a.type.layout)))
            if ANGLES:  # (cos_ptr, sin_ptr: the angles' positions and freqs)
                cos, sin = rotary_turns(cos_ptr, sin_ptr, rm, j, M, ANGLES)
            else:
                at = gl.expand_dims(rm * R, 1) + gl.expand_dims(j, 0)
                inside = gl.expand_dims(rm < M, 1) & gl.expand_dims(j < R, 0)  # (zeros past M: rows not stored)
                cos = gl.expand_dims(gl.load(cos_ptr + at, mask=inside, other=0.0), 1)
                sin = gl.expand_dims(gl.load(sin_ptr + at, mask=inside, other=0.0), 1)
            turned = gl.join(a * cos - b * sin, b * cos + a * sin)  # [BM, heads, R, 2]
            turned = gl.reshape(gl.permute(turned, [0, 1, 3, 2]), [1, y.shape[0], BLOCK_N]).to(gl.bfloat16)
            store_box(turned, out_desc, out_tile, [which, off_m, off_n - which * HD])
        else:  # v
            if TURN_V:
                y = turned_v(y)
            v = gl.reshape(y.to(gl.bfloat16), [1, y.shape[0], BLOCK_N])
            store_box(v, out_desc, out_tile, [2, off_m, off_n - 2 * HD])

