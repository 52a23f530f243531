"""`swiftdit swap` on the official Z-Image templates (comfyui-workflow-templates-json 0.1.123): stock nodes of
docs/nodes.md replaced, every link and widget value kept, types consistent, idempotent, API twin, CLI."""
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from official_templates import template

from swiftdit import problems, swap_api, swap_ui, to_api
from swiftdit.families import FAMILIES
from swiftdit.ui_graph import UIGraph, link_view

ROOT = Path(__file__).resolve().parents[1]
OBJECT_INFO = ROOT / "tests" / "fixtures" / "object_info_z_image.json"
FAMILY = FAMILIES["z_image"]
TEMPLATES = ("image_z_image_turbo", "image_z_image_turbo_int8")
# Other official templates whose text encoder is a lumina2 CLIPLoader: partial swaps (switches, ControlNet
# model patches, an unsupported sampler, a VAE that also feeds VAEEncode) must still give loadable graphs.
PARTIAL = ("image_z_image", "image_z_image_int8", "image_z_image_turbo_fun_union_controlnet",
           "basic_switch_node", "template_rob_realistic_2k_images_quick_variations",
           "utility_pid_latent_upscale_dit")




SAVE = "SwiftDiTSaveImage"  # any family's images (docs/nodes.md)


def contract(prefix: str = "SwiftDiTZImage") -> dict:
    """docs/nodes.md, one family's table (Z-Image by default): stock node -> (our node id, our output type)."""
    text = (ROOT / "docs" / "nodes.md").read_text()
    rows = re.findall(rf"^\| `({prefix}\w*)` \| `(\w+)`.*\| `?(\w+)`? \|$", text, re.MULTILINE)
    return {stock: (ours, out) for ours, stock, out in rows}


def all_nodes(wf: dict) -> list[dict]:
    graph = UIGraph(wf)
    return [n for scope in graph.scopes() for n in scope.nodes.values() if not graph.is_instance(n)]


def link_ends(wf: dict) -> dict:
    """Every link of every scope: (scope, id) -> (origin, origin slot, target, target slot)."""
    ends = ("origin_id", "origin_slot", "target_id", "target_slot")
    return {(scope.key, lid): tuple(link_view(raw)[k] for k in ends)
            for scope in UIGraph(wf).scopes() for lid, raw in scope.raw_links.items()}


def stock_view(wf: dict, family=FAMILY) -> dict:
    """The workflow with every allowed swap edit undone: what must equal the original exactly."""
    wf = copy.deepcopy(wf)
    back = {ours: stock for ours, stock in family.ours_roles.items()}
    types = {ours: stock for stock, ours in family.wire_types.items()}

    def undo(obj):
        if isinstance(obj, dict):
            if obj.get("type") in back:  # one of our nodes
                role = family.roles[back[obj["type"]]]
                obj["type"] = back[obj["type"]]
                if role.extra_widgets:
                    obj["widgets_values"] = obj["widgets_values"][:-len(role.extra_widgets)]
                obj["properties"]["Node name for S&R"] = obj["type"]
            for key in ("cnr_id", "ver"):
                obj.pop(key, None)
            named = ("type", "name", "localized_name")
            return {k: undo(types.get(v, v) if k in named else v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [undo(types.get(v, v) if isinstance(v, str) else v) for v in obj]
        return obj
    return undo(wf)


def stock_consumers_of_ours(wf: dict, family=FAMILY) -> list[str]:
    """Stock nodes that take or give one of our engine types (none may remain)."""
    ours_types = set(family.wire_types.values())
    return [f"{n['id']} {n['type']}" for n in all_nodes(wf)
            if n["type"] not in family.ours_roles and n["type"] != "Reroute"
            and any(e.get("type") in ours_types for e in n.get("inputs", []) + n.get("outputs", []))]


@pytest.fixture(scope="module")
def object_info():
    return json.loads(OBJECT_INFO.read_text())


def test_family_table_is_the_contract():
    table = {stock: role.ours for stock, role in FAMILY.roles.items()}
    assert table == {stock: ours for stock, (ours, _) in (contract() | contract(SAVE)).items()}
    for ours, out in contract().values():
        assert FAMILY.output_type(ours, 0) == out, ours


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_stock_node_replaced(name):
    before = template(name)
    after, report = swap_ui(before)
    docs = contract()
    replaced = [n["type"] for n in all_nodes(before) if n["type"] in docs]
    assert replaced, "the template has none of the stock nodes docs/nodes.md replaces"
    assert not [n["type"] for n in all_nodes(after) if n["type"] in docs]
    by_id = {n["id"]: n["type"] for n in all_nodes(after)}
    for n in all_nodes(before):
        if n["type"] in docs:
            assert by_id[n["id"]] == docs[n["type"]][0]
            assert n["type"] in {old for _, old, _ in report.changed}
    assert stock_consumers_of_ours(after) == []


@pytest.mark.parametrize("name", TEMPLATES)
def test_links_and_widgets_survive(name):
    before = template(name)
    after, _ = swap_ui(before)
    assert link_ends(after) == link_ends(before)
    old = {n["id"]: n for n in all_nodes(before)}
    for node in all_nodes(after):
        values, kept = node.get("widgets_values"), old[node["id"]].get("widgets_values")
        assert values[:len(kept)] == kept, node["id"]
        extra = values[len(kept):]
        assert extra == (["as stored", 0] if node["type"] == "SwiftDiTZImageLoader" else []), node["id"]
        assert [e.get("link") for e in node.get("inputs", [])] == \
            [e.get("link") for e in old[node["id"]]["inputs"]]
        assert [e.get("links") for e in node.get("outputs", [])] == \
            [e.get("links") for e in old[node["id"]].get("outputs", [])]
    assert stock_view(after) == stock_view(before)  # nothing else moved: positions, groups, proxyWidgets


@pytest.mark.parametrize("name", TEMPLATES + PARTIAL)
def test_swapped_graph_is_valid(name):
    before = template(name)
    assert problems(before) == []
    after, report = swap_ui(before)
    assert problems(after) == []  # links <-> slots both ways, types equal on both ends, subgraph ports
    assert stock_consumers_of_ours(after) == []
    assert swap_ui(after)[0] == after
    if name in PARTIAL[2:]:  # something swapped, something of a role left stock with a reason
        assert report.changed and any(kind in FAMILY.roles and why for _, kind, why in report.left)


@pytest.mark.parametrize("name", TEMPLATES)
def test_subgraph_declarations_follow_the_wires(name):
    after, _ = swap_ui(template(name))
    graph = UIGraph(after)
    for scope in graph.subgraphs.values():
        for port in scope.body["inputs"] + scope.body["outputs"]:
            types = {link_view(scope.raw_links[lid])["type"] for lid in port["linkIds"]}
            assert types == {port["type"]}, port["name"]
    engine = {link_view(raw)["type"] for scope in graph.scopes() for raw in scope.raw_links.values()}
    assert engine & set(FAMILY.wire_types) == set()  # no MODEL/CLIP/VAE wire left in a fully swapped template
    assert engine >= set(FAMILY.wire_types.values())


@pytest.mark.parametrize("name", TEMPLATES)
def test_report(name):
    _, report = swap_ui(template(name))
    assert sorted((old, new) for _, old, new in report.changed) == sorted(
        (stock, role.ours) for stock, role in FAMILY.roles.items() if stock != "LoraLoaderModelOnly")
    assert ("57:28", "UNETLoader", "SwiftDiTZImageLoader") in report.changed
    left = {where: (kind, why) for where, kind, why in report.left}
    assert left["57:33"] == ("ConditioningZeroOut", "takes CONDITIONING, gives CONDITIONING, stays stock")
    assert left["35"] == ("MarkdownNote", "note")
    assert left["57:13"][0] == "EmptySD3LatentImage" and ("9", "SaveImage", SAVE) in report.changed
    assert report.retyped == 4
    text = "\n".join(report.lines())
    assert "57:3  KSampler -> SwiftDiTZImageSampler" in text and "ConditioningZeroOut" in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_swap_is_idempotent(name):
    once, _ = swap_ui(template(name))
    twice, report = swap_ui(once)
    assert twice == once and report.changed == [] and report.retyped == 0
    assert {why for _, kind, why in report.left if kind.startswith("SwiftDiT")} == {"already a SwiftDiT node"}


@pytest.mark.parametrize("name", TEMPLATES)
def test_api_swap_of_the_api_twin_is_our_api_graph(name, object_info):
    def body(prompt):  # _meta is a label the server ignores; an API swap keeps the stock title
        return {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in prompt.items()}
    stock_api = to_api(template(name), object_info)
    swapped, report = swap_api(stock_api)
    ours = to_api(swap_ui(template(name))[0], object_info)
    assert body(swapped) == body(ours)
    ui_changes = swap_ui(template(name))[1].changed
    assert {(old, new) for _, old, new in report.changed} == {(old, new) for _, old, new in ui_changes}
    assert swap_api(swapped)[0] == swapped
    sampler = next(n for n in all_nodes(template(name)) if n["type"] == "KSampler")
    assert stock_api["57:3"]["inputs"]["seed"] == sampler["widgets_values"][0]  # "randomize" is not a value
    assert stock_api["57:3"]["inputs"]["steps"] == 8
    assert "control_after_generate" not in stock_api["57:3"]["inputs"]


def test_not_a_z_image_graph_stays_stock():
    wf = template("image_z_image_turbo")
    loader = next(n for n in wf["definitions"]["subgraphs"][0]["nodes"] if n["type"] == "CLIPLoader")
    loader["widgets_values"][1] = "qwen_image"  # the same wiring with another text encoder family
    after, report = swap_ui(wf)
    assert report.changed == [] and after == wf
    why = {kind: reason for _, kind, reason in report.left}
    assert why["CLIPLoader"] == "type 'qwen_image' is not a Z-Image text encoder"
    assert why["KSampler"] == "its conditioning comes from no Z-Image text encoder"


def test_stock_consumer_keeps_the_model_path_stock(object_info):
    prompt = to_api(template("image_z_image_turbo"), object_info)
    prompt["99"] = {"class_type": "ModelMergeSimple",
                    "inputs": {"model1": ["57:28", 0], "model2": ["57:28", 0], "ratio": 1.0}}
    prompt["98"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["57:8", 0], "vae": ["57:29", 0]}}
    swapped, report = swap_api(prompt)
    kinds = {k: v["class_type"] for k, v in swapped.items()}
    assert [kinds[k] for k in ("57:28", "57:11", "57:3", "57:29", "57:8")] == \
        ["UNETLoader", "ModelSamplingAuraFlow", "KSampler", "VAELoader", "VAEDecode"]
    assert kinds["57:30"] == "SwiftDiTZImageTextEncoderLoader"
    assert kinds["57:27"] == "SwiftDiTZImageTextEncode"
    why = {where: reason for where, _, reason in report.left}
    assert why["57:28"] == "its MODEL also feeds stock ModelMergeSimple (99), which needs MODEL"
    assert why["57:3"].startswith("its model comes from stock")
    assert why["57:29"] == "its VAE also feeds stock VAEEncode (98), which needs VAE"


def test_unsupported_sampler_keeps_the_model_path_stock():
    wf = template("image_z_image_turbo")
    sampler = next(n for n in wf["definitions"]["subgraphs"][0]["nodes"] if n["type"] == "KSampler")
    sampler["widgets_values"][4] = "dpmpp_2m"
    after, report = swap_ui(wf)
    why = {where: reason for where, _, reason in report.left}
    assert why["57:3"] == "sampler_name 'dpmpp_2m' is not one SwiftDiT runs (euler, res_multistep)"
    assert {old for _, old, _ in report.changed} == {"CLIPLoader", "CLIPTextEncode", "VAELoader", "VAEDecode"}
    assert problems(after) == [] and stock_consumers_of_ours(after) == []


def test_validity_check_sees_broken_graphs():
    wf = template("image_z_image_turbo")
    sg = wf["definitions"]["subgraphs"][0]
    sg["links"][0]["type"] = "MODEL"          # a CONDITIONING link mistyped
    sg["nodes"][0]["outputs"][0]["links"] = []  # CLIPLoader forgets its link
    found = problems(wf)
    assert any("link 32 is MODEL" in p for p in found)
    assert any("not listed by its origin 30" in p for p in found)


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "swiftdit.cli", *map(str, args)], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=60)


def test_cli_swaps_and_refuses_to_overwrite(tmp_path, object_info):
    src = tmp_path / "stock.json"
    src.write_text(json.dumps(template("image_z_image_turbo_int8")))
    original = src.read_bytes()
    out = tmp_path / "ours.json"
    done = run_cli("swap", src, out)
    assert done.returncode == 0, done.stderr
    assert "57:28  UNETLoader -> SwiftDiTZImageLoader" in done.stdout and "ConditioningZeroOut" in done.stdout
    (tmp_path / "plain").touch()  # a file made as any program makes one: the user's umask, not mkstemp's 0600
    assert out.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777
    assert json.loads(out.read_text()) == swap_ui(json.loads(original))[0]
    written = out.read_bytes()
    again = run_cli("swap", src, out)
    assert again.returncode == 2 and "--overwrite" in again.stderr and out.read_bytes() == written
    same = run_cli("swap", src, src, "--overwrite")
    assert same.returncode == 2 and "input file" in same.stderr
    assert src.read_bytes() == original
    assert run_cli("swap", src, out, "--overwrite").returncode == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary files left

    api, api_out = tmp_path / "stock_api.json", tmp_path / "ours_api.json"
    done = run_cli("to-api", src, api, "--object-info", OBJECT_INFO)
    assert done.returncode == 0, done.stderr
    assert json.loads(api.read_text()) == to_api(json.loads(original), object_info)
    done = run_cli("swap", api, api_out, "--family", "z_image")
    assert done.returncode == 0 and "(api format)" in done.stdout
    assert json.loads(api_out.read_text()) == swap_api(json.loads(api.read_text()))[0]
    bad = run_cli("swap", tmp_path / "missing.json", tmp_path / "x.json")
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_lora_on_the_model_path_is_swapped(object_info):
    prompt = to_api(template("image_z_image_turbo"), object_info)
    prompt["97"] = {"class_type": "LoraLoaderModelOnly",
                    "inputs": {"model": ["57:28", 0], "lora_name": "style.safetensors",
                               "strength_model": 0.8}}
    prompt["57:11"]["inputs"]["model"] = ["97", 0]
    swapped, report = swap_api(prompt)
    assert swapped["97"] == {"class_type": "SwiftDiTZImageLoraLoaderModelOnly",
                             "inputs": prompt["97"]["inputs"]}
    assert swapped["57:28"]["inputs"] == {**prompt["57:28"]["inputs"], "linears": "as stored", "gpu_budget_gb": 0}
    assert len(report.changed) == 9


def test_reroute_on_an_engine_wire_is_retyped(object_info):
    wf = template("image_z_image_turbo")
    sg = wf["definitions"]["subgraphs"][0]
    # UNETLoader#28 -> Reroute#62 -> ModelSamplingAuraFlow#11 (link 26 now ends at the reroute, 76 leaves it)
    sg["nodes"].append({"id": 62, "type": "Reroute", "pos": [700, 230], "size": [75, 26], "flags": {},
                        "order": 9, "mode": 0, "inputs": [{"name": "", "type": "*", "link": 26}],
                        "outputs": [{"name": "", "type": "MODEL", "links": [76]}],
                        "properties": {"showOutputText": False, "horizontal": False}})
    link26 = next(link for link in sg["links"] if link["id"] == 26)
    link26.update(target_id=62, target_slot=0)
    sg["links"].append({"id": 76, "origin_id": 62, "origin_slot": 0, "target_id": 11, "target_slot": 0,
                        "type": "MODEL"})
    next(n for n in sg["nodes"] if n["id"] == 11)["inputs"][0]["link"] = 76
    assert problems(wf) == []
    after, report = swap_ui(wf)
    assert problems(after) == [] and len(report.changed) == 8
    reroute = next(n for n in after["definitions"]["subgraphs"][0]["nodes"] if n["id"] == 62)
    assert reroute["outputs"][0]["type"] == "SWIFTDIT_MODEL" and reroute["inputs"][0]["type"] == "*"
    assert to_api(after, object_info)["57:11"]["inputs"]["model"] == ["57:28", 0]


def test_cli_explains_bad_input(tmp_path):
    src = tmp_path / "stock.json"
    src.write_text(json.dumps(template("image_z_image_turbo")))
    wrong = run_cli("swap", src, tmp_path / "out.json", "--format", "api")
    assert wrong.returncode == 2 and "ui-format workflow, not api format" in wrong.stderr
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    done = run_cli("swap", junk, tmp_path / "out.json")
    assert done.returncode == 2 and "not a ComfyUI workflow" in done.stderr
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"SaveImage": {}}))
    done = run_cli("to-api", src, tmp_path / "api.json", "--object-info", info)
    assert done.returncode == 2 and "is not in object_info" in done.stderr
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "api.json").exists()


# FLUX.3 Klein: the official distilled templates (t2i: subgraph #18 with the 9B prompt upsampler; edit: flat,
# ReferenceMultiLatent). docs/nodes.md, "FLUX.3 Klein".
KLEIN = FAMILIES["flux3_klein"]
KLEIN_TEMPLATES = ("image_flux3_klein_distilled_t2i", "image_flux3_klein_distilled_image_edit")
KLEIN_OBJECT_INFO = ROOT / "tests" / "fixtures" / "object_info_flux3_klein.json"
KLEIN_EXTRA = {"SwiftDiTFlux3KleinLoader": ["as stored", 0], "SwiftDiTFlux3KleinSampler": [0.3, 0]}
# What each template swaps (API-style ids) and what stays of the family's roles, with the reason.
KLEIN_CHANGED = {
    "image_flux3_klein_distilled_t2i": {
        "18:1": "SwiftDiTFlux3KleinLoader", "18:2": "SwiftDiTFlux3KleinTextEncoderLoader",
        "18:3": "SwiftDiTFlux3KleinVAELoader", "18:4": "SwiftDiTFlux3KleinTextEncode",
        "18:5": "SwiftDiTFlux3KleinTextEncode", "18:7": "SwiftDiTFlux3KleinSampler",
        "18:8": "SwiftDiTFlux3KleinVAEDecode", "9": SAVE},
    "image_flux3_klein_distilled_image_edit": {
        "1": "SwiftDiTFlux3KleinLoader", "2": "SwiftDiTFlux3KleinTextEncoderLoader",
        "4": "SwiftDiTFlux3KleinTextEncode", "7": "SwiftDiTFlux3KleinSampler", "9": SAVE},
}
KLEIN_LEFT = {
    "image_flux3_klein_distilled_t2i": {
        "18:12": ("CLIPLoader", "its CLIP also feeds stock TextGenerate (18:11), which needs CLIP"),
        "18:6": ("EmptyFlux2LatentImage", "gives LATENT, stays stock"),
        "18:11": ("TextGenerate", "takes CLIP, IMAGE, AUDIO, STRING, gives STRING, stays stock")},
    "image_flux3_klein_distilled_image_edit": {
        "3": ("VAELoader", "its VAE also feeds stock ReferenceMultiLatent (17), which needs VAE"),
        "8": ("VAEDecode", "its vae comes from stock VAELoader (3)"),
        "46": ("CLIPLoader", "its CLIP also feeds stock TextGenerate (47), which needs CLIP"),
        "17": ("ReferenceMultiLatent", "takes CONDITIONING, VAE, IMAGE, gives CONDITIONING, LATENT, stays stock"),
        "32": ("ConditioningZeroOut", "takes CONDITIONING, gives CONDITIONING, stays stock")},
}


def test_klein_family_table_is_the_contract():
    docs = contract("SwiftDiTFlux3Klein")
    assert {stock: role.ours for stock, role in KLEIN.roles.items()} == {s: o for s, (o, _) in
                                                                         (docs | contract(SAVE)).items()}
    for ours, out in docs.values():
        assert KLEIN.output_type(ours, 0) == out, ours
    assert [name for name, _ in KLEIN.roles["KSampler"].extra_widgets] == ["cache", "refresh"]


@pytest.mark.parametrize("name", KLEIN_TEMPLATES)
def test_klein_templates_swap(name):
    before = template(name)
    assert problems(before) == []
    after, report = swap_ui(before, "flux3_klein")
    assert {where: new for where, _, new in report.changed} == KLEIN_CHANGED[name]
    left = {where: (kind, why) for where, kind, why in report.left}
    for where, expected in KLEIN_LEFT[name].items():
        assert left[where] == expected, where
    assert problems(after) == []  # links <-> slots both ways, types equal on both ends, subgraph ports
    assert stock_consumers_of_ours(after, KLEIN) == []
    assert link_ends(after) == link_ends(before)
    old = {n["id"]: n for n in all_nodes(before)}
    for node in all_nodes(after):
        values, kept = node.get("widgets_values"), old[node["id"]].get("widgets_values")
        if kept is None:
            assert values is None, node["id"]
            continue
        assert values[:len(kept)] == kept and values[len(kept):] == KLEIN_EXTRA.get(node["type"], []), node["id"]
        assert [e.get("link") for e in node.get("inputs", [])] == [e.get("link") for e in old[node["id"]]["inputs"]]
    assert stock_view(after, KLEIN) == stock_view(before, KLEIN)  # nothing else moved
    twice, again = swap_ui(after, "flux3_klein")
    assert twice == after and again.changed == [] and again.retyped == 0
    assert {why for _, kind, why in again.left if kind.startswith("SwiftDiT")} == {"already a SwiftDiT node"}


def test_klein_t2i_subgraph_declarations_follow_the_wires():
    after, report = swap_ui(template("image_flux3_klein_distilled_t2i"), "flux3_klein")
    graph = UIGraph(after)
    for scope in graph.subgraphs.values():
        for port in scope.body["inputs"] + scope.body["outputs"]:
            types = {link_view(scope.raw_links[lid])["type"] for lid in port["linkIds"]}
            assert types == {port["type"]}, port["name"]
    engine = {link_view(raw)["type"] for scope in graph.scopes() for raw in scope.raw_links.values()}
    assert engine >= set(KLEIN.wire_types.values())
    assert engine & set(KLEIN.wire_types) == {"CLIP"}  # the upsampler's loader -> TextGenerate stays stock
    assert report.retyped == 4


def test_a_z_image_swap_leaves_klein_alone_and_back():
    for name in KLEIN_TEMPLATES:
        after, report = swap_ui(template(name))  # the default family: z_image
        assert report.changed == [] and after == template(name)
    after, report = swap_ui(template("image_z_image_turbo"), "flux3_klein")
    assert report.changed == []
    assert {why for _, kind, why in report.left if kind == "CLIPLoader"} == \
        {"type 'lumina2' is not a FLUX.3 Klein text encoder"}


def test_klein_sampler_values_we_do_not_run_stay_stock():
    wf = template("image_flux3_klein_distilled_image_edit")
    sampler = next(n for n in wf["nodes"] if n["type"] == "KSampler")
    sampler["widgets_values"][4] = "er_sde"
    after, report = swap_ui(wf, "flux3_klein")
    why = {where: reason for where, _, reason in report.left}
    assert why["7"] == "sampler_name 'er_sde' is not one SwiftDiT runs (euler)"
    assert {old for _, old, _ in report.changed} == {"CLIPLoader", "CLIPTextEncode"}
    assert problems(after) == [] and stock_consumers_of_ours(after, KLEIN) == []
    sampler["widgets_values"][4], sampler["widgets_values"][6] = "euler", 0.75  # image to image: ours runs it
    after, report = swap_ui(wf, "flux3_klein")
    assert "7" not in {where for where, _, _ in report.left}
    ours = next(n for n in after["nodes"] if n["id"] == 7)
    assert ours["type"] == "SwiftDiTFlux3KleinSampler" and ours["widgets_values"][6] == 0.75


def stock_klein_workflow(name: str) -> dict:
    """workflows/<name>.json with every one of our nodes turned back into the stock node it replaces."""
    return stock_view(json.loads((ROOT / "workflows" / f"{name}.json").read_text()), KLEIN)


@pytest.mark.parametrize("name", ("flux3_klein_t2i", "flux3_klein_edit"))
def test_klein_stock_form_of_our_workflows_swaps_back(name):
    def body(prompt):
        return {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in prompt.items()}
    info = json.loads(KLEIN_OBJECT_INFO.read_text())
    ours = json.loads((ROOT / "workflows" / f"{name}.json").read_text())
    stock = stock_klein_workflow(name)
    assert not [n["type"] for n in all_nodes(stock) if n["type"].startswith("SwiftDiT")]
    swapped, report = swap_ui(stock, "flux3_klein")
    assert problems(swapped) == [] and report.left and all(k not in KLEIN.roles for _, k, _ in report.left)
    assert body(to_api(swapped, info)) == body(to_api(ours, info))
    api, api_report = swap_api(to_api(stock, info), "flux3_klein")
    assert body(api) == body(json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text()))
    assert sorted(api_report.changed) == sorted(report.changed)
    assert swap_api(api, "flux3_klein")[0] == api
    if name == "flux3_klein_edit":  # the reference image's VAEEncode feeds ReferenceLatent: ours
        assert ("13", "VAEEncode", "SwiftDiTFlux3KleinVAEEncode") in report.changed


def test_klein_vae_encode_outside_the_conditioning_stays_stock():
    info = json.loads(KLEIN_OBJECT_INFO.read_text())
    prompt = to_api(stock_klein_workflow("flux3_klein_edit"), info)
    prompt["7"]["inputs"].update(positive=["4", 0], negative=["32", 0])  # references unplugged
    del prompt["14"], prompt["15"]
    swapped, report = swap_api(prompt, "flux3_klein")
    why = {where: reason for where, _, reason in report.left}
    assert why["13"] == "its latent reaches the conditioning of no FLUX.3 Klein sampler"
    assert why["3"] == "its VAE also feeds stock VAEEncode (13), which needs VAE"
    assert why["8"] == "its vae comes from stock VAELoader (3)"
    assert swapped["7"]["class_type"] == "SwiftDiTFlux3KleinSampler"
    assert swapped["7"]["inputs"]["cache"] == 0.3 and swapped["7"]["inputs"]["refresh"] == 0


def test_cli_swaps_a_klein_template(tmp_path):
    src = tmp_path / "stock.json"
    src.write_text(json.dumps(template("image_flux3_klein_distilled_t2i")))
    out = tmp_path / "ours.json"
    done = run_cli("swap", src, out, "--family", "flux3_klein")
    assert done.returncode == 0, done.stderr
    assert "18:7  KSampler -> SwiftDiTFlux3KleinSampler" in done.stdout and "TextGenerate" in done.stdout
    assert json.loads(out.read_text()) == swap_ui(template("image_flux3_klein_distilled_t2i"), "flux3_klein")[0]

    auto = tmp_path / "auto.json"
    done = run_cli("swap", src, auto, "--family", "auto")
    assert done.returncode == 0 and "FLUX.3 Klein: swapped 8 node(s)" in done.stdout
    assert auto.read_bytes() == out.read_bytes()
    z_src, z_out = tmp_path / "z.json", tmp_path / "z_ours.json"
    z_src.write_text(json.dumps(template("image_z_image_turbo")))
    done = run_cli("swap", z_src, z_out, "--family", "auto")
    assert done.returncode == 0 and "Z-Image: swapped 8 node(s)" in done.stdout
    default = tmp_path / "default.json"  # the family is found without --family
    done = run_cli("swap", src, default)
    assert done.returncode == 0 and default.read_bytes() == out.read_bytes()


def test_cli_says_when_there_is_nothing_to_swap(tmp_path):
    """A graph of no family we run (or of another family than --family names): nothing written, a non-zero exit."""
    src = tmp_path / "stock.json"
    src.write_text(json.dumps(template("image_flux3_klein_distilled_t2i")))
    done = run_cli("swap", src, tmp_path / "out.json", "--family", "z_image")
    assert done.returncode == 2 and "nothing to swap: it holds no Z-Image graph" in done.stderr
    ours = tmp_path / "ours.json"
    ours.write_text((ROOT / "workflows" / "z_image_turbo_t2i.json").read_text())  # already ours
    done = run_cli("swap", ours, tmp_path / "out.json")
    assert done.returncode == 2 and "nothing to swap" in done.stderr and "FLUX.3 Klein" in done.stderr
    assert not (tmp_path / "out.json").exists()


# Krea 2: the official t2i templates (subgraph #30: a LoRA behind ComfySwitchNode #22 on the model path, one
# CLIPLoader #11 feeding both the prompt refiner TextGenerate #16 and CLIPTextEncode #6; qwen_image_vae decodes with
# stock nodes). docs/nodes.md, "Krea 2".
KREA2 = FAMILIES["krea2"]
KREA2_TEMPLATES = ("image_krea2_turbo_t2i_int8", "image_krea2_turbo_t2i")
KREA2_STYLE = "image_krea2_turbo_int8_image_style_reference"
KREA2_CHANGED = {"30:10": "SwiftDiTKrea2Loader", "30:15": "SwiftDiTKrea2LoraLoaderModelOnly",
                 "30:6": "SwiftDiTKrea2TextEncode", "30:3": "SwiftDiTKrea2Sampler", "30:8": "SwiftDiTKrea2VAEDecode",
                 "29": SAVE}
KREA2_LEFT = {
    "30:11": ("CLIPLoader", "kept for stock TextGenerate (30:16), which needs ComfyUI's CLIP; the encode path reads "
                            "SwiftDiTKrea2TextEncoderLoader from the same file (added)"),
    "30:22": ("ComfySwitchNode", "switches between SwiftDiT models: stays stock, its model ports retyped"),
    "30:12": ("VAELoader", "Krea 2's VAE is the stock loader's (SwiftDiTKrea2VAEDecode reads its weights), stays "
                           "stock"),
    "30:16": ("TextGenerate", "takes CLIP, IMAGE, AUDIO, gives STRING, stays stock")}


def sg_node(wf: dict, node_id: int) -> dict:
    return next(n for n in wf["definitions"]["subgraphs"][0]["nodes"] if n["id"] == node_id)


KREA2_HOST_TWINS = ("FluxKontextMultiReferenceLatentMethod",)  # ours only for --for-host (v0.3.75 lacks its value)


def test_krea2_family_table_is_the_contract():
    docs = {s: v for s, v in contract("SwiftDiTKrea2").items() if s not in KREA2_HOST_TWINS}
    assert {stock: role.ours for stock, role in KREA2.roles.items()} == {s: o for s, (o, _) in
                                                                         (docs | contract(SAVE)).items()}
    for ours, out in docs.values():
        assert KREA2.output_type(ours, 0) == out, ours
    assert KREA2.vae_loader is None and KREA2.decoders == ("VAEDecode",)  # ours reads the stock loader's VAE


@pytest.mark.parametrize("name", KREA2_TEMPLATES)
def test_krea2_t2i_templates_swap(name):
    before = template(name)
    assert problems(before) == []
    after, report = swap_ui(before, "krea2")
    assert {where: new for where, _, new in report.changed} == KREA2_CHANGED
    left = {where: (kind, why) for where, kind, why in report.left}
    for where, expected in KREA2_LEFT.items():
        assert left[where] == expected, where
    [(where, added, _)] = report.added
    assert added == "SwiftDiTKrea2TextEncoderLoader"
    assert problems(after) == []  # links <-> slots both ways, types equal on both ends, subgraph ports
    # the switch carries our model; no other stock node takes or gives one of our types
    assert stock_consumers_of_ours(after, KREA2) == ["22 ComfySwitchNode"]
    old = {n["id"]: n for n in all_nodes(before)}
    for node in all_nodes(after):
        if node["id"] not in old:
            continue
        values, kept = node.get("widgets_values"), old[node["id"]].get("widgets_values")
        extra = ["as stored", 0] if node["type"] == "SwiftDiTKrea2Loader" else []
        assert values == (kept + extra if kept is not None else None), node["id"]
    # every link kept, except the encode's clip, which now comes from the added loader
    new_id = int(where.split(":")[1])
    ends, was = link_ends(after), link_ends(before)
    moved = {k for k in was if ends.get(k) != was[k]}
    assert [was[k][2] for k in moved] == [6] and all(ends[k][0] == new_id for k in moved)
    twice, again = swap_ui(after, "krea2")
    assert twice == after and again.changed == [] and again.added == [] and again.retyped == 0


def test_krea2_added_text_encoder_loader_reads_what_the_stock_one_reads():
    before = template("image_krea2_turbo_t2i_int8")
    after, report = swap_ui(before, "krea2")
    sg = after["definitions"]["subgraphs"][0]
    stock, ours = sg_node(after, 11), sg_node(after, int(report.added[0][0].split(":")[1]))
    assert stock["type"] == "CLIPLoader" and stock == sg_node(before, 11) | {"outputs": stock["outputs"]}
    assert ours["widgets_values"] == stock["widgets_values"] == ["qwen3vl_4b_fp8_scaled.safetensors", "krea2",
                                                                 "default"]
    assert ours["properties"]["cnr_id"] == "comfyui-swiftdit"
    links = {link["id"]: link for link in sg["links"]}
    # its clip_name is wired to the same promoted subgraph input (clip_name_1) as the stock loader's
    origin = {e["name"]: links[e["link"]]["origin_slot"] for e in ours["inputs"] if e.get("link") is not None}
    assert origin == {"clip_name": links[stock["inputs"][0]["link"]]["origin_slot"]}
    assert [links[lid]["target_id"] for lid in stock["outputs"][0]["links"]] == [16]  # TextGenerate only
    assert [links[lid]["target_id"] for lid in ours["outputs"][0]["links"]] == [6]
    assert ours["outputs"][0]["type"] == "SWIFTDIT_TEXT_ENCODER"
    assert sg_node(after, 22)["outputs"][0]["type"] == "SWIFTDIT_MODEL"
    assert [e["type"] for e in sg_node(after, 22)["inputs"]] == ["SWIFTDIT_MODEL", "SWIFTDIT_MODEL", "BOOLEAN"]


def krea2_api() -> dict:
    """The t2i template's subgraph as an API prompt (its widget values, the refiner and the LoRA switch kept)."""
    return {
        "10": {"class_type": "UNETLoader", "inputs": {"unet_name": "krea2_turbo_int8_convrot.safetensors",
                                                       "weight_dtype": "default"}},
        "15": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["10", 0], "strength_model": 0.8,
                                                                "lora_name": "krea2_darkbrush.safetensors"}},
        "22": {"class_type": "ComfySwitchNode", "inputs": {"switch": True, "on_false": ["10", 0],
                                                            "on_true": ["15", 0]}},
        "11": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen3vl_4b_fp8_scaled.safetensors",
                                                       "type": "krea2", "device": "default"}},
        "16": {"class_type": "TextGenerate", "inputs": {"clip": ["11", 0], "prompt": "a yeti", "max_length": 512}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["11", 0], "text": ["16", 0]}},
        "13": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["6", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["22", 0], "positive": ["6", 0], "negative": ["13", 0], "latent_image": ["5", 0], "seed": 7,
            "steps": 8, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "denoise": 1}},
        "12": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["12", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "Krea2_turbo"}},
    }


def test_krea2_api_swap():
    prompt = krea2_api()
    swapped, report = swap_api(prompt, "krea2")
    kinds = {k: v["class_type"] for k, v in swapped.items()}
    changed = {k.split(":")[-1]: v for k, v in KREA2_CHANGED.items() if k != "29"} | {"9": SAVE}
    assert {k: kinds[k] for k in ("10", "15", "6", "3", "8", "9")} == changed
    assert [kinds[k] for k in ("22", "11", "16", "13", "12")] == [
        "ComfySwitchNode", "CLIPLoader", "TextGenerate", "ConditioningZeroOut", "VAELoader"]
    assert report.added == [("23", "SwiftDiTKrea2TextEncoderLoader",
                             "beside stock CLIPLoader (11), which stays for what needs ComfyUI's CLIP")]
    assert swapped["23"] == {"class_type": "SwiftDiTKrea2TextEncoderLoader", "inputs": prompt["11"]["inputs"]}
    assert swapped["6"]["inputs"] == {"clip": ["23", 0], "text": ["16", 0]} and swapped["16"]["inputs"]["clip"] == ["11", 0]
    assert swapped["10"]["inputs"] == {**prompt["10"]["inputs"], "linears": "as stored", "gpu_budget_gb": 0}
    ui = swap_ui(template("image_krea2_turbo_t2i_int8"), "krea2")[1]
    assert {(old, new) for _, old, new in report.changed} == {(old, new) for _, old, new in ui.changed}
    assert swap_api(swapped, "krea2")[0] == swapped


def test_krea2_switch_with_a_stock_branch_keeps_the_model_path_stock():
    prompt = krea2_api()
    prompt["20"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}}
    prompt["22"]["inputs"]["on_false"] = ["20", 0]
    swapped, report = swap_api(prompt, "krea2")
    why = {where: reason for where, _, reason in report.left}
    assert why["3"] == "its model comes through stock CheckpointLoaderSimple (20)"
    assert [swapped[k]["class_type"] for k in ("10", "15", "3")] == ["UNETLoader", "LoraLoaderModelOnly", "KSampler"]
    prompt = krea2_api()  # the switch also feeds a stock node: what it passes stays stock
    prompt["21"] = {"class_type": "ModelMergeSimple", "inputs": {"model1": ["22", 0], "model2": ["22", 0],
                                                                 "ratio": 1.0}}
    swapped, report = swap_api(prompt, "krea2")
    why = {where: reason for where, _, reason in report.left}
    assert why["10"] == ("its MODEL reaches stock ModelMergeSimple (21) through ComfySwitchNode (22), which needs "
                         "MODEL")
    assert [swapped[k]["class_type"] for k in ("10", "15", "3")] == ["UNETLoader", "LoraLoaderModelOnly", "KSampler"]


KREA2_STYLE_CHANGED = {"30:10": "SwiftDiTKrea2Loader", "30:15": "SwiftDiTKrea2LoraLoaderModelOnly",
                       "30:52": "SwiftDiTKrea2TextEncodeQwenImageEditPlus", "30:64": "SwiftDiTKrea2ModelSamplingFlux",
                       "30:77": "SwiftDiTKrea2Sampler", "30:62": "SwiftDiTKrea2VAEDecode", "29": SAVE}


def test_krea2_style_reference_swaps(tmp_path):
    """The style-reference template: TextEncodeQwenImageEditPlus -> ours (its VAE, the stock qwen_image_vae, and its
    picture stay stock wires), FluxKontextMultiReferenceLatentMethod stays stock between it and the guider, the
    SamplerCustomAdvanced group (RandomNoise, CFGGuider cfg 1, KSamplerSelect euler, BasicScheduler simple 8) becomes
    our sampler with the promoted seed still wired; the CLIPLoader that also feeds TextGenerate stays stock beside
    ours. The CLI takes it without --family."""
    wf = template(KREA2_STYLE)
    after, report = swap_ui(wf, "krea2")
    assert report.not_yet == [] and problems(after) == []
    assert {where: new for where, _, new in report.changed} == KREA2_STYLE_CHANGED
    [(where, what)] = report.folded
    assert where == "30:77" and what.startswith("RandomNoise, CFGGuider, KSamplerSelect (euler), BasicScheduler "
                                                "(simple) and SamplerCustomAdvanced -> one KSampler")
    [(added_at, added, _)] = report.added
    assert added == "SwiftDiTKrea2TextEncoderLoader"
    left = {where: (kind, why) for where, kind, why in report.left}
    assert left["30:53"] == ("FluxKontextMultiReferenceLatentMethod", "takes CONDITIONING, gives CONDITIONING, "
                                                                      "stays stock")
    assert left["30:12"][0] == "VAELoader"  # (its VAE encodes the references and decodes, both by ours)
    sampler, encode = sg_node(after, 77), sg_node(after, 52)
    assert sampler["widgets_values"] == [355028178891957, "randomize", 8, 1, "euler", "simple", 1.0]
    assert [(e["name"], e["type"]) for e in encode["inputs"] if not e.get("widget")] == [
        ("clip", "SWIFTDIT_TEXT_ENCODER"), ("vae", "VAE"), ("image1", "IMAGE"), ("image2", "IMAGE"),
        ("image3", "IMAGE")]
    links = {link["id"]: link for link in after["definitions"]["subgraphs"][0]["links"]}
    origin = lambda node, name: links[next(e["link"] for e in node["inputs"] if e["name"] == name)]  # noqa: E731
    assert origin(sampler, "seed")["origin_id"] == -10  # the promoted noise_seed
    assert origin(sampler, "positive")["origin_id"] == 53 and origin(sampler, "model")["origin_id"] == 64
    assert origin(encode, "clip")["origin_id"] == int(added_at.split(":")[1])
    assert stock_consumers_of_ours(after, KREA2) == []
    twice, again = swap_ui(after, "krea2")
    assert twice == after and again.changed == [] and again.added == []
    src, out = tmp_path / "style.json", tmp_path / "out.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, out)
    assert done.returncode == 0, done.stderr
    assert "Krea 2: swapped 7 node(s)" in done.stdout and json.loads(out.read_text()) == after


def test_krea2_style_reference_for_host():
    """--for-host: ResolutionSelector's 1024 x 1024 written in, the refiner (off) and its switch gone, so the one
    CLIPLoader becomes ours; FluxKontextMultiReferenceLatentMethod's index_timestep_zero, which v0.3.75's lacks, on
    the pack's twin; every node type the host has or ours."""
    from swiftdit.for_host import HOST_LACKS, swap_for_host
    after, report, host = swap_for_host(template(KREA2_STYLE), "krea2")
    assert {where: new for where, _, new in report.changed} == {**KREA2_STYLE_CHANGED,
                                                                "30:11": "SwiftDiTKrea2TextEncoderLoader"}
    assert report.added == []
    changes = {where: (kind, what) for where, kind, what, _ in host.changes}
    assert changes["30:53"] == ("FluxKontextMultiReferenceLatentMethod", "-> SwiftDiTKrea2ReferenceLatentMethod")
    assert changes["30:16"][0] == "TextGenerate"
    assert sg_node(after, 53)["widgets_values"] == ["index_timestep_zero"]
    kinds = {n["type"] for n in all_nodes(after) if n.get("mode") not in (2, 4)}
    assert not kinds & HOST_LACKS


def test_other_families_leave_krea2_alone():
    for name in (*KREA2_TEMPLATES, KREA2_STYLE):
        for family in ("z_image", "flux3_klein"):
            after, report = swap_ui(template(name), family)
            assert report.changed == [] and report.added == [] and after == template(name)
    after, report = swap_ui(template("image_z_image_turbo"), "krea2")
    assert report.changed == [] and {why for _, kind, why in report.left if kind == "CLIPLoader"} == \
        {"type 'lumina2' is not a Krea 2 text encoder"}


def test_cli_swaps_a_krea2_template(tmp_path):
    src, out = tmp_path / "stock.json", tmp_path / "ours.json"
    src.write_text(json.dumps(template("image_krea2_turbo_t2i_int8")))
    done = run_cli("swap", src, out)  # the family is found without --family
    assert done.returncode == 0, done.stderr
    assert "Krea 2: swapped 6 node(s)" in done.stdout and "added 1 node(s)" in done.stdout
    assert "30:3  KSampler -> SwiftDiTKrea2Sampler" in done.stdout
    assert json.loads(out.read_text()) == swap_ui(template("image_krea2_turbo_t2i_int8"), "krea2")[0]



def test_krea2_refiner_on_reduces_to_the_users_prompt(tmp_path):
    """--for-host with the template's refiner on (as it ships): v0.3.75 has no TextGenerate, whose prompt input is
    the system prompt joined to the user's (StringConcatenate); the encode reads what the refiner switch passes with
    the refiner off, the user's prompt, and the CLI's report says the refiner was reduced."""
    src, out = tmp_path / "stock.json", tmp_path / "ours.json"
    src.write_text(json.dumps(template("image_krea2_turbo_t2i_int8")))
    done = run_cli("swap", "--for-host", src, out)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if "TextGenerate" in x]
    assert line.startswith("  30:16  TextGenerate: skipped, prompt refiner reduced: what read its generated text "
                           "now reads PrimitiveStringMultiline 30:19") and "has no TextGenerate" in line
    info = json.loads((ROOT / "tests" / "fixtures" / "object_info_krea2.json").read_text())
    api = to_api(json.loads(out.read_text()), info)
    assert api["30:6"]["inputs"]["text"] == ["30:19", 0]  # PreviewAny passed on: the user's prompt itself
    assert "30:17" not in api and "30:18" not in api  # the concatenation and the refiner's system prompt are gone


H3_TEMPLATES = ("video_fastvideo_fasth3_t2v",)


@pytest.mark.parametrize("name", H3_TEMPLATES)
def test_minimax_h3_templates_are_not_yet_swapped(name, tmp_path):
    """H3's row (issue 35): its templates with BlockSparseAttention (FastH3) are left as they are, and the CLI says
    so and writes nothing."""
    wf = template(name)
    after, report = swap_ui(wf, "minimax_h3")
    assert after == wf and report.changed == [] and report.added == []
    assert len(report.not_yet) == 1 and "not yet supported (issue 35)" in report.not_yet[0]
    src = tmp_path / "h3.json"
    src.write_text(json.dumps(wf))
    for family in ("minimax_h3", "auto"):
        done = run_cli("swap", src, tmp_path / "out.json", "--family", family)
        assert done.returncode == 2 and "nothing swapped: MiniMax H3's templates" in done.stderr
        assert "issue 35" in done.stderr and not (tmp_path / "out.json").exists()


def without_node(wf: dict, node_type: str) -> dict:
    """wf with its subgraph's one node_type node taken out, its model input wired straight to what it fed."""
    wf = copy.deepcopy(wf)
    sg = wf["definitions"]["subgraphs"][0]
    node = next(n for n in sg["nodes"] if n["type"] == node_type)
    (into,) = [link for link in sg["links"] if link["target_id"] == node["id"]]
    origin = next(n for n in sg["nodes"] if n["id"] == into["origin_id"])
    outs = origin["outputs"][into["origin_slot"]]["links"]
    outs.remove(into["id"])
    for link in sg["links"]:
        if link["origin_id"] == node["id"]:
            link["origin_id"], link["origin_slot"] = into["origin_id"], into["origin_slot"]
            outs.append(link["id"])
    sg["links"].remove(into)
    sg["nodes"].remove(node)
    return wf


def test_minimax_h3_sigma_shift_is_swapped():
    """MiniMaxH3SigmaShift -> ours, its two shifts kept (FastH3's template less its block-sparse attention)."""
    wf = without_node(template("video_fastvideo_fasth3_t2v"), "BlockSparseAttention")
    after, report = swap_ui(wf, "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    (shift,) = [n for n in after["definitions"]["subgraphs"][0]["nodes"] if "SigmaShift" in n["type"]]
    assert shift["type"] == "SwiftDiTMiniMaxH3SigmaShift" and shift["widgets_values"] == [10, 3]


def test_minimax_h3_r2v_template_is_swapped(tmp_path):
    """Issue 35: the reference-to-video template: MiniMaxH3ReferenceToVideo -> ours, its autogrow inputs
    ref_images.ref_image_N as ours names them (ref_image_N), links and slots kept (the unwired video inputs ours
    lacks taken away, the later slots moved up); the audio VAE's loader feeds both the audio decode and the
    node's audio_vae, so it is our audio VAE loader; the group with its scheduler on the loader's model (above the
    LoRA switch) folds into our sampler."""
    wf = template("video_minimax_h3_r2v")
    after, report = swap_ui(wf, "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTMiniMaxH3{r}" for r in ("VAELoader", "AudioVAELoader", "VAEDecodeAudio", "VAEDecode", "Loader",
                                          "LoraLoaderModelOnly", "TextEncoderLoader", "ReferenceToVideo", "Sampler"))
    r2v = next(n for n in after["nodes"] if n["id"] == 136)
    assert r2v["type"] == "SwiftDiTMiniMaxH3ReferenceToVideo" and r2v["widgets_values"] == ["", 1344, 768, 124,
                                                                                             "match"]
    names = [e["name"] for e in r2v["inputs"]]
    assert names == ["clip", "vae", "audio_vae", "ref_image_0", "ref_image_1", "ref_image_2", "ref_video_0",
                     "ref_video_audio_0", "ref_audio_0", "prompt", "width", "height", "length"]
    before = next(n for n in wf["nodes"] if n["id"] == 136)
    old_slots = {e["link"]: e["name"] for e in before["inputs"] if e.get("link") is not None}
    new_slots = {e["link"]: e["name"] for e in r2v["inputs"] if e.get("link") is not None}
    assert {k: v.split(".")[-1] for k, v in old_slots.items()} == new_slots  # the same links, by our names
    for link in (lk for lk in after["links"] if lk[3] == 136):
        assert r2v["inputs"][link[4]]["link"] == link[0]
    assert next(n for n in after["nodes"] if n["id"] == 120)["type"] == "SwiftDiTMiniMaxH3AudioVAELoader"
    twice, again = swap_ui(after, "minimax_h3")
    assert twice == after and again.changed == []
    src, out = tmp_path / "h3.json", tmp_path / "out.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, out)
    assert done.returncode == 0, done.stderr
    assert "MiniMax H3: swapped 9 node(s)" in done.stdout and json.loads(out.read_text()) == after


def test_minimax_h3_r2v_for_host():
    """--for-host: the size, length and switches written in (864 x 480, 124 frames, LoRA off), then the swap; what
    is left is all the host has or ours."""
    from swiftdit.for_host import HOST_LACKS, swap_for_host
    after, report, host = swap_for_host(template("video_minimax_h3_r2v"), "minimax_h3")
    r2v = next(n for n in after["nodes"] if n["id"] == 136)
    assert r2v["type"] == "SwiftDiTMiniMaxH3ReferenceToVideo" and r2v["widgets_values"] == ["", 864, 480, 124,
                                                                                             "match"]
    kinds = {n["type"] for n in after["nodes"]}
    assert not kinds & HOST_LACKS and not any(k.startswith("MiniMaxH3") for k in kinds)


def with_reference_video(wf: dict, slot_name: str) -> dict:
    """The r2v template with a LoadImage's frames (node 139) wired into its node's slot_name as well."""
    wf = copy.deepcopy(wf)
    r2v = next(n for n in wf["nodes"] if n["id"] == 136)
    slot = next(i for i, e in enumerate(r2v["inputs"]) if e["name"] == slot_name)
    r2v["inputs"][slot]["link"] = 999
    next(n for n in wf["nodes"] if n["id"] == 139)["outputs"][0]["links"].append(999)
    wf["links"].append([999, 139, 0, 136, slot, "IMAGE"])
    return wf


def test_minimax_h3_r2v_reference_video_is_swapped():
    """A reference video wired into the r2v node: ours takes it as ref_video_0, the link kept."""
    after, report = swap_ui(with_reference_video(template("video_minimax_h3_r2v"), "ref_videos.ref_video_0"),
                            "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    r2v = next(n for n in after["nodes"] if n["id"] == 136)
    assert next(e for e in r2v["inputs"] if e["name"] == "ref_video_0")["link"] == 999


def test_minimax_h3_r2v_more_videos_than_ours_is_refused(tmp_path):
    """A fourth reference video (ours takes ref_video_0..2): the graph stays as it is, saying why."""
    wf = template("video_minimax_h3_r2v")
    wf = copy.deepcopy(wf)
    r2v = next(n for n in wf["nodes"] if n["id"] == 136)
    r2v["inputs"].insert(7, {"name": "ref_videos.ref_video_3", "type": "IMAGE", "link": None})
    for link in wf["links"]:  # the slots after the new one move down
        if link[3] == 136 and link[4] >= 7:
            link[4] += 1
    wf = with_reference_video(wf, "ref_videos.ref_video_3")
    after, report = swap_ui(wf, "minimax_h3")
    assert after == wf and report.changed == []
    assert report.not_yet == ["MiniMax H3's Reference To Video takes ref_video_0..2 (and their ref_video_audio_0..2) "
                              "in SwiftDiT: a graph wiring more reference videos is not swapped (issue 35)"]
    src = tmp_path / "h3.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, tmp_path / "out.json")
    assert done.returncode == 2 and "reference videos" in done.stderr and not (tmp_path / "out.json").exists()


def test_minimax_h3_r2v_api_inputs_take_our_names():
    prompt = {"1": {"class_type": "CLIPLoader", "inputs": {"clip_name": "h3.safetensors", "type": "minimax",
                                                           "device": "default"}},
              "2": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3.safetensors", "weight_dtype": "default"}},
              "3": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
              "4": {"class_type": "MiniMaxH3ReferenceToVideo", "inputs": {
                  "clip": ["1", 0], "ref_images.ref_image_0": ["3", 0], "prompt": "<Picture 1> walks", "width": 64,
                  "height": 64, "length": 5, "ref_image_size": "match"}},
              "5": {"class_type": "KSampler", "inputs": {
                  "model": ["2", 0], "positive": ["4", 0], "negative": ["4", 0], "latent_image": ["4", 1], "seed": 1,
                  "steps": 2, "cfg": 1.0, "sampler_name": "res_multistep", "scheduler": "simple", "denoise": 1.0}}}
    swapped, report = swap_api(prompt, "minimax_h3")
    assert swapped["4"] == {"class_type": "SwiftDiTMiniMaxH3ReferenceToVideo", "inputs": {
        "clip": ["1", 0], "ref_image_0": ["3", 0], "prompt": "<Picture 1> walks", "width": 64, "height": 64,
        "length": 5, "ref_image_size": "match"}}
    assert swap_api(swapped, "minimax_h3")[0] == swapped


def test_minimax_h3_t2v_template_is_swapped(tmp_path):
    """Issue 35: the t2v template's loaders, MiniMaxH3ImageToVideo (no frames), both decoders and the
    SamplerCustomAdvanced group (spelled as our sampler on its res_multistep / simple) and the turbo LoRA (behind the
    switch, off by default) become ours."""
    wf = template("video_minimax_h3_t2v")
    after, report = swap_ui(wf, "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTMiniMaxH3{r}" for r in ("VAELoader", "AudioVAELoader", "VAEDecodeAudio", "VAEDecode", "Loader",
                                          "LoraLoaderModelOnly", "TextEncoderLoader", "ImageToVideo", "Sampler"))
    inner = {n["id"]: n for n in after["definitions"]["subgraphs"][0]["nodes"]}
    kinds = {n["type"] for n in inner.values()}
    assert not kinds & {"SamplerCustomAdvanced", "RandomNoise", "BasicGuider", "KSamplerSelect", "BasicScheduler"}
    sampler = next(n for n in inner.values() if n["type"] == "SwiftDiTMiniMaxH3Sampler")
    assert sampler["widgets_values"][3:7] == [1.0, "res_multistep", "simple", 1.0]
    assert {e["name"]: e.get("link") is not None for e in sampler["inputs"]} == {
        "model": True, "positive": True, "negative": True, "latent_image": True, "seed": True, "steps": True,
        "sampler_name": False, "scheduler": False}  # the t2v template's sampler and scheduler are widgets
    assert [e["name"] for e in inner[131]["inputs"] if not e.get("widget")] == ["clip", "vae", "first_frame",
                                                                               "last_frame"]
    assert inner[120]["type"] == "SwiftDiTMiniMaxH3AudioVAELoader"
    assert inner[134]["type"] == "SwiftDiTMiniMaxH3LoraLoaderModelOnly" and inner[134]["mode"] == 0  # the turbo LoRA
    assert inner[135]["type"] == "ComfySwitchNode"
    src, out = tmp_path / "h3.json", tmp_path / "out.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, out)
    assert done.returncode == 0, done.stderr
    assert "MiniMax H3: swapped 9 node(s)" in done.stdout and json.loads(out.read_text()) == after


def test_minimax_h3_api_group_is_folded():
    """The API form of the group: one KSampler under the SamplerCustomAdvanced's id, with the group's sampler,
    scheduler, seed and steps; a group whose scheduler is wired is left as it was."""
    from swiftdit.custom_sampler import fold_api

    def prompt():
        return {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3.safetensors", "weight_dtype": "default"}},
                "2": {"class_type": "RandomNoise", "inputs": {"noise_seed": 7}},
                "3": {"class_type": "BasicGuider", "inputs": {"model": ["1", 0], "conditioning": ["6", 0]}},
                "4": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "res_multistep"}},
                "5": {"class_type": "BasicScheduler", "inputs": {"model": ["1", 0], "scheduler": "beta", "steps": 9,
                                                                 "denoise": 1}},
                "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a", "clip": ["8", 0]}},
                "7": {"class_type": "SamplerCustomAdvanced", "inputs": {
                    "noise": ["2", 0], "guider": ["3", 0], "sampler": ["4", 0], "sigmas": ["5", 0],
                    "latent_image": ["9", 1]}}}
    p = prompt()
    assert [(f.scope, f.id, f.sampler, f.scheduler, f.extra) for f in fold_api(p)] == [
        (None, "7", "res_multistep", "beta", {})]
    assert set(p) == {"1", "6", "7"} and p["7"] == {"class_type": "KSampler", "inputs": {
        "seed": 7, "steps": 9, "cfg": 1.0, "sampler_name": "res_multistep", "scheduler": "beta", "denoise": 1.0,
        "model": ["1", 0], "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["9", 1]}}
    p = prompt()
    p["5"]["inputs"]["scheduler"] = ["10", 0]
    assert fold_api(p) == [] and p == {**prompt(), "5": p["5"]}


@pytest.mark.parametrize("name", ["video_minimax_h3_i2v", "video_minimax_h3_i2v_continuation"])
def test_minimax_h3_image_to_video_templates_are_swapped(name):
    """Issue 35: the first-frame templates (i2v, continuation) swap as the t2v one does, their LoadImage still wired
    into our Image To Video's first_frame."""
    after, report = swap_ui(template(name), "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTMiniMaxH3{r}" for r in ("VAELoader", "AudioVAELoader", "VAEDecodeAudio", "VAEDecode", "Loader",
                                          "LoraLoaderModelOnly", "TextEncoderLoader", "ImageToVideo", "Sampler"))
    inner = {n["id"]: n for n in after["definitions"]["subgraphs"][0]["nodes"]}
    i2v = next(n for n in inner.values() if n["type"] == "SwiftDiTMiniMaxH3ImageToVideo")
    assert next(e for e in i2v["inputs"] if e["name"] == "first_frame")["link"] is not None


def test_minimax_h3_text_to_image_template_is_swapped():
    """Issue 35: the t2i template's subgraph: its SamplerCustomAdvanced group folded with the sampler and scheduler
    its subgraph promotes (still wired to the instance's inputs), ModelAttentionBackend taken off the model path
    (reported), EmptyLatentImage and LTXVSeparateAVLatent stock around our sampler and decode."""
    after, report = swap_ui(template("image_minimax_h3_t2i"), "minimax_h3")
    assert problems(after) == [] and report.not_yet == []
    assert sorted(new for _, _, new in report.changed) == sorted([
        f"SwiftDiTMiniMaxH3{r}" for r in ("Loader", "LoraLoaderModelOnly", "TextEncode", "TextEncoderLoader",
                                          "VAELoader", "VAEDecode", "Sampler")] + [SAVE])
    inner = {n["id"]: n for n in after["definitions"]["subgraphs"][0]["nodes"]}
    assert 44 not in inner and {inner[46]["type"], inner[39]["type"]} == {"EmptyLatentImage", "LTXVSeparateAVLatent"}
    sampler = next(n for n in inner.values() if n["type"] == "SwiftDiTMiniMaxH3Sampler")
    wired = {e["name"] for e in sampler["inputs"] if e.get("link") is not None}
    assert {"seed", "steps", "sampler_name", "scheduler"} <= wired  # the subgraph's promoted values
    assert any(where == "58:44" and what.startswith("ModelAttentionBackend removed") for where, what in report.folded)


# LTX-2.5 (issue 36): the t2v, i2v and flf2v templates swap node for node (frame nodes: nodes/ltx25_frames.py).
LTX25 = FAMILIES["ltx25"]
LTX25_HOST_TWINS = ("LTXVConcatAVLatent", "LTXVSeparateAVLatent")  # ours only for --for-host (test_swap_for_host)
LTX25_GROUP = {"SamplerCustomAdvanced", "RandomNoise", "LTXVDualCFGGuider", "KSamplerSelect", "SamplerEulerAncestral",
               "ManualSigmas"}


def test_ltx25_family_table_is_the_contract():
    docs = {stock: v for stock, v in contract("SwiftDiTLTX25").items() if stock not in LTX25_HOST_TWINS}
    text = (ROOT / "docs" / "nodes.md").read_text()  # nodes of several outputs (Add Guide, Crop Guides)
    for ours, stock, outs in re.findall(r"^\| `(SwiftDiTLTX25\w+)` \| `(\w+)`.*\| ((?:`\w+`, )+`\w+`) \|$", text,
                                        re.MULTILINE):
        if stock not in LTX25_HOST_TWINS:
            outs = re.findall(r"`(\w+)`", outs)
            assert [LTX25.output_type(ours, i) for i in range(len(outs))] == outs, ours
            docs[stock] = (ours, outs[0])
    table = {stock: role.ours for stock, role in LTX25.roles.items()}
    # docs/nodes.md names both VAE loaders on VAELoader rows: the last (audio) one is the row's audio_vae_loader
    assert table == {stock: ours for stock, (ours, _) in docs.items()} | {"VAELoader": "SwiftDiTLTX25VAELoader"}
    assert docs["VAELoader"][0] == LTX25.audio_vae_loader == "SwiftDiTLTX25AudioVAELoader"
    for ours, out in docs.values():
        assert LTX25.output_type(ours, 0) == out, ours


def test_ltx25_t2v_template_is_swapped(tmp_path):
    """Every LTX model node becomes ours, each SamplerCustomAdvanced group one sampler of ours with the group's
    values (stage 1: the promoted seed, 8 steps; stage 2: seed 42 fixed, 3 steps; cfg and audio_cfg the guider's,
    scheduler 'manual' with ManualSigmas' text); the stock plumbing, the enhancer and its E2B loader stay."""
    from dit_core.sampling.ltx25 import STAGE_1_SIGMAS, STAGE_2_SIGMAS
    wf = template("video_ltx2_5_t2v")
    after, report = swap_ui(wf, "ltx25")
    assert problems(after) == [] and report.not_yet == [] and report.added == []
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTLTX25{r}" for r in ("Loader", "TextEncoderLoader", "TextEncode", "TextEncode", "VAELoader",
                                      "AudioVAELoader", "LatentUpscaleModelLoader", "EmptyLatentAudio",
                                      "LatentUpsampler", "VAEDecodeTiled", "AudioVAEDecode", "Sampler", "Sampler"))
    inner = {n["id"]: n for n in after["definitions"]["subgraphs"][0]["nodes"]}
    kinds = {n["type"] for n in inner.values()}
    assert not kinds & {"SamplerCustomAdvanced", "RandomNoise", "LTXVDualCFGGuider", "KSamplerSelect", "ManualSigmas"}
    assert {i: inner[i]["type"] for i in (340, 377, 367, 369, 356, 365, 370, 380, 393)} == {
        340: "LTXVConcatAVLatent", 377: "LTXVConcatAVLatent", 367: "LTXVSeparateAVLatent",
        369: "LTXVSeparateAVLatent", 356: "EmptyLTXVLatentVideo", 365: "LTXVConditioning", 370: "CreateVideo",
        380: "TextGenerateLTX2Prompt", 393: "CLIPLoader"}
    assert any(where == "405:393" and "TextGenerateLTX2Prompt" in why for where, _, why in report.left)
    assert inner[386]["type"] == "SwiftDiTLTX25AudioVAELoader" and inner[385]["type"] == "SwiftDiTLTX25VAELoader"
    samplers = sorted((n for n in inner.values() if n["type"] == "SwiftDiTLTX25Sampler"),
                      key=lambda n: -n["widgets_values"][2])
    assert [n["widgets_values"][1:] for n in samplers] == [
        ["randomize", 8, 1, "euler_ancestral", "manual", 1.0, 1, STAGE_1_SIGMAS, 1.0, 1.0],
        ["fixed", 3, 1, "euler_ancestral", "manual", 1.0, 1, STAGE_2_SIGMAS, 1.0, 1.0]]  # eta, s_noise: 1
    assert samplers[1]["widgets_values"][0] == 42
    for n, seed_wired in zip(samplers, (True, False)):  # stage 1's seed is the subgraph's promoted noise_seed
        wired = {e["name"] for e in n["inputs"] if e.get("link") is not None}
        assert wired == {"model", "positive", "negative", "latent_image"} | ({"seed"} if seed_wired else set())
    assert stock_consumers_of_ours(after, LTX25) == []
    again, report = swap_ui(after, "ltx25")
    assert again == after and report.changed == []
    for family in ("z_image", "flux3_klein", "krea2", "minimax_h3"):
        assert swap_ui(wf, family)[0] == wf
    src, out = tmp_path / "ltx.json", tmp_path / "out.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, out)  # found without --family
    assert done.returncode == 0, done.stderr
    assert "LTX-2.5: swapped 13 node(s)" in done.stdout and json.loads(out.read_text()) == after
    assert "LTXVDualCFGGuider, KSamplerSelect (euler_ancestral), ManualSigmas (manual)" in done.stdout


def test_ltx25_api_group_is_folded():
    """The API form of an LTX-2.5 group: one KSampler under the SamplerCustomAdvanced's id (steps = sigmas - 1, cfg
    the guider's video_cfg, scheduler 'manual'), audio_cfg and ManualSigmas' text as our sampler's extra widgets; a
    group whose ManualSigmas text is wired (its steps unknown) is left as it was."""
    from swiftdit.custom_sampler import fold_api
    prompt = {"1": {"class_type": "RandomNoise", "inputs": {"noise_seed": 7}},
              "2": {"class_type": "LTXVDualCFGGuider", "inputs": {"model": ["9", 0], "positive": ["8", 0],
                                                                  "negative": ["8", 1], "video_cfg": 3.0,
                                                                  "audio_cfg": 7.0}},
              "3": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler_ancestral"}},
              "4": {"class_type": "ManualSigmas", "inputs": {"sigmas": "0.85, 0.7250, 0.4219, 0.0"}},
              "5": {"class_type": "SamplerCustomAdvanced", "inputs": {
                  "noise": ["1", 0], "guider": ["2", 0], "sampler": ["3", 0], "sigmas": ["4", 0],
                  "latent_image": ["7", 0]}}}
    folded = copy.deepcopy(prompt)
    assert [(f.sampler, f.scheduler, f.extra) for f in fold_api(folded)] == [
        ("euler_ancestral", "manual", {"audio_cfg": 7.0, "sigmas": "0.85, 0.7250, 0.4219, 0.0"})]
    assert folded == {"5": {"class_type": "KSampler", "inputs": {
        "seed": 7, "steps": 3, "cfg": 3.0, "sampler_name": "euler_ancestral", "scheduler": "manual", "denoise": 1.0,
        "model": ["9", 0], "positive": ["8", 0], "negative": ["8", 1], "latent_image": ["7", 0]}}}
    prompt["4"]["inputs"]["sigmas"] = ["6", 0]
    wired = copy.deepcopy(prompt)
    assert fold_api(wired) == [] and wired == prompt


def ltx25_swapped(name: str) -> tuple[dict, dict, object]:
    """A template's swap, checked as every LTX-2.5 swap must be: loadable, idempotent, no stock node on our wires, no
    group node left, other families leave it alone; (the subgraph's nodes by id, the swapped workflow, the report)."""
    wf = template(name)
    after, report = swap_ui(wf, "ltx25")
    assert problems(after) == [] and report.not_yet == [] and report.added == []
    again, second = swap_ui(after, "ltx25")
    assert again == after and second.changed == []
    assert stock_consumers_of_ours(after, LTX25) == []
    for family in ("z_image", "flux3_klein", "krea2", "minimax_h3"):
        assert swap_ui(wf, family)[0] == wf
    inner = {n["id"]: n for n in after["definitions"]["subgraphs"][0]["nodes"]}
    assert not {n["type"] for n in inner.values()} & LTX25_GROUP
    return inner, after, report


def wired(node: dict) -> dict:
    return {e["name"]: e["type"] for e in node["inputs"] if e.get("link") is not None}


def test_ltx25_i2v_template_is_swapped():
    """Image to video: the t2v swap plus both Img To Video Inplace nodes (0.7 before stage 1, 1 before stage 2; their
    bypass still wired to the text-to-video switch) on the video VAE's loader, which is ours."""
    from dit_core.sampling.ltx25 import STAGE_1_SIGMAS, STAGE_2_SIGMAS
    inner, after, report = ltx25_swapped("video_ltx2_5_i2v")
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTLTX25{r}" for r in ("Loader", "TextEncoderLoader", "TextEncode", "TextEncode", "VAELoader",
                                      "AudioVAELoader", "LatentUpscaleModelLoader", "EmptyLatentAudio",
                                      "LatentUpsampler", "VAEDecodeTiled", "AudioVAEDecode", "Sampler", "Sampler",
                                      "ImgToVideoInplace", "ImgToVideoInplace"))
    assert [(inner[i]["type"], inner[i]["widgets_values"]) for i in (357, 349)] == [
        ("SwiftDiTLTX25ImgToVideoInplace", [0.7, False]), ("SwiftDiTLTX25ImgToVideoInplace", [1, False])]
    links = {link["id"]: link for link in after["definitions"]["subgraphs"][0]["links"]}
    for i in (357, 349):
        assert wired(inner[i]) == {"vae": "SWIFTDIT_VAE", "image": "IMAGE", "latent": "LATENT", "bypass": "BOOLEAN"}
        vae = next(e["link"] for e in inner[i]["inputs"] if e["name"] == "vae")
        assert inner[links[vae]["origin_id"]]["type"] == "SwiftDiTLTX25VAELoader"
    assert {inner[i]["type"] for i in (350, 351, 377, 340, 356)} == {
        "LTXVPreprocess", "ResizeImageMaskNode", "LTXVConcatAVLatent", "EmptyLTXVLatentVideo"}
    samplers = sorted((n for n in inner.values() if n["type"] == "SwiftDiTLTX25Sampler"),
                      key=lambda n: -n["widgets_values"][2])
    assert [n["widgets_values"][2:] for n in samplers] == [
        [8, 1, "euler_ancestral", "manual", 1.0, 1, STAGE_1_SIGMAS, 1.0, 1.0],
        [3, 1, "euler_ancestral", "manual", 1.0, 1, STAGE_2_SIGMAS, 1.0, 1.0]]


def test_ltx25_flf2v_template_is_swapped(tmp_path):
    """First/last frame: both Add Guides (frames 0 and -1, 0.7; their unwired attention_mask and IC-LoRA inputs,
    which ours lacks, gone) and Crop Guides become ours; the one SamplerCustomAdvanced group with
    SamplerEulerAncestral (eta 0, s_noise 1), whose denoised_output the template reads, one sampler of ours whose
    output takes that link (the sigmas end at 0: the same latent)."""
    from dit_core.sampling.ltx25 import STAGE_1_SIGMAS
    wf = template("video_ltx2_5_flf2v")
    inner, after, report = ltx25_swapped("video_ltx2_5_flf2v")
    assert sorted(new for _, _, new in report.changed) == sorted(
        f"SwiftDiTLTX25{r}" for r in ("Loader", "TextEncoderLoader", "TextEncode", "TextEncode", "VAELoader",
                                      "AudioVAELoader", "EmptyLatentAudio", "VAEDecodeTiled", "AudioVAEDecode",
                                      "Sampler", "AddGuide", "AddGuide", "CropGuides"))
    assert [(inner[i]["type"], inner[i]["widgets_values"]) for i in (206, 204)] == [
        ("SwiftDiTLTX25AddGuide", [0, 0.7]), ("SwiftDiTLTX25AddGuide", [-1, 0.7])]
    for i in (206, 204):
        assert [e["name"] for e in inner[i]["inputs"]] == ["positive", "negative", "vae", "latent", "image"]
        assert wired(inner[i])["vae"] == "SWIFTDIT_VAE"
    assert inner[200]["type"] == "SwiftDiTLTX25CropGuides" and inner[229]["type"] == "SwiftDiTLTX25VAELoader"
    (sampler,) = (n for n in inner.values() if n["type"] == "SwiftDiTLTX25Sampler")
    assert sampler["widgets_values"][2:] == [8, 1, "euler_ancestral", "manual", 1.0, 1, STAGE_1_SIGMAS, 0, 1]
    links = {link["id"]: link for link in after["definitions"]["subgraphs"][0]["links"]}
    (out,) = sampler["outputs"][0]["links"]
    assert inner[links[out]["target_id"]]["type"] == "LTXVSeparateAVLatent"  # was denoised_output's reader
    assert [(where, what) for where, what in report.folded] == [(f"251:{sampler['id']}", (
        "RandomNoise, LTXVDualCFGGuider, SamplerEulerAncestral (euler_ancestral), ManualSigmas (manual) and "
        "SamplerCustomAdvanced -> one KSampler (seed, steps, sampler, scheduler, the guider's model and "
        "conditioning, cfg = video_cfg, audio_cfg 1, eta 0, s_noise 1)"))]
    src, dst = tmp_path / "flf2v.json", tmp_path / "out.json"
    src.write_text(json.dumps(wf))
    done = run_cli("swap", src, dst)  # found without --family
    assert done.returncode == 0, done.stderr
    assert "LTX-2.5: swapped 13 node(s)" in done.stdout and json.loads(dst.read_text()) == after


def test_ltx25_add_guide_with_a_mask_is_not_yet_swapped():
    """An Add Guide with its attention_mask wired (not ours yet) leaves the whole graph stock, naming why."""
    from dit_core.families import LTX25_GUIDE_EXTRAS
    wf = template("video_ltx2_5_flf2v")
    body = wf["definitions"]["subgraphs"][0]
    guide = next(n for n in body["nodes"] if n["id"] == 206)
    mask = {"id": 900, "type": "SolidMask", "pos": [0, 0], "size": [200, 100], "flags": {}, "order": 0, "mode": 0,
            "inputs": [], "outputs": [{"name": "MASK", "type": "MASK", "links": [990]}], "properties": {},
            "widgets_values": [1.0, 512, 512]}
    body["nodes"].append(mask)
    body["links"].append({"id": 990, "origin_id": 900, "origin_slot": 0, "target_id": 206, "target_slot": 5,
                          "type": "MASK"})
    next(e for e in guide["inputs"] if e["name"] == "attention_mask")["link"] = 990
    after, report = swap_ui(wf, "ltx25")
    assert after == wf and report.changed == [] and report.not_yet == [LTX25_GUIDE_EXTRAS]


def test_ltx25_api_group_with_euler_ancestral_is_folded():
    """The API form: SamplerEulerAncestral's eta and s_noise go to our sampler's own widgets, a reader of
    denoised_output reads the KSampler's output (the sigmas end at 0); with sigmas ending above 0 (denoised_output
    another latent) or wired eta, the group is left as it was."""
    from swiftdit.custom_sampler import fold_api
    prompt = {"1": {"class_type": "RandomNoise", "inputs": {"noise_seed": 7}},
              "2": {"class_type": "LTXVDualCFGGuider", "inputs": {"model": ["9", 0], "positive": ["8", 0],
                                                                  "negative": ["8", 1], "video_cfg": 1.0,
                                                                  "audio_cfg": 1.0}},
              "3": {"class_type": "SamplerEulerAncestral", "inputs": {"eta": 0.0, "s_noise": 1.0}},
              "4": {"class_type": "ManualSigmas", "inputs": {"sigmas": "1.0, 0.725, 0.0"}},
              "5": {"class_type": "SamplerCustomAdvanced", "inputs": {
                  "noise": ["1", 0], "guider": ["2", 0], "sampler": ["3", 0], "sigmas": ["4", 0],
                  "latent_image": ["7", 0]}},
              "6": {"class_type": "LTXVSeparateAVLatent", "inputs": {"av_latent": ["5", 1]}}}
    folded = copy.deepcopy(prompt)
    assert [(f.sampler, f.scheduler, f.extra) for f in fold_api(folded)] == [
        ("euler_ancestral", "manual", {"audio_cfg": 1.0, "eta": 0.0, "s_noise": 1.0, "sigmas": "1.0, 0.725, 0.0"})]
    assert folded["5"]["inputs"]["sampler_name"] == "euler_ancestral" and folded["6"]["inputs"]["av_latent"] == ["5", 0]
    assert set(folded) == {"5", "6"}
    for change in ({"4": {"sigmas": "1.0, 0.725, 0.1"}}, {"3": {"eta": ["10", 0]}}):
        left = copy.deepcopy(prompt)
        for nid, inputs in change.items():
            left[nid]["inputs"].update(inputs)
        kept = copy.deepcopy(left)
        assert fold_api(left) == [] and left == kept

