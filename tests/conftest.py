"""Shared test fixtures: the ComfyUI v0.3.75 tree as an in-process oracle, tolerances, relative error."""
import importlib.machinery
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of a against the reference b."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="session")
def comfy():
    """The unpacked ComfyUI v0.3.75 tree importable in-process (CPU), as an oracle.

    torchvision is stubbed: ComfyUI core imports it only for models we never build here, and the CPU torch
    wheel has no matching torchvision (reference/comfyui_host.md section 3).
    """
    if not (COMFYUI_TREE / "comfy").is_dir():
        pytest.fail(f"ComfyUI tree missing at {COMFYUI_TREE}: run tests/run.sh (it unpacks it)")
    try:
        import torchvision  # noqa: F401
    except Exception:
        stub = types.ModuleType("torchvision")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        stub.transforms = types.ModuleType("torchvision.transforms")
        sys.modules["torchvision"] = stub
        sys.modules["torchvision.transforms"] = stub.transforms
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
