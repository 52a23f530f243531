"""The Triton kernels whose branches the interpreter cannot type-check, lowered to Triton IR for the H200 (sm_90)
on this GPU-less host (tests/kernels/sm90_builds.py): Triton's frontend rejects what the CPU interpreter runs
happily (an `if` on a runtime value whose branches give one variable two shapes failed only on the device).
Lowering, not running: no GPU needed. The tests' interpreter mode replaces triton.jit, so the lowering runs in a
child Python without it (this file's main)."""
import json
import subprocess
import sys

import pytest


def lower_all() -> dict:
    """case id -> "ok" or the frontend's error (the child's work); the last case must fail (the check can fail)."""
    import triton
    import triton.language as tl
    from sm90_builds import frontend_cases, lower

    @triton.jit
    def two_shapes(x_ptr, flag, BLOCK: tl.constexpr):
        if flag > 0:
            v = tl.load(x_ptr + tl.arange(0, BLOCK))[None, :]
        else:
            v = tl.load(x_ptr + tl.arange(0, BLOCK)[:, None] + tl.arange(0, BLOCK)[None, :])
        tl.store(x_ptr + tl.arange(0, BLOCK)[:, None] + tl.arange(0, BLOCK)[None, :], v)

    results = {}
    cases = {**frontend_cases(), "two shapes (must fail)": (two_shapes, {"x_ptr": "*fp32", "flag": "i32"},
                                                             {"BLOCK": 16}, {})}
    for name, (kernel, signature, constants, _) in cases.items():
        try:
            results[name] = "ok" if "tt.store" in lower(kernel, signature, constants) else "no store in the IR"
        except triton.compiler.errors.CompilationError as e:
            results[name] = str(e).splitlines()[-1]
    return results


@pytest.fixture(scope="module")
def lowered() -> dict:
    pytest.importorskip("triton.backends.nvidia.compiler")
    from conftest import compiler_env  # (not at the top: the child runs this file with Triton compiling)
    env = compiler_env()
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])


def test_every_case_lowers(lowered):
    failed = {name: why for name, why in lowered.items() if why != "ok" and "must fail" not in name}
    assert not failed, failed
    # int8_linear forms x loads, gated with an addend, SwiGLU turned, GELU turned (whole and quarters), wide, tail
    # splits, quantizers, rows_norm_rope's norms and its angles by axis (each in blocks and a row at once; by pairs
    # with 3 and 4 axes), the attention gates' two passes at two spans, the group norm's channels-last kernel at two
    # group widths, the channel RMS norm, the whole-rows pass walking the rows (gated, turned), codes, the bad one
    assert len(lowered) == 16 + 1 + 1 + 2 + 2 + 4 + 10 + 2 * (3 + 1) + (3 + 2) + 4 + 2 + 1 + 2 + 1 + 1


def test_the_check_can_fail(lowered):
    assert lowered["two shapes (must fail)"] != "ok"


if __name__ == "__main__":
    print(json.dumps(lower_all()))
