"""Kernel tests: Triton's CPU interpreter when there is no GPU, and the device the kernels run on.

TRITON_INTERPRET must be set before a kernel module decorates its kernels (triton.jit reads it then);
pytest imports this file before the test modules of this folder, and nothing outside kernels/ imports
Triton. On a GPU machine the same small-shape tests run compiled, beside the `gpu`-marked ones at real shapes.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Every conftest.py outside a package imports as the module "conftest"; test files collected after this
# folder that do `from conftest import rel_err` find this one, so it re-exports tests/conftest.py's names.
_spec = importlib.util.spec_from_file_location("swiftdit_tests_conftest",
                                               Path(__file__).parents[1] / "conftest.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
ROOT, COMFYUI_TREE, rel_err = _shared.ROOT, _shared.COMFYUI_TREE, _shared.rel_err
assert_within_one_bf16_step = _shared.assert_within_one_bf16_step
interpreted_only, attention_8bit_launches = _shared.interpreted_only, _shared.attention_8bit_launches

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


# The start of a child Python that builds a Gluon kernel for the H200 on this host (compiler_env's): the compiler's
# entry points, and stand-ins for tensors (what a tensor descriptor reads of its tensor: a 16-byte-aligned base of a
# dtype).
GLUON_BUILD = """
import json, re, torch
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import triton
class Codes:
    dtype = torch.int8
    @staticmethod
    def data_ptr():
        return 0
class Rows(Codes):
    dtype = torch.bfloat16
class Residual(Codes):
    dtype = torch.float32
"""


def compiler_env() -> dict:
    """The environment of a child Python that builds kernels for a GPU on this host: Triton compiling, not
    interpreted (the interpreter replaces triton.jit), the repository and this folder (sm90_builds) importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    return env


def gluon_builds(script: str) -> dict:
    """What a build script (GLUON_BUILD + its own lines) prints last as JSON, run in a child Python that compiles
    (compiler_env); skipped where this Triton has no Gluon."""
    pytest.importorskip("triton.experimental.gluon")
    done = subprocess.run([sys.executable, "-c", script], env=compiler_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
