"""kernels/int8_linear_gluon.py: built for the H200 in CI (no interpreter runs Gluon; the build must keep one
integer wgmma group in flight, what the kernel is for), and on the GPU equal to int8_linear's reference bit for bit
(its SwiGLU form equal to int8_linear's, its gated form to the reference; pytest -m gpu)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import assert_within_one_bf16_step

from kernels.int8_linear import int8_linear, reference

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, re, torch
from kernels import int8_linear_gluon as kg
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import triton
class Codes:  # what a tensor descriptor reads of its tensor: a 16-byte-aligned int8 base
    dtype = torch.int8
    @staticmethod
    def data_ptr():
        return 0
t = kg.TILE
class Rows(Codes):
    dtype = torch.bfloat16
class Residual(Codes):
    dtype = torch.float32
desc = lambda base, rows, block, dtype: mangle_type(kg.TensorDescriptor(base, [rows, 3840], [3840, 1], block,
    gl.NVMMASharedLayout.get_default_for(block, dtype)))
sig = {"a_desc": desc(Codes, 4608, [t["BLOCK_M"], t["BLOCK_K"]], gl.int8),
       "b_desc": desc(Codes, 3840, [t["BLOCK_N"], t["BLOCK_K"]], gl.int8),
       "sx_ptr": "*fp32", "sw_ptr": "*fp32", "bias_ptr": "*bf16", "gate_ptr": "*fp32", "map_ptr": "*i32", "M": "i32",
       "N": "i32", "K": "i32"}
found = {}
half = [t["BLOCK_M"], t["BLOCK_N"] // 2]  # the output's TMA box: half the tile's columns
for name, form, one_row, out in (("bf16 rows", 0, False, desc(Rows, 4608, half, gl.bfloat16)),
                                 ("swiglu", 2, False, desc(Rows, 4608, half, gl.bfloat16)),
                                 ("gated, one gate row", 1, True, desc(Residual, 4608, half, gl.float32)),
                                 ("gated, a row map", 1, False, desc(Residual, 4608, half, gl.float32))):
    consts = {"HAS_BIAS": True, "FORM": form, "ONE_GATE_ROW": one_row, "GROUP_M": t["GROUP_M"],
              "STAGES": 3 if form == 1 else 4, "num_warps": t["num_warps"]}
    src = GluonASTSource(kg._int8_linear_gluon_kernel, {**sig, "out_desc": out, **{k: "constexpr" for k in consts}},
                         consts)
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": t["num_warps"],
                                                                           "enable_fp_fusion": False})
    ptx = built.asm["ptx"]
    found[name] = [sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))),
                   re.findall(r"wgmma.wait_group.sync.aligned\\s+(\\d+)", ptx), built.metadata.shared]
from kernels import qkv_rope_linear_gluon as kq
box = [1, t["BLOCK_M"], t["BLOCK_N"]]
qkv_out = mangle_type(kg.TensorDescriptor(Rows, [3, 4608, 3840], [4608 * 3840, 3840, 1], box,
                                          gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16)))
consts = {"HAS_BIAS": True, "HAS_NORM": True, "D": 128, "GROUP_M": t["GROUP_M"], "STAGES": 3,
          "num_warps": t["num_warps"]}
qkv_sig = {"a_desc": sig["a_desc"], "b_desc": desc(Codes, 11520, [t["BLOCK_N"], t["BLOCK_K"]], gl.int8),
           "out_desc": qkv_out, "sx_ptr": "*fp32", "sw_ptr": "*fp32", "bias_ptr": "*bf16", "nw_ptr": "*fp32",
           "cos_ptr": "*fp32", "sin_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "HD": "i32", "eps": "fp32"}
src = GluonASTSource(kq._qkv_rope_gluon_kernel, {**qkv_sig, **{k: "constexpr" for k in consts}}, consts)
built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": t["num_warps"],
                                                                       "enable_fp_fusion": False})
ptx = built.asm["ptx"]
found["qkv + head norm + rotary"] = [sorted(set(re.findall(r"wgmma.mma_async[.\\w]*", ptx))),
                                     re.findall(r"wgmma.wait_group.sync.aligned\\s+(\\d+)", ptx),
                                     built.metadata.shared]
print(json.dumps(found))
"""


def test_builds_for_the_h200_with_an_integer_mma_in_flight():
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    for form, (instructions, waits, shared) in json.loads(child.stdout.strip().splitlines()[-1]).items():
        assert instructions == ["wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"], form
        assert "1" in waits, form  # the loop leaves one MMA group in flight (Triton's own int8 loop waits for 0)
        assert shared <= 227 * 1024, form  # the H200's shared memory a block (the ring and the output tile)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
# One row, edges of every tile, a K tail, Z-Image's out and w2 shapes; with and without a bias.
@pytest.mark.parametrize("m,n,k,with_bias", [(1, 32, 64, True), (37, 80, 64, False), (40, 40, 160, True),
                                             (300, 520, 1040, False), (4608, 3840, 3840, True),
                                             (4608, 3840, 10240, False)])
@pytest.mark.parametrize("tile", [{}, {"PERSISTENT": False}, {"STAGES": 2}, {"BLOCK_N": 128, "STAGES": 5}])
def test_equals_the_reference(m, n, k, with_bias, tile):
    from kernels.int8_linear_gluon import int8_linear_gluon, int8_linear_gluon_gated
    g = torch.Generator().manual_seed(m + n + k)
    q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).cuda()
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).cuda()
    s_x, s_w = (torch.rand(m, generator=g) * 0.02).cuda(), (torch.rand(n, generator=g) * 0.002).cuda()
    bias = torch.randn(n, generator=g).to("cuda", torch.bfloat16) if with_bias else None
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    int8_linear_gluon(q, s_x, w, s_w, bias, out=out, tile=tile)
    assert torch.equal(out, reference(q, s_x, w, s_w, bias))
    # SwiGLU of the column pairs: as int8_linear's SwiGLU epilogue, within a bf16 step of the reference (exp's ulp).
    half = int8_linear_gluon(q, s_x, w, s_w, bias, tile=tile, swiglu=True)
    assert_within_one_bf16_step(half, reference(q, s_x, w, s_w, bias, swiglu=True))
    assert torch.equal(half, int8_linear(q, s_x, w, s_w, bias, swiglu=True))
    # The gated residual, bit for bit: one gate row, two in runs (rows below 20 on the first), three at random.
    for rows, row_map in ((1, torch.zeros(m, dtype=torch.long)), (2, (torch.arange(m) >= 20).long()),
                          (3, torch.randint(0, 3, (m,), generator=g))):
        gate, residual = torch.randn(rows, n, generator=g).cuda(), torch.randn(m, n, generator=g).cuda()
        expected = reference(q, s_x, w, s_w, bias, residual=residual.clone(), gate=gate, row_map=row_map.cuda())
        int8_linear_gluon_gated(q, s_x, w, s_w, bias, residual=residual, gate=gate, row_map=row_map.cuda(), tile=tile)
        assert torch.equal(residual, expected), rows


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m,heads,group", [(37, 4, 0), (300, 6, 100), (4608, 30, 0)])
@pytest.mark.parametrize("normed", [True, False])
def test_qkv_rope_equals_the_triton_kernel(m, heads, group, normed):
    """kernels/qkv_rope_linear_gluon.py against qkv_rope_linear (the same math, the same roundings): equal, or
    within one bf16 step where the RMS sums run in another order; v bit for bit."""
    from test_qkv_rope_linear import operands

    from kernels.qkv_rope_linear import qkv_rope_linear
    from kernels.qkv_rope_linear_gluon import qkv_rope_linear_gluon
    ops = operands(m, heads=heads, head=128, k=3840 if m == 4608 else 256, seed=m, device="cuda")
    if not normed:
        ops["q_weight"] = ops["k_weight"] = None
    got = qkv_rope_linear_gluon(**ops, group=group)
    want = qkv_rope_linear(**ops, group=group)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert_within_one_bf16_step(a, b)
    assert torch.equal(got[2], want[2])
