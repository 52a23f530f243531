"""What the Comfy Registry and pip read of the pack: pyproject.toml's project and [tool.comfy] tables, the licence
and the icon they name, build leftovers ignored, and what `pip install .` gives the `swiftdit` command."""
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from official_templates import template
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_registry_finds_repository_icon_and_licence():
    project, comfy = PROJECT["project"], PROJECT["tool"]["comfy"]
    assert project["name"] == "comfyui-swiftdit" and re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    repository = project["urls"]["Repository"]
    assert repository.startswith("https://github.com/") and comfy["PublisherId"] and comfy["DisplayName"]
    # The icon's URL is the repository's own file on main: that file is here, a square PNG of at most 400 px.
    icon = comfy["Icon"].split("/main/", 1)[1]
    assert comfy["Icon"].startswith(repository.replace("github.com", "raw.githubusercontent.com"))
    with Image.open(ROOT / icon) as im:
        assert im.format == "PNG" and im.width == im.height <= 400
    assert project["license"] == {"file": "LICENSE"}
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def test_dependencies_reuse_comfyuis_torch():
    """A lower bound only: pip keeps the torch ComfyUI runs on (a pin would replace it)."""
    torch = [d for d in PROJECT["project"]["dependencies"] if d.startswith("torch")]
    assert torch == ["torch>=2.4"]


def test_build_leftovers_are_ignored():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {"build/", "*.egg-info/", "__pycache__/"} <= set(ignored)


def test_the_installed_command_has_the_whole_engine(tmp_path):
    """`pip install --no-deps .` (the README's command) installs every module of swiftdit and dit_core, and the
    installed `swiftdit swap` runs from another folder."""
    # From a copy: setuptools builds in the source folder (build/, *.egg-info), and this checkout is not the test's.
    source, target = tmp_path / "source", tmp_path / "site"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "tests",
                                                                "host", "bench", "docs", "workflows"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--target", str(target), str(source)], check=True, cwd=tmp_path)
    for package in ("swiftdit", "dit_core"):
        here = {p.relative_to(ROOT) for p in (ROOT / package).rglob("*.py")}
        installed = {p.relative_to(target) for p in (target / package).rglob("*.py")}
        assert here == installed, f"not installed: {sorted(map(str, here - installed))}"
    workflow = tmp_path / "z_image.json"
    workflow.write_text(json.dumps(template("image_z_image_turbo")))
    swapped = subprocess.run([sys.executable, "-m", "swiftdit.cli", "swap", str(workflow), str(tmp_path / "out.json")],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True,
                             text=True)
    assert swapped.returncode == 0, swapped.stdout + swapped.stderr
    assert "SwiftDiTZImageSampler" in (tmp_path / "out.json").read_text()
