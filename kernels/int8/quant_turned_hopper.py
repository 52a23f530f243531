"""kernels/int8/quant_turned.py's turned rows on Hopper (Gluon), the rest of the rotation in each thread's registers:
rows whose v was turned (H_16 by two radix-4 butterflies, a thread holding 16 contiguous columns), and hidden rows
(d0 by one, a thread holding 8).

Issue 4. The same math as int8_quant_turned's docstring: z_a = t_a (I_4 (x) H_16 / 2), y_s = bf16(sum_a H4[a, s] z_a),
then the row scales and codes. Triton's kernel there takes H_16 on the matrix cores: its loads hold 8 values a thread,
so the digit of columns 4 and 8 lies across threads, and the product's operands go through shared memory (9 layout
conversions in its sm_90 build; the same butterflies written in Triton need 34). Here a BlockedLayout gives each thread
16 contiguous columns (two 16-byte loads), so both digits of H_16 (H_16 = (H4 / 2) (x) (H4 / 2)) are a thread's own
registers: splits and joins, no data moved between threads. A program takes one row: its groups along the layout's
rows, each 64-column block of a group as one tensor. f32 sums in another order than the product's, so a value within
their rounding of a bf16 midpoint may round the other way: codes are checked against the float64 rotation as the
Triton kernel's are (tests/kernels/test_int8_quant_turned.py). GPU only (Hopper, Gluon), else `unusable` says why
and int8_quant_turned's Triton kernel runs.
Rows of any length (launch_long): hidden rows (TURNED "hidden": UP's SwiGLU epilogue took d2 and d1), z_a = t_a
(I_16 (x) H4 / 2), the digit d0 in each thread's 8 contiguous columns, or v-turned rows (UP's GELU epilogue took
d2) with d1 and d0 in a thread's 16, then the radix-4 step. A program takes a row by chunks of 4 groups a warp (8
for v; the next chunk's loads issued before this one's butterflies); the rotated bf16 values wait in shared memory
(K x 2 bytes) until the row's absmax is known, each thread reading back what it wrote. (No shared memory, the
codes loop loading the row again from L2 and rotating it again, was about 30% slower on the H200.)
"""
from __future__ import annotations

import os

import torch

from ..gluon_builds import build_failure
from ..jit import gluon_jit

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from .hopper_epilogues import h4_halved_pair
    from .quant_hopper import bf16_rounded, radix4_bf16
except (ImportError, AttributeError):  # a Triton without Gluon (before 3.5), or with another Gluon
    gluon = None

GROUP, BLOCK = 256, 64  # (the kernel's own constexprs below: jit functions read no plain globals)
UNBUILT: list[str] = []  # why this Triton could not build the kernel (Gluon's API moves between releases)


def unusable(t: torch.Tensor, turned: str = "v", long: bool = False) -> str | None:
    """None when a kernel here can take the turned rows t [M, K] (contiguous bf16, K a multiple of 256, checked by
    the caller; turned: quant_turned.TURNED's key; long: by launch_long, as hidden rows always are), else why not
    (the rows asked first, so that the CPU's tests reach those answers too)."""
    if turned == "hidden" or long:  # a row's rotated values wait in shared memory
        if t.shape[1] * 2 > 192 * 1024:
            return "a row's rotated values larger than shared memory"
    elif (groups := t.shape[1] // GROUP) * 16 < 15 * (1 << (groups - 1).bit_length()):
        # The layout's rows are a power of two of groups, the rest masked: on the H200 15 of 16 (Z-Image's
        # 3840) beat Triton's kernel, 12 of 16 (3072) lost to it.
        return "a row's groups more than 1/16 short of a power of two (Triton's kernel is faster there)"
    if gluon is None or UNBUILT or os.environ.get("TRITON_INTERPRET") == "1":
        return "off, no Gluon, unbuilt or interpreted"
    if not t.is_cuda or torch.cuda.get_device_capability(t.device) != (9, 0):
        return "not a Hopper GPU"
    return None


if gluon is not None:
    @gluon_jit
    def _h4_halved_last(x):
        """(H4 / 2) along the last axis (of 4) of x [R, 4, 4, 4] (the axis' two bits: h4_halved_pair's)."""
        return gl.reshape(h4_halved_pair(gl.reshape(x, [x.shape[0], 4, 4, 2, 2])), x.shape)

    @gluon_jit
    def _d1_d0_turned(x):
        """z_a of one 64-column block of each group x [groups, 64], whose layout gives each thread 16 contiguous
        columns: (H4 / 2) along columns' bits 0-1, then 2-3, halved."""
        layout: gl.constexpr = x.type.layout
        x = _h4_halved_last(gl.reshape(x.to(gl.float32), [x.shape[0], 4, 4, 4]))
        x = gl.permute(_h4_halved_last(gl.permute(x, [0, 1, 3, 2])), [0, 1, 3, 2])
        return gl.convert_layout(gl.reshape(x, [x.shape[0], 64]), layout) * 0.5  # (the same registers: no moves)

    @gluon_jit
    def _block_z(t_ptr, at, inside):
        return _d1_d0_turned(gl.load(t_ptr + at, mask=inside, other=0.0))

    @gluon_jit
    def _store_codes(q_ptr, at, inside, y, r):
        code = (y * r).to(gl.bfloat16).to(gl.float32)
        code = (code + 12582912.0) - 12582912.0  # rint, ties to even (1.5 x 2^23: no fraction bits left)
        gl.store(q_ptr + at, gl.minimum(gl.maximum(code, -128.0), 127.0).to(gl.int8), mask=inside)

    @gluon_jit
    def _turned_codes_hopper_kernel(t_ptr, q_ptr, s_ptr, K, GROUPS_P2: gl.constexpr):
        GROUP: gl.constexpr = 256
        BLOCK: gl.constexpr = 64
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4],
                                                warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
        row = gl.program_id(0)
        g = gl.arange(0, GROUPS_P2, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, layout))
        # [groups, 64]: block a of group g at column g 256 + a 64 + c of the row
        at = row.to(gl.int64) * K + (gl.expand_dims(g * GROUP, 1) + gl.expand_dims(c, 0))
        inside = gl.expand_dims(g < K // GROUP, 1) & gl.expand_dims(c < BLOCK, 0)
        z0 = _block_z(t_ptr, at, inside)
        z1 = _block_z(t_ptr, at + BLOCK, inside)
        z2 = _block_z(t_ptr, at + 2 * BLOCK, inside)
        z3 = _block_z(t_ptr, at + 3 * BLOCK, inside)
        y0, y1, y2, y3 = radix4_bf16(z0, z1, z2, z3)
        top = gl.maximum(gl.maximum(gl.abs(y0), gl.abs(y1)), gl.maximum(gl.abs(y2), gl.abs(y3)))
        s = gl.maximum(gl.div_rn(gl.max(gl.max(top, axis=1), axis=0), 127.0), 1e-30)
        gl.store(s_ptr + row, s)
        reciprocal = gl.div_rn(1.0, bf16_rounded(s))  # the quotient as a product: kernels/int8/codes.py's argument
        _store_codes(q_ptr, at, inside, y0, reciprocal)
        _store_codes(q_ptr, at + BLOCK, inside, y1, reciprocal)
        _store_codes(q_ptr, at + 2 * BLOCK, inside, y2, reciprocal)
        _store_codes(q_ptr, at + 3 * BLOCK, inside, y3, reciprocal)

    @gluon_jit
    def _d0_turned(x):
        """(H4 / 2) along digit d0 (columns' bits 0-1) of x [CH, 64], whose layout gives each thread 8 contiguous
        columns: splits and joins of its own registers, halved (the operand's 1/2: exact)."""
        layout: gl.constexpr = x.type.layout
        turned = _h4_halved_last(gl.reshape(x.to(gl.float32), [x.shape[0], 4, 4, 4]))
        return gl.convert_layout(gl.reshape(turned, [x.shape[0], 64]), layout) * 0.5

    @gluon_jit
    def _hidden_chunk(t_ptr, at, G, g0, g, c):
        """The loads of one chunk: a group's four 64-column blocks [CH, 64] (zeros past the row's G groups)."""
        inside = gl.expand_dims(g0 + g < G, 1) & gl.expand_dims(c < 64, 0)
        return (gl.load(t_ptr + at, mask=inside, other=0.0), gl.load(t_ptr + at + 64, mask=inside, other=0.0),
                gl.load(t_ptr + at + 128, mask=inside, other=0.0), gl.load(t_ptr + at + 192, mask=inside, other=0.0))

    @gluon_jit
    def _rest_turned(x, TURNED_V: gl.constexpr):
        """z_a of a chunk's block x [CH, 64]: d1 and d0 (v turned) or d0 (hidden)."""
        if TURNED_V:
            return _d1_d0_turned(x)
        return _d0_turned(x)

    @gluon_jit
    def _long_codes_hopper_kernel(t_ptr, q_ptr, s_ptr, K, CHUNKS: gl.constexpr, CH: gl.constexpr,
                                  TURNED_V: gl.constexpr):
        # a thread's contiguous columns hold the digits it turns: 16 (d1, d0) for v, 8 (d0) for hidden rows
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16 if TURNED_V else 8],
                                                threads_per_warp=[8 if TURNED_V else 4, 4 if TURNED_V else 8],
                                                warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
        ys = gl.allocate_shared_memory(gl.bfloat16, [4 * CHUNKS, CH, 64],
                                       gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        G = K // 256
        g = gl.arange(0, CH, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
        at = gl.program_id(0).to(gl.int64) * K + (gl.expand_dims(g * 256, 1) + gl.expand_dims(c, 0))
        x0, x1, x2, x3 = _hidden_chunk(t_ptr, at, G, 0, g, c)
        top = gl.zeros([CH, 64], gl.float32, layout)
        for i in range(CHUNKS):
            n0, n1, n2, n3 = _hidden_chunk(t_ptr, at + (i + 1) * (CH * 256), G, (i + 1) * CH, g, c)  # (under these)
            z0, z1, z2, z3 = (_rest_turned(x0, TURNED_V), _rest_turned(x1, TURNED_V), _rest_turned(x2, TURNED_V),
                              _rest_turned(x3, TURNED_V))
            y0, y1, y2, y3 = radix4_bf16(z0, z1, z2, z3)
            top = gl.maximum(top, gl.maximum(gl.maximum(gl.abs(y0), gl.abs(y1)), gl.maximum(gl.abs(y2), gl.abs(y3))))
            ys.index(4 * i).store(y0.to(gl.bfloat16))
            ys.index(4 * i + 1).store(y1.to(gl.bfloat16))
            ys.index(4 * i + 2).store(y2.to(gl.bfloat16))
            ys.index(4 * i + 3).store(y3.to(gl.bfloat16))
            x0, x1, x2, x3 = n0, n1, n2, n3
        s = gl.maximum(gl.div_rn(gl.max(gl.max(top, axis=1), axis=0), 127.0), 1e-30)
        gl.store(s_ptr + gl.program_id(0), s)
        reciprocal = gl.div_rn(1.0, bf16_rounded(s))  # the quotient as a product: kernels/int8/codes.py's argument
        for i in range(CHUNKS):  # (each thread reads back the values it stored: no barrier)
            inside = gl.expand_dims(i * CH + g < G, 1) & gl.expand_dims(c < 64, 0)
            for a in gl.static_range(4):
                y = ys.index(4 * i + a).load(layout).to(gl.float32)
                _store_codes(q_ptr, at + (i * (CH * 256) + a * 64), inside, y, reciprocal)


def launch_long(t: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, turned: str = "hidden",
                num_warps: int = 2, groups_per_warp: int | None = None) -> bool:
    """Codes and scales of turned rows t [M, K] (contiguous bf16, K a multiple of 256) of any length, a row a
    program by chunks, as `launch`. num_warps, groups_per_warp: a chunk's shape (by default 4 groups a warp for hidden
    rows, a thread's 8 columns of each block; 8 for v, 16 columns: the layout's rows). Two warps were the best of 1,
    2 and 4 on the H200 at every hidden-row shape tried (tied with 4 at few rows)."""
    m, k = t.shape
    chunk = num_warps * (groups_per_warp or (8 if turned == "v" else 4))
    return _built(lambda: _long_codes_hopper_kernel[(m,)](
        t, codes, scales, k, CHUNKS=triton.cdiv(k // GROUP, chunk), CH=chunk, TURNED_V=turned == "v",
        num_warps=num_warps, enable_fp_fusion=False))


def _built(run) -> bool:
    """run() (a launch); False where this Triton cannot build the kernel (UNBUILT says why; the caller runs the
    Triton kernels)."""
    why = build_failure(run)
    if why is not None:
        UNBUILT.append(why)
    return why is None


def launch(t: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, num_warps: int = 2) -> bool:
    """Codes and scales of turned rows t [M, K] (contiguous bf16, K a multiple of 256) into codes and scales; True,
    or False where this Triton cannot build the kernel (UNBUILT says why; the caller runs the Triton kernel). The
    caller asks `unusable` first. num_warps 2: a warp covers 8 groups, so two cover a row of 16 (K 3840 and 4096)."""
    m, k = t.shape
    return _built(lambda: _turned_codes_hopper_kernel[(m,)](
        t, codes, scales, k, GROUPS_P2=triton.next_power_of_2(k // GROUP), num_warps=num_warps,
        enable_fp_fusion=False))
