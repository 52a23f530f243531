"""Our workflows in ComfyUI's editor, as a user opens them: the frontend package ComfyUI v0.3.75 names (1.32.9), in
headless Chromium (Debian's package) driven by Playwright, on a real server with this pack. Every UI workflow of
workflows/ and an official template as `swiftdit swap` rewrites it load with no missing node type, every link
connected, no error toast or dialog (the model files they name are there), every node wide enough for its title,
and the saved view showing the graph's top-left corner.

Needs /usr/bin/chromium (`apt-get install chromium`); .ci/run installs it and sets SWIFTDIT_REQUIRE_BROWSER=1, so in
CI a missing browser fails instead of skipping."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from official_templates import template

from host.server import ComfyHost
from swiftdit.swap import swap_ui

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
WORKFLOWS = {path.name: json.loads(path.read_text()) for path in sorted((ROOT / "workflows").glob("*.json"))}
WORKFLOWS["image_z_image_turbo, swapped"] = swap_ui(template("image_z_image_turbo"), "z_image")[0]
# The flags a headless Chromium needs on a machine with no network and no GPU.
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"]

# What the editor shows of the loaded graph (and of its subgraphs): node types it does not know, inputs whose link is
# gone, nodes narrower than their title (measured in the title's font), whether the view shows the graph's top-left
# corner, and the toasts and dialogs on screen.
INSPECT = """() => {
  const g = window.app.graph, canvas = window.app.canvas;
  const graphs = [g, ...(g.subgraphs ? [...g.subgraphs.values()] : [])];
  const known = type => !!LiteGraph.registered_node_types[type] || !!g.subgraphs?.get?.(type);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${LiteGraph.NODE_TEXT_SIZE}px ${LiteGraph.NODE_FONT || 'Arial'}`;
  const out = {missing: [], unlinked: [], narrow: [], corner: null, toasts: [], dialogs: []};
  for (const graph of graphs) for (const node of graph._nodes) {
    if (!known(node.type)) out.missing.push(node.type);
    for (const input of node.inputs || [])
      if (input.link != null && !(graph.links.get ? graph.links.get(input.link) : graph.links[input.link]))
        out.unlinked.push(`${node.id}.${input.name}`);
    const needed = ctx.measureText(node.title || '').width + 2 * LiteGraph.NODE_TITLE_HEIGHT;
    if (graph === g && node.size[0] < needed) out.narrow.push(`${node.title}: ${node.size[0]} < ${Math.ceil(needed)}`);
  }
  const left = Math.min(...g._nodes.map(n => n.pos[0])), top = Math.min(...g._nodes.map(n => n.pos[1]));
  const [x, y] = canvas.ds.convertOffsetToCanvas([left, top - LiteGraph.NODE_TITLE_HEIGHT]);
  out.corner = x >= 0 && y >= 0;
  out.toasts = [...document.querySelectorAll('.p-toast-message')].map(e => e.innerText.trim());
  out.dialogs = [...document.querySelectorAll('.p-dialog')].map(e => e.innerText.trim().slice(0, 200));
  return out;
}"""


def model_files(workflow: dict) -> set[tuple[str, str]]:
    """(folder, file) of every model the workflow's nodes name in their properties (the editor checks these)."""
    nodes = [*workflow.get("nodes", []),
             *(n for sg in workflow.get("definitions", {}).get("subgraphs", []) for n in sg.get("nodes", []))]
    return {(m["directory"], m["name"]) for n in nodes for m in (n.get("properties") or {}).get("models", [])}


@pytest.fixture(scope="module")
def editor(tmp_path_factory, serving):
    if not CHROMIUM.is_file():
        if os.environ.get("SWIFTDIT_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} missing: apt-get install chromium")
        pytest.skip(f"{CHROMIUM} missing: apt-get install chromium to run the editor tests")
    from playwright.sync_api import sync_playwright
    base = tmp_path_factory.mktemp("editor")
    for folder, name in set().union(*map(model_files, WORKFLOWS.values())):
        (base / "models" / folder).mkdir(parents=True, exist_ok=True)
        (base / "models" / folder / name).write_bytes(b"")  # listed is enough: the editor never reads them
    server = ComfyHost(ROOT / ".cache" / "comfyui-0.3.75", base, sys.executable, frontend=True)
    for server_up in serving(server):
        # A first visit opens the template browser; a user who has seen it once does not get it again.
        server_up.request("POST", "/settings/Comfy.TutorialCompleted", True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(server_up.url, wait_until="domcontentloaded")
            page.wait_for_function("() => window.app?.graph && window.LiteGraph", timeout=90_000)
            yield page
            browser.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_workflow_opens_whole(editor, name):
    editor.evaluate("async (wf) => { await window.app.loadGraphData(wf); }", WORKFLOWS[name])
    editor.wait_for_timeout(1000)  # toasts and dialogs come after the load
    seen = editor.evaluate(INSPECT)
    # What this workflow opened is closed before the next one.
    editor.keyboard.press("Escape")
    editor.evaluate("() => window.app.extensionManager.toast.removeAll()")
    report = json.dumps(seen, indent=1)
    assert seen["missing"] == [] and seen["unlinked"] == [], report
    assert seen["toasts"] == [] and seen["dialogs"] == [], report
    assert seen["narrow"] == [], report
    assert seen["corner"], f"the saved view hides the graph's top-left corner: {report}"
