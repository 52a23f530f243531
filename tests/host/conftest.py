"""Host-test fixtures: the random Z-Image checkpoint set, one real ComfyUI v0.3.75 server per module."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

# Every conftest.py outside a package imports as the module "conftest" and the last one imported stays in
# sys.modules: test files collected after this folder that do `from conftest import rel_err` would find this
# file. So it re-exports the shared helpers of tests/conftest.py (loaded under a private name).
_spec = importlib.util.spec_from_file_location(
    "_swiftdit_tests_conftest", Path(__file__).parents[1] / "conftest.py"
)
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
ROOT, COMFYUI_TREE, rel_err = _shared.ROOT, _shared.COMFYUI_TREE, _shared.rel_err
interpreted_only, attention_8bit_launches = _shared.interpreted_only, _shared.attention_8bit_launches

from host import checkpoints  # noqa: E402  (tests/conftest.py put the repo root on sys.path)
from host.server import ComfyHost, HostError  # noqa: E402

WRONG_FAMILY = "not_z_image_qwen3.safetensors"  # test_z_image_host.py ERROR_CASES names it too
LORA = "z_image_widget_test_lora.safetensors"  # and this one


def _serving(server: ComfyHost, timeout: float = 120):
    """A module fixture's body: server started (a start that fails fails the test), yielded, then stopped."""
    try:
        server.start(timeout=timeout)
    except HostError as e:
        pytest.fail(str(e))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def serving():
    """_serving, for the server fixtures of the host test files: `yield from serving(server)`."""
    return _serving


@pytest.fixture(scope="session")
def model_set() -> checkpoints.ModelSet:
    """Generated once (about 30 s on 2 cores) and cached under .cache/models/<version key>/."""
    return checkpoints.ensure(layers=1)


@pytest.fixture(scope="module")
def host(tmp_path_factory, model_set):
    """A ComfyUI server (reference/comfyui_host.md section 9) with this pack in custom_nodes and the
    checkpoint set as its models folders; models/unet (also listed as diffusion_models) holds a text encoder
    under a DiT-like name, for the wrong-family error test, and models/loras a LoRA file for the widget tests."""
    try:
        import aiohttp  # noqa: F401  the WebSocket client; tests/run.sh installs host/requirements.txt
    except ImportError:
        pytest.fail("aiohttp missing: run tests/run.sh (it installs host/requirements.txt into the venv)")
    base = tmp_path_factory.mktemp("comfy_base")
    server = ComfyHost(COMFYUI_TREE, base, sys.executable)
    server.link_models({kind: folder for kind, folder in model_set.folders.items() if kind != "loras"})
    unet = base / "models" / "unet"
    unet.mkdir(parents=True)
    (unet / WRONG_FAMILY).symlink_to(model_set.text_encoder)
    (base / "models" / "loras").mkdir()
    save_file({"layers.0.attention.qkv.lora_down.weight": torch.zeros(4, 3840)}, base / "models" / "loras" / LORA)
    yield from _serving(server)
