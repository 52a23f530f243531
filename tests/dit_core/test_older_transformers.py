"""The text encoders' tests under an older transformers: 5.17, the GPU image's (tests/older_transformers.txt, installed
by tests/run.sh into a folder of its own, put ahead of the venv's packages here). The fused layers call into
transformers' modules (the rotary, the layers' weights): under 5.17 Qwen3-VL's rotary indexed three position axes and
got text positions [1, L], and FLUX.3 Klein's and Krea 2's encoders fell back to transformers' layers in a real
server (2026-12-06); the same tests under the venv's transformers had passed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

OLDER = Path(sys.prefix) / "older-transformers"
PIN = next(line.split("==")[1] for line in (ROOT / "tests" / "older_transformers.txt").read_text().split()
           if line.startswith("transformers=="))
TESTS = ("tests/dit_core/text", "tests/dit_core/test_text_decoder.py")


def test_the_text_encoders_pass_under_the_older_transformers():
    if not (OLDER / ".stamp").is_file():
        pytest.fail(f"{OLDER} missing: run tests/run.sh (it installs tests/older_transformers.txt there)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(OLDER), os.environ.get("PYTHONPATH")) if p)}
    version = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == PIN
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
