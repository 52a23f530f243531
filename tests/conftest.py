"""Shared test fixtures: the ComfyUI v0.3.75 tree as an in-process oracle, tolerances, relative error."""
import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's CPU interpreter (how CI tests them). triton.jit reads this when a
# kernel module is imported, which may happen in any test folder: set it here, before anything imports kernels/.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A test that launches Triton kernels on CPU tensors needs that interpreter; on a GPU machine its CUDA twin runs.
interpreted_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="Triton kernels on CPU tensors: only under Triton's interpreter")

ROOT = Path(__file__).resolve().parents[1]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The torchvision wheel beside CPU torch is a CUDA build: before anything (transformers, ComfyUI) imports it,
# the host launcher's one-shot shim defines the ops its fake registrations need (reference/comfyui_host.md 3).
if "torchvision" not in sys.modules:
    from host.run_comfy import TorchvisionOpsShim
    sys.meta_path.insert(0, TorchvisionOpsShim())


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of a against the reference b."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_within_one_bf16_step(a: torch.Tensor, b: torch.Tensor, allowance=0.0) -> None:
    """One bf16 step of b, or an f32 rounding of values of order one where a sum cancels to near zero; allowance:
    a further absolute error each value may have (a number or a tensor of b's shape)."""
    a, b = a.float(), b.float()
    off = (a - b).abs() > 2.0 ** -7 * b.abs() + 2.0 ** -20 + allowance
    assert not off.any(), f"{int(off.sum())} values differ, by up to {float((a - b).abs().max()):.3g}"


def attention_8bit_launches(monkeypatch, module) -> list:
    """module's `run` with the attention op's launcher itself (which picks kernels/attention_8bit.py where it takes the
    rows: Triton's interpreter on CPU tensors), every other op through kernels.run (their references on the CPU); the
    list returned gets an entry at each call of the 8-bit kernel."""
    import functools

    import kernels
    launched, kernel = [], kernels.attention_8bit.attention_8bit
    monkeypatch.setattr(kernels.attention_8bit, "attention_8bit", lambda *t: launched.append(1) or kernel(*t))
    monkeypatch.setattr(module, "run", lambda op, *t, **kw: (kernels.OPS[op].launcher if op == "attention" else
                                                             functools.partial(kernels.run, op))(*t, **kw))
    return launched


def attention_plans(monkeypatch) -> list:
    """dit_core/gpu/block.py's `run` with each attention call's `planned` recorded in the list returned (SDPA's
    per-shape plans asked for or not), every op still run."""
    from dit_core.gpu import block
    asked, run = [], block.run
    monkeypatch.setattr(block, "run", lambda op, *t, **kw: (op != "attention" or asked.append(kw["planned"]),
                                                            run(op, *t, **kw))[1])
    return asked


@pytest.fixture(scope="session")
def comfy():
    """The unpacked ComfyUI v0.3.75 tree importable in-process (CPU), as an oracle."""
    if not (COMFYUI_TREE / "comfy").is_dir():
        pytest.fail(f"ComfyUI tree missing at {COMFYUI_TREE}: run tests/run.sh (it unpacks it)")
    if str(COMFYUI_TREE) not in sys.path:
        sys.path.append(str(COMFYUI_TREE))
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    import comfy.k_diffusion.sampling
    import comfy.model_sampling
    import comfy.sample
    import comfy.samplers
    return sys.modules["comfy"]


@pytest.fixture(scope="session")
def swiftdit_pack(comfy):
    """The pack imported once, as ComfyUI imports a custom-node folder (a package named after the folder), so the
    nodes' relative imports of dit_core/ and kernels/ resolve as they do inside ComfyUI."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("swiftdit_pack", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["swiftdit_pack"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fresh_kernel_caches():
    """The kernels package's Triton kernels forgotten in memory (each is loaded again from Triton's disk cache at its
    next launch, or held by a build ahead): a test of what a build ahead builds, free of what the process's earlier
    tests built."""
    from triton.runtime.jit import JITFunction
    for name, module in list(sys.modules.items()):
        if name == "kernels" or name.startswith("kernels."):
            for value in vars(module).values():
                fn = getattr(value, "fn", value)  # (an autotuner's kernel)
                if isinstance(fn, JITFunction) and hasattr(fn, "device_caches"):
                    fn.device_caches.clear()
