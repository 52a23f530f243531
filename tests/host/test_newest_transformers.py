"""The pack beside the newest transformers (5.25, which imports Hugging Face's `kernels` package) in a real ComfyUI
v0.3.75 server: it loads, and our Z-Image graph runs to an image (its text encoder is transformers' Qwen3). The
packages come from tests/newest_transformers.txt, installed by tests/run.sh into a folder ahead of the venv's, as a
ComfyUI whose venv has them; the pack's root is on the caller's PYTHONPATH, as ./demo.sh once put it, and the
server must not see it there."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from host.graphs import Settings, swiftdit_graph
from host.images import PNG_SIGNATURE
from host.server import PACK_ROOT, ComfyHost

pytestmark = pytest.mark.slow

NEWEST = Path(sys.prefix) / "newest-transformers"
PINS = dict(line.split("==") for line in (Path(__file__).parents[1] / "newest_transformers.txt").read_text().split()
            if "==" in line)


@pytest.fixture(scope="module")
def newest_host(tmp_path_factory, model_set, serving):
    if not (NEWEST / ".stamp").is_file():
        pytest.fail(f"{NEWEST} missing: run tests/run.sh (it installs tests/newest_transformers.txt there)")
    server = ComfyHost(Path(__file__).parents[2] / ".cache" / "comfyui-0.3.75", tmp_path_factory.mktemp("newest"),
                       sys.executable, packages_first=NEWEST)
    server.link_models(model_set.folders)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", str(PACK_ROOT))
        yield from serving(server)


def test_the_server_sees_the_newest_transformers_and_hugging_faces_kernels(newest_host):
    probe = "import json, kernels, transformers; print(json.dumps([transformers.__version__, kernels.__file__]))"
    version, kernels_file = json.loads(subprocess.run(
        [sys.executable, "-c", probe], env=newest_host.environment(), cwd=newest_host.tree, capture_output=True,
        text=True, check=True).stdout)  # from ComfyUI's folder, as the server runs
    assert version == PINS["transformers"] and Path(kernels_file).is_relative_to(NEWEST), kernels_file


def test_the_pack_loads_and_runs_beside_them(newest_host):
    assert "SwiftDiTZImageLoader" in newest_host.object_info(), newest_host.pack_import_error()
    entry, _, _ = newest_host.run(swiftdit_graph(Settings(steps=2)))
    assert entry["status"]["status_str"] == "success", newest_host.log_tail()
    [path] = newest_host.output_files(entry)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
