"""The official ComfyUI workflow templates (comfyui-workflow-templates-json 0.1.123, tests/requirements.txt)."""
import json
from importlib import resources

import pytest


def template(name: str) -> dict:
    """Template `name` (file stem) as parsed JSON."""
    try:
        root = resources.files("comfyui_workflow_templates_json") / "templates"
    except ModuleNotFoundError:
        pytest.fail("comfyui-workflow-templates-json missing: pip install -r tests/requirements.txt")
    return json.loads((root / f"{name}.json").read_text(encoding="utf-8"))
