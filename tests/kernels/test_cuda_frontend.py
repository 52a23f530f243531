"""The Triton kernels whose branches the interpreter cannot type-check, lowered to Triton IR for the H200 (sm_90)
on this GPU-less host: Triton's frontend rejects what the CPU interpreter runs happily (an `if` on a runtime value
whose branches give one variable two shapes failed only on the device). Lowering, not running: no GPU needed. The
tests' interpreter mode replaces triton.jit, so the lowering runs in a child Python without it (this file's main)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cases() -> dict:
    """case id -> (kernel, signature, constants); triton.language as tl inside (imported by the caller)."""
    import triton.language as tl

    from kernels.int8_linear import _int8_linear_kernel
    from kernels.int8_quant import _codes_kernel, _rotate_kernel
    linear = {**{name: "*fp32" for name in ("sx_ptr", "sw_ptr", "bias_ptr", "down_ptr", "up_ptr", "out_ptr",
                                            "gate_ptr")},
              "q_ptr": "*i8", "w_ptr": "*i8", "map_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "R": "i32",
              "M_TUNE": "i32"}
    out = {}
    for form, one_row in ((0, False), (1, True), (1, False), (2, False)):
        for tma, persistent, subtile in ((True, True, True), (True, False, False), (False, False, False)):
            out[f"int8_linear form {form} one gate row {one_row} tma {tma} persistent {persistent}"] = (
                _int8_linear_kernel, linear,
                {"HAS_BIAS": True, "HAS_LORA": form == 0, "FORM": form, "ONE_GATE_ROW": one_row, "EVEN_K": True,
                 "LORA_DTYPE": tl.bfloat16, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "BLOCK_R": 16,
                 "GROUP_M": 8, "TMA": tma, "PERSISTENT": persistent, "SUBTILE": subtile})
    rotate = {"x_ptr": "*fp32", "stride_x": "i32", "w_ptr": "*fp32", "scale_ptr": "*fp32", "shift_ptr": "*fp32",
              "map_ptr": "*i32", "h_ptr": "*bf16", "stats_ptr": "*fp32", "stride_stats": "i32", "y_ptr": "*bf16",
              "gmax_ptr": "*fp32", "M": "i32", "K": "i32"}
    for norm, has_scale, act in ((2, 1, 0), (1, 2, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2)):
        for group in (256, 64):
            out[f"rotate norm {norm} scale {has_scale} act {act} group {group}"] = (
                _rotate_kernel, {**rotate, "x_ptr": "*bf16" if act else "*fp32"},
                {"NORM": norm, "HAS_WEIGHT": norm == 1, "HAS_SCALE": has_scale, "HAS_SHIFT": has_scale > 0,
                 "ACT": act, "X_BF16": act > 0, "G": group, "SPLIT": 4 if group == 256 else 1, "BLOCK_M": 64,
                 "DOT_DTYPE": tl.bfloat16})
    out["codes"] = (_codes_kernel, {"y_ptr": "*bf16", "gmax_ptr": "*fp32", "q_ptr": "*i8", "s_ptr": "*fp32",
                                    "M": "i32", "K": "i32"},
                    {"GROUPS": 15, "GROUPS_P2": 16, "BLOCK_M": 16, "BLOCK_K": 256})
    return out


def lower_all() -> dict:
    """case id -> "ok" or the frontend's error (the child's work); the last case must fail (the check can fail)."""
    import triton
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    @triton.jit
    def two_shapes(x_ptr, flag, BLOCK: tl.constexpr):
        if flag > 0:
            v = tl.load(x_ptr + tl.arange(0, BLOCK))[None, :]
        else:
            v = tl.load(x_ptr + tl.arange(0, BLOCK)[:, None] + tl.arange(0, BLOCK)[None, :])
        tl.store(x_ptr + tl.arange(0, BLOCK)[:, None] + tl.arange(0, BLOCK)[None, :], v)

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({})
    results = {}
    all_cases = {**cases(), "two shapes (must fail)": (two_shapes, {"x_ptr": "*fp32", "flag": "i32"}, {"BLOCK": 16})}
    for name, (kernel, signature, constants) in all_cases.items():
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        source = ASTSource(kernel, {**signature, **{c: "constexpr" for c in constants}}, constants)
        try:
            module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                                    backend.get_module_map(), context)
            results[name] = "ok" if "tt.store" in str(module) else "no store in the IR"
        except triton.compiler.errors.CompilationError as e:
            results[name] = str(e).splitlines()[-1]
    return results


@pytest.fixture(scope="module")
def lowered() -> dict:
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])


def test_every_case_lowers(lowered):
    failed = {name: why for name, why in lowered.items() if why != "ok" and "must fail" not in name}
    assert not failed, failed
    assert len(lowered) == 1 + 12 + 10 + 1


def test_the_check_can_fail(lowered):
    assert lowered["two shapes (must fail)"] != "ok"


if __name__ == "__main__":
    print(json.dumps(lower_all()))
