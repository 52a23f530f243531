"""What the Comfy Registry and pip read of the pack: pyproject.toml's project and [tool.comfy] tables, the licence
and the icon they name, and build leftovers ignored."""
import re
import tomllib
from pathlib import Path

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
