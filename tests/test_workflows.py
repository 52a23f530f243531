"""workflows/: every node type used is ours (docs/nodes.md, the registry) or stock ComfyUI v0.3.75; the API
twins are what `swiftdit to-api` makes; the UI -> API rules (subgraphs, promotion, bypass, mute, notes)."""
import copy
import json
import re
from functools import cache
from pathlib import Path

import pytest
from official_templates import template

from swiftdit import FAMILIES as SWAP_FAMILIES, problems, swap_ui, to_api
from swiftdit.ui_graph import UIGraph

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "workflows"
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
OBJECT_INFO = json.loads((ROOT / "tests" / "fixtures" / "object_info_z_image.json").read_text())
# Each family's workflows are converted with its own /object_info fixture (file name prefix -> fixture).
FIXTURES = {"z_image": OBJECT_INFO,
            "flux3_klein": json.loads((ROOT / "tests" / "fixtures" / "object_info_flux3_klein.json").read_text()),
            "minimax_h3": json.loads((ROOT / "tests" / "fixtures" / "object_info_minimax_h3.json").read_text()),
            "krea2": json.loads((ROOT / "tests" / "fixtures" / "object_info_krea2.json").read_text()),
            "ltx25": json.loads((ROOT / "tests" / "fixtures" / "object_info_ltx25.json").read_text()),
            "omnivoice": json.loads((ROOT / "tests" / "fixtures" / "object_info_omnivoice.json").read_text())}
FRONTEND_ONLY = {"MarkdownNote", "Note", "Reroute", "PrimitiveNode"}  # the graph editor's own nodes
UI_FILES = sorted(WORKFLOWS.glob("*.json"))
# In a folder of their own: ComfyUI's Templates browser lists workflows/*.json, and an API graph opens there empty.
API_FILES = sorted((WORKFLOWS / "api").glob("*.json"))




def docs_ids() -> set[str]:
    return set(re.findall(r"^\| `(SwiftDiT\w+)` \|", (ROOT / "docs" / "nodes.md").read_text(), re.MULTILINE))


@cache
def stock_ids() -> frozenset:
    """Node ids ComfyUI v0.3.75 registers (NODE_CLASS_MAPPINGS keys, V3 node_id values), from its sources."""
    if not (COMFYUI_TREE / "nodes.py").is_file():
        pytest.fail(f"ComfyUI tree missing at {COMFYUI_TREE}: run tests/run.sh (it unpacks it)")
    names = set()
    for path in [COMFYUI_TREE / "nodes.py", *sorted((COMFYUI_TREE / "comfy_extras").rglob("*.py"))]:
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r'node_id\s*=\s*"(\w+)"', text))
        for block in re.findall(r"NODE_CLASS_MAPPINGS\s*=\s*\{(.*?)\n\}", text, re.DOTALL):
            names |= set(re.findall(r'^\s*"([^"]+)"\s*:', block, re.MULTILINE))
    return frozenset(names)


def node_types(path: Path) -> set[str]:
    data = json.loads(path.read_text())
    if isinstance(data.get("nodes"), list):
        graph = UIGraph(data)
        return {n["type"] for s in graph.scopes() for n in s.nodes.values() if not graph.is_instance(n)}
    return {body["class_type"] for body in data.values()}


def fixture_for(path: Path) -> dict:
    return next(info for prefix, info in FIXTURES.items() if path.name.startswith(prefix))


def test_workflows_are_there_and_described():
    names = ["flux3_klein_edit.json", "flux3_klein_t2i.json", "krea2_style_reference.json", "krea2_t2i.json",
             "ltx25_t2v.json",
             "minimax_h3_t2v.json", "omnivoice_tts.json", "omnivoice_voice_clone.json", "z_image_turbo_t2i.json"]
    assert [p.name for p in UI_FILES] == names and [p.name for p in API_FILES] == names
    readme = (WORKFLOWS / "README.md").read_text()
    for path in UI_FILES + API_FILES:
        assert f"`{path.name}`" in readme, path.name


def test_stock_list_is_read():
    assert {"KSampler", "SaveImage", "ConditioningZeroOut", "EmptySD3LatentImage", "ModelSamplingAuraFlow"} \
        <= stock_ids()


@pytest.mark.parametrize("path", UI_FILES + API_FILES, ids=lambda p: p.name)
def test_every_node_type_is_ours_or_stock(path):
    used = node_types(path)
    ours = {t for t in used if t.startswith("SwiftDiT")}
    assert ours <= docs_ids(), f"not in docs/nodes.md: {sorted(ours - docs_ids())}"
    unknown = used - ours - stock_ids() - FRONTEND_ONLY
    assert not unknown, f"neither ours nor stock v0.3.75: {sorted(unknown)}"


@pytest.fixture(scope="module")
def registry(swiftdit_pack):
    """Our node classes by node id from nodes/__init__.py (NODE_CLASSES), imported as ComfyUI does."""
    from swiftdit_pack.nodes import NODE_CLASSES
    return {c.define_schema().node_id: c for c in NODE_CLASSES}


@pytest.mark.parametrize("path", UI_FILES + API_FILES, ids=lambda p: p.name)
def test_our_node_types_are_registered(path, registry):
    ours = {t for t in node_types(path) if t.startswith("SwiftDiT")}
    assert ours <= set(registry), f"not in nodes/__init__.py: {sorted(ours - set(registry))}"


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_object_info_fixture_matches_our_nodes(registry, family):
    fixtures = FIXTURES[family]
    prefix = {"z_image": "SwiftDiTZImage", "flux3_klein": "SwiftDiTFlux3Klein", "minimax_h3": "SwiftDiTMiniMaxH3",
              "krea2": "SwiftDiTKrea2", "ltx25": "SwiftDiTLTX25", "omnivoice": "SwiftDiTOmniVoice"}[family]
    assert {n for n in registry if n.startswith(prefix)} <= set(fixtures)  # every node of the family is there
    for node_id, cls in registry.items():
        if node_id not in fixtures:
            continue
        live, fixture = cls.GET_NODE_INFO_V1(), fixtures[node_id]
        live = live if isinstance(live, dict) else vars(live)
        assert live["input_order"] == fixture["input_order"], node_id
        assert list(live["output"]) == fixture["output"], node_id
        for section, specs in live["input"].items():
            for name, spec in specs.items():
                assert spec[0] == fixture["input"][section][name][0], (node_id, name)


@pytest.mark.parametrize("path", API_FILES, ids=lambda p: p.name)
def test_api_twin_is_what_to_api_makes(path):
    ui = json.loads((WORKFLOWS / path.name).read_text())
    assert json.loads(path.read_text()) == to_api(ui, fixture_for(path))


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_ui_workflow_loads_and_is_already_ours(path):
    wf = json.loads(path.read_text())
    assert problems(wf) == []
    for family in SWAP_FAMILIES:  # the families with templates to swap (OmniVoice has none)
        swapped, report = swap_ui(wf, family)
        assert swapped == wf and report.changed == []


def test_turbo_workflow_mirrors_the_official_template():
    def body(prompt, strip=""):  # our flat graph keeps the template's inner node ids: "57:28" -> "28"
        def local(v):
            return [v[0].removeprefix(strip), v[1]] if isinstance(v, list) else v
        return {k.removeprefix(strip): {"class_type": v["class_type"],
                                        "inputs": {n: local(x) for n, x in v["inputs"].items()}}
                for k, v in prompt.items()}
    official = to_api(swap_ui(template("image_z_image_turbo"))[0], OBJECT_INFO)
    ours = json.loads((WORKFLOWS / "api" / "z_image_turbo_t2i.json").read_text())
    assert body(ours) == body(official, "57:")
    assert ours["3"]["inputs"] | {"model": 0, "positive": 0, "negative": 0, "latent_image": 0} == {
        "model": 0, "seed": 0, "steps": 8, "cfg": 1, "sampler_name": "res_multistep", "scheduler": "simple",
        "positive": 0, "negative": 0, "latent_image": 0, "denoise": 1}
    assert ours["11"]["inputs"]["shift"] == 3 and ours["13"]["inputs"] == {"width": 1024, "height": 1024,
                                                                         "batch_size": 1}


def test_to_api_bypass_mute_and_notes():
    wf = template("image_z_image_turbo")
    inner = {n["id"]: n for n in wf["definitions"]["subgraphs"][0]["nodes"]}
    inner[11]["mode"] = 4  # bypassed ModelSamplingAuraFlow: the KSampler reads the UNETLoader's MODEL
    inner[33]["mode"] = 2  # muted ConditioningZeroOut: the negative input is dropped
    prompt = to_api(wf, OBJECT_INFO)
    assert "57:11" not in prompt and "57:33" not in prompt and "35" not in prompt  # 35: the MarkdownNote
    assert prompt["57:3"]["inputs"]["model"] == ["57:28", 0]
    assert "negative" not in prompt["57:3"]["inputs"]
    assert prompt["9"]["inputs"]["images"] == ["57:8", 0]  # through the subgraph's output


def test_to_api_promoted_inputs_and_outer_links():
    wf = template("image_z_image_turbo")
    instance = next(n for n in wf["nodes"] if n["id"] == 57)
    del instance["properties"]["proxyWidgets"]  # promoted inputs: the instance's values override inner ones
    instance["widgets_values"] = ["a red fox", 768, 512, 42, 4, "z_image_turbo_int8_convrot.safetensors",
                                  "qwen_3_4b_fp8_mixed.safetensors", "ae.safetensors"]
    # An outer PrimitiveInt wired to the instance's seed input wins over both.
    wf["nodes"].append({"id": 70, "type": "PrimitiveInt", "mode": 0, "inputs": [],
                        "outputs": [{"name": "INT", "type": "INT", "links": [80]}],
                        "widgets_values": [77, "fixed"]})
    instance["inputs"].append({"name": "seed", "type": "INT", "widget": {"name": "seed"}, "link": 80})
    wf["links"].append([80, 70, 0, 57, 1, "INT"])
    info = copy.deepcopy(OBJECT_INFO)
    info["PrimitiveInt"] = {"input": {"required": {"value": ["INT", {"control_after_generate": True}]}},
                            "output": ["INT"], "name": "PrimitiveInt", "display_name": "Int"}
    assert problems(wf) == []
    prompt = to_api(wf, info)
    assert prompt["57:27"]["inputs"]["text"] == "a red fox"
    assert (prompt["57:13"]["inputs"]["width"], prompt["57:13"]["inputs"]["height"]) == (768, 512)
    assert prompt["57:3"]["inputs"]["steps"] == 4 and prompt["57:3"]["inputs"]["seed"] == ["70", 0]
    assert prompt["70"] == {"inputs": {"value": 77}, "class_type": "PrimitiveInt", "_meta": {"title": "Int"}}
    assert prompt["57:28"]["inputs"]["unet_name"] == "z_image_turbo_int8_convrot.safetensors"


def test_to_api_names_a_node_missing_from_object_info():
    info = {k: v for k, v in OBJECT_INFO.items() if k != "ConditioningZeroOut"}
    with pytest.raises(ValueError, match=r"node 57:33 \(ConditioningZeroOut\) is not in object_info"):
        to_api(template("image_z_image_turbo"), info)


def klein_template_values(name: str) -> dict:
    """The sampler's and the loaders' values of an official distilled Klein template (promoted ones win)."""
    wf = template(name)
    if name.endswith("_t2i"):
        v = next(n for n in wf["nodes"] if n["id"] == 18)["widgets_values"]  # promoted subgraph inputs
        return {"text": v[0], "width": v[2], "height": v[3], "seed": v[4], "steps": v[5], "sampler_name": v[6],
                "scheduler": v[7], "unet_name": v[8], "clip_name": v[9], "vae_name": v[10], "cfg": 1, "denoise": 1}
    nodes = {n["id"]: n.get("widgets_values") for n in wf["nodes"]}  # 2: the text encoder, 46: the upsampler
    seed, _, steps, cfg, sampler_name, scheduler, denoise = nodes[7]
    return {"seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler_name, "scheduler": scheduler,
            "denoise": denoise, "unet_name": nodes[1][0], "clip_name": nodes[2][0], "vae_name": nodes[3][0],
            "image": nodes[11][0]}


@pytest.mark.parametrize("name, official", [("flux3_klein_t2i", "image_flux3_klein_distilled_t2i"),
                                            ("flux3_klein_edit", "image_flux3_klein_distilled_image_edit")])
def test_klein_workflows_mirror_the_official_templates(name, official):
    want = klein_template_values(official)
    ours = json.loads((WORKFLOWS / "api" / f"{name}.json").read_text())
    by_type = {}
    for body in ours.values():
        by_type.setdefault(body["class_type"], []).append(body["inputs"])
    sampler = by_type["SwiftDiTFlux3KleinSampler"][0]
    assert {k: sampler[k] for k in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")} == \
        {k: want[k] for k in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")}
    assert (sampler["steps"], sampler["cache"], sampler["refresh"]) == (16, 0.3, 0)
    assert by_type["SwiftDiTFlux3KleinLoader"][0] == {"unet_name": want["unet_name"], "weight_dtype": "default",
                                                      "linears": "as stored", "gpu_budget_gb": 0}
    assert by_type["SwiftDiTFlux3KleinTextEncoderLoader"][0] == {"clip_name": want["clip_name"], "type": "flux3",
                                                                 "device": "default"}
    assert by_type["SwiftDiTFlux3KleinVAELoader"][0] == {"vae_name": want["vae_name"]}
    assert by_type["SwiftDiTSaveImage"][0]["filename_prefix"] == official
    if name == "flux3_klein_t2i":  # the prompt as typed (the upsampler skipped), a real empty negative
        assert [e["text"] for e in by_type["SwiftDiTFlux3KleinTextEncode"]] == [want["text"], ""]
        assert by_type["EmptyFlux2LatentImage"][0] == {"width": want["width"], "height": want["height"],
                                                       "batch_size": 1}
    else:  # the reference: scaled to ~1 MP, our VAE encode, ReferenceLatent on positive and negative
        assert by_type["LoadImage"][0] == {"image": want["image"]}
        assert by_type["ImageScaleToTotalPixels"][0]["megapixels"] == 1.0
        encode = next(k for k, v in ours.items() if v["class_type"] == "SwiftDiTFlux3KleinVAEEncode")
        assert sorted(r["latent"][0] for r in by_type["ReferenceLatent"]) == [encode, encode]
        assert sampler["latent_image"] == [encode, 0]  # the output takes the reference's size, as the template


def test_minimax_h3_workflow_is_the_reduced_template():
    """Issue 35: `swiftdit swap --for-host` of the official t2v template, its files as the template names them (the
    NVFP4-AWQ text encoder included)."""
    from swiftdit.for_host import swap_for_host
    want = swap_for_host(template("video_minimax_h3_t2v"), "minimax_h3")[0]
    assert json.loads((WORKFLOWS / "minimax_h3_t2v.json").read_text()) == want
    api = json.loads((WORKFLOWS / "api" / "minimax_h3_t2v.json").read_text())
    assert api["140:128"]["inputs"] == {"clip_name": "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors",
                                        "type": "minimax", "device": "default"}
    assert (api["140:141"]["inputs"]["seed"], api["140:137"]["inputs"]["value"]) == (757358688076805, 20)


def test_krea2_workflow_is_the_reduced_template():
    """Issue 38: `swiftdit swap --for-host` of the official t2i INT8 template as it ships, its prompt refiner on:
    v0.3.75 has no TextGenerate, so the reduction hands the text encode what the refiner switch passes with the
    refiner off (the user's prompt), not the refiner's input (its system prompt joined to the user's prompt by
    StringConcatenate), and its report says the refiner was reduced."""
    from swiftdit.for_host import swap_for_host
    wf = template("image_krea2_turbo_t2i_int8")
    instance = next(n for n in wf["nodes"] if n["id"] == 30)
    assert wf["definitions"]["subgraphs"][0]["inputs"][1]["label"] == "prompt_enhance"
    assert instance["widgets_values"][1] is True
    reduced, _, host = swap_for_host(wf, "krea2")
    assert json.loads((WORKFLOWS / "krea2_t2i.json").read_text()) == reduced
    [line] = [line for line in host.lines() if "TextGenerate" in line]
    assert "30:16  TextGenerate: skipped, prompt refiner reduced" in line and "PrimitiveStringMultiline 30:19" in line
    api = json.loads((WORKFLOWS / "api" / "krea2_t2i.json").read_text())
    assert api["30:6"]["inputs"]["text"] == ["30:19", 0] and api["30:19"]["inputs"]["value"] == instance[
        "widgets_values"][0]  # the user prompt, as typed
    assert (api["30:10"]["inputs"]["unet_name"], api["30:11"]["inputs"]["clip_name"],
            api["30:12"]["inputs"]["vae_name"]) == ("krea2_turbo_int8_convrot.safetensors",
                                                    "qwen3vl_4b_fp8_scaled.safetensors", "qwen_image_vae.safetensors")
    assert api["30:3"]["inputs"] | {"model": 0, "positive": 0, "negative": 0, "latent_image": 0} == {
        "model": 0, "seed": 45862206397178, "steps": 8, "cfg": 1, "sampler_name": "euler", "scheduler": "simple",
        "positive": 0, "negative": 0, "latent_image": 0, "denoise": 1}
    assert api["30:5"]["inputs"] == {"width": 1024, "height": 1024, "batch_size": 1}
    assert api["30:3"]["inputs"]["model"] == ["30:10", 0]  # enable_lora? off: the LoRA and its switch are gone


def test_krea2_style_reference_workflow_is_the_reduced_template():
    """Issue 38: `swiftdit swap --for-host` of the official style-reference template: our style-reference encode
    reads LoadImage's picture and the stock VAE, the pack's reference method twin keeps index_timestep_zero, the
    SamplerCustomAdvanced group is our sampler with the template's values."""
    from swiftdit.for_host import swap_for_host
    wf = template("image_krea2_turbo_int8_image_style_reference")
    assert json.loads((WORKFLOWS / "krea2_style_reference.json").read_text()) == swap_for_host(wf, "krea2")[0]
    api = json.loads((WORKFLOWS / "api" / "krea2_style_reference.json").read_text())
    assert api["30:52"]["class_type"] == "SwiftDiTKrea2TextEncodeQwenImageEditPlus"
    assert {k: api["30:52"]["inputs"][k] for k in ("clip", "prompt", "vae", "image1")} == {
        "clip": ["30:11", 0], "prompt": ["30:19", 0], "vae": ["30:12", 0], "image1": ["69", 0]}
    assert api["69"]["inputs"] == {"image": "krea2_reference_image.png"}
    assert api["30:53"]["inputs"]["reference_latents_method"] == "index_timestep_zero"
    assert api["30:77"]["inputs"] | {"model": 0, "positive": 0, "negative": 0, "latent_image": 0} == {
        "model": 0, "seed": 251161685108094, "steps": 8, "cfg": 1, "sampler_name": "euler", "scheduler": "simple",
        "positive": 0, "negative": 0, "latent_image": 0, "denoise": 1.0}
    assert api["30:77"]["inputs"]["positive"] == ["30:53", 0] and api["30:13"]["inputs"] == {
        "conditioning": ["30:53", 0]}
    assert api["30:15"]["inputs"]["lora_name"] == "krea2_style_reference.safetensors"
    assert api["30:64"]["inputs"] | {"model": 0} == {"model": 0, "max_shift": 1.15, "base_shift": 0.5,
                                                     "width": 1024, "height": 1024}


def test_ltx25_workflow_is_the_reduced_template():
    """Issue 36: `swiftdit swap --for-host` of the official t2v template, its file names unchanged (our loaders read
    them all; the enhancer's E2B file goes with the enhancer, which is off)."""
    from swiftdit.for_host import swap_for_host
    assert json.loads((WORKFLOWS / "ltx25_t2v.json").read_text()) == swap_for_host(template("video_ltx2_5_t2v"),
                                                                                   "ltx25")[0]
    api = json.loads((WORKFLOWS / "api" / "ltx25_t2v.json").read_text())
    assert api["405:387"]["inputs"] == {"clip_name": "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
                                        "type": "ltxv", "device": "default"}
    assert api["405:356"]["inputs"] == {"width": 640, "height": 368, "length": 121, "batch_size": 1}
    samplers = {b["inputs"]["steps"]: b["inputs"] for b in api.values() if b["class_type"] == "SwiftDiTLTX25Sampler"}
    assert (samplers[8]["seed"], samplers[3]["seed"]) == (558811532553686, 42)
