"""`swiftdit swap --for-host` on the official FLUX.3 Klein templates: the reduced graphs use only node types (and
output slots) ComfyUI v0.3.75 and our pack register, links stay consistent, every change is reported with its
reason, reducing twice changes nothing, and what cannot be reduced fails naming the node."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from official_templates import template

from host.object_info import object_info
from swiftdit import problems, swap_api, swap_ui, to_api
from swiftdit.for_host import HOST_LACKS, math_expression, reduce_for_host, resolution_size, swap_for_host
from swiftdit.ui_graph import UIGraph

ROOT = Path(__file__).resolve().parents[1]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
TEMPLATES = ("image_flux3_klein_distilled_t2i", "image_flux3_klein_distilled_image_edit")
FRONTEND_ONLY = {"MarkdownNote", "Note", "Reroute", "PrimitiveNode"}
# What each template's reduction does: where (API ids) -> (node type, start of what became of it).
REDUCED = {
    "image_flux3_klein_distilled_t2i": {
        "19": ("ResolutionSelector", "removed"), "18:16": ("ComfySwitchNode", "removed, its on_true"),
        "18:11": ("TextGenerate", "skipped"), "25": ("Flux3LayoutPrompt", "-> PrimitiveStringMultiline"),
        "18:13": ("PreviewAny", "kept"), "18:12": ("CLIPLoader", "removed"),
        "23": ("CreateBoundingBoxes", "removed"), "18:14": ("PrimitiveStringMultiline", "removed")},
    "image_flux3_klein_distilled_image_edit": {
        "51": ("ComfySwitchNode", "removed, its on_false"), "47": ("TextGenerate", "skipped"),
        "49": ("Flux3LayoutPrompt", "-> PrimitiveStringMultiline"), "17": ("ReferenceMultiLatent", "-> 1 x"),
        "18": ("ImageCompare", "removed"), "34": ("PreviewAny", "kept"), "52": ("PreviewAny", "kept"),
        "33": ("CreateBoundingBoxes", "removed"), "46": ("CLIPLoader", "removed"),
        "48": ("PrimitiveStringMultiline", "removed"), "50": ("BatchImagesNode", "removed")},
}


@pytest.fixture(scope="module")
def host_info(swiftdit_pack):
    """/object_info of ComfyUI v0.3.75 with our pack (computed in a child process, no server)."""
    if not (COMFYUI_TREE / "nodes.py").is_file():
        pytest.fail(f"ComfyUI tree missing at {COMFYUI_TREE}: run tests/run.sh (it unpacks it)")
    return object_info(COMFYUI_TREE)


@pytest.fixture(scope="module")
def reduced():
    return {name: swap_for_host(template(name), "flux3_klein") for name in TEMPLATES}


def _spec_type(spec):
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    return "COMBO" if isinstance(kind, list) else kind


def _joins(given, taken) -> bool:
    """ComfyUI's type check: "*" joins anything, "A,B" either A or B."""
    if "*" in (given, taken):
        return True
    return bool(set(str(given).split(",")) & set(str(taken).split(",")))


def api_problems(prompt: dict, info: dict) -> list[str]:
    """What a v0.3.75 server would refuse: unknown classes, missing required inputs, links to outputs the
    origin lacks or of the wrong type."""
    found = []
    for nid, body in prompt.items():
        node = info.get(body["class_type"])
        if node is None:
            found.append(f"{nid}: no class {body['class_type']}")
            continue
        specs = {**node["input"].get("optional", {}), **node["input"].get("required", {})}
        for name in node["input"].get("required", {}):
            if name not in body["inputs"]:
                found.append(f"{nid} {body['class_type']}: required input {name} missing")
        for name, value in body["inputs"].items():
            if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
                continue
            origin = prompt.get(value[0])
            outputs = info[origin["class_type"]]["output"] if origin and origin["class_type"] in info else []
            if value[1] >= len(outputs):
                found.append(f"{nid}.{name}: {value} is not an output of {origin and origin['class_type']}")
            elif name in specs and not _joins(outputs[value[1]], _spec_type(specs[name])):
                found.append(f"{nid}.{name}: takes {_spec_type(specs[name])}, given {outputs[value[1]]}")
    return found


def node_types(wf: dict) -> set:
    graph = UIGraph(wf)
    return {n["type"] for s in graph.scopes() for n in s.nodes.values() if not graph.is_instance(n)}


def test_resolution_selector_sizes():
    # the stock node's formula on the templates' settings (reference/templates.md sections 3 and 7)
    assert resolution_size("1:1 (Square)", 1, 8) == (1024, 1024)
    assert resolution_size("16:9", 0.4, 32) == (864, 480)
    assert resolution_size("16:9 (Widescreen)", 0.9, 32) == (1280, 736)
    assert resolution_size("1:1", 1.0, 16) == (1024, 1024)
    with pytest.raises(ValueError, match="not a ratio"):
        resolution_size("square", 1, 8)


@pytest.mark.parametrize("name", TEMPLATES)
def test_reduced_template_runs_on_the_host_node_list(name, reduced, host_info):
    wf, report, host_report = reduced[name]
    assert problems(wf) == []  # links <-> slots both ways, types equal on both ends, subgraph ports
    types = node_types(wf)
    assert types - FRONTEND_ONLY <= set(host_info), sorted(types - FRONTEND_ONLY - set(host_info))
    assert not types & HOST_LACKS
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    assert {where: (kind, what.split(" (")[0]) for where, kind, what, _ in host_report.changes
            if not what.startswith(("width", "height"))}.keys() == REDUCED[name].keys()
    for where, kind, what, why in host_report.changes:
        if where in REDUCED[name]:
            assert (kind, what[:len(REDUCED[name][where][1])]) == REDUCED[name][where], where
        assert why, where
    assert report.changed and not [kind for _, kind, _ in report.left if kind.startswith("SwiftDiT")]


@pytest.mark.parametrize("name", TEMPLATES)
def test_reduction_is_idempotent(name, reduced):
    wf, _, _ = reduced[name]
    again, report, host_report = swap_for_host(wf, "flux3_klein")
    assert again == wf and host_report.changes == [] and report.changed == []
    assert reduce_for_host(wf)[0] == wf


def test_t2i_sizes_and_prompt(reduced, host_info):
    wf, _, host_report = reduced["image_flux3_klein_distilled_t2i"]
    prompt = to_api(wf, host_info)
    latent = prompt["18:6"]["inputs"]
    assert (latent["width"], latent["height"]) == (1024, 1024)  # ResolutionSelector 1:1, 1 MP, multiple 8
    assert ("18", "subgraph 'Text to Image (FLUX 3 Image Klein SD)'", "width = 1024",
            "was wired from ResolutionSelector 19") in host_report.changes
    # the typed prompt reaches our text encode straight (upsampler and switch gone), PreviewAny still shows it
    assert prompt["18:4"]["inputs"]["text"] == ["18:17", 0]
    assert prompt["18:13"]["inputs"]["source"] == ["18:17", 0]
    assert prompt["18:17"]["inputs"]["value"] == template("image_flux3_klein_distilled_t2i")["nodes"][1][
        "widgets_values"][0]
    assert prompt["18:4"]["class_type"] == "SwiftDiTFlux3KleinTextEncode"
    sampler = prompt["18:7"]
    assert sampler["class_type"] == "SwiftDiTFlux3KleinSampler"
    assert (sampler["inputs"]["steps"], sampler["inputs"]["sampler_name"]) == (16, "euler")
    assert not [k for k in prompt if k in ("18:11", "18:12", "18:14", "18:16", "19", "23")]


def test_edit_references_spelled_out(reduced, host_info):
    wf, report, _ = reduced["image_flux3_klein_distilled_image_edit"]
    prompt = to_api(wf, host_info)
    kinds = {k: v["class_type"] for k, v in prompt.items()}

    def src(nid, name):
        return prompt[nid]["inputs"][name][0]
    for name, cond in (("positive", "4"), ("negative", "32")):
        ref = src("7", name)
        assert kinds[ref] == "ReferenceLatent" and src(ref, "conditioning") == cond
        encode = src(ref, "latent")
        assert kinds[encode] == "SwiftDiTFlux3KleinVAEEncode" and src(encode, "vae") == "3"
        scale = prompt[src(encode, "pixels")]
        assert scale["class_type"] == "ImageScaleToTotalPixels" and scale["inputs"]["image"] == ["11", 0]
        assert (scale["inputs"]["upscale_method"], scale["inputs"]["megapixels"]) == ("lanczos", 1)
    zero = prompt[src("7", "latent_image")]
    assert zero["class_type"] == "LatentMultiply" and zero["inputs"]["multiplier"] == 0.0
    assert kinds[zero["inputs"]["samples"][0]] == "SwiftDiTFlux3KleinVAEEncode"
    assert [kinds[k] for k in ("3", "8")] == ["SwiftDiTFlux3KleinVAELoader", "SwiftDiTFlux3KleinVAEDecode"]
    assert src("4", "text") == "49" and prompt["49"]["class_type"] == "PrimitiveStringMultiline"
    assert prompt["49"]["inputs"]["value"].startswith("In <ref_image_0>, replace the earring <obj_1>")
    assert "ImageCompare" not in kinds.values()
    assert {old for _, old, _ in report.changed} >= {"VAELoader", "VAEDecode", "VAEEncode"}


def edit_template_node(wf: dict, node_id: int) -> dict:
    return next(n for n in wf["nodes"] if n["id"] == node_id)


def test_what_cannot_be_reduced_names_the_node():
    wf = template("image_flux3_klein_distilled_t2i")
    edit_template_node(wf, 19)["widgets_values"][0] = "wide"
    with pytest.raises(ValueError, match=r"node 19 \(ResolutionSelector\): aspect_ratio 'wide'"):
        reduce_for_host(wf)

    wf = template("image_flux3_klein_distilled_image_edit")
    switch = edit_template_node(wf, 51)
    switch["widgets_values"] = [True]
    switch["inputs"][1]["link"] = None  # on_true unplugged: the branch the switch now picks is open
    edit_template_node(wf, 34)["outputs"][0]["links"] = [64]
    wf["links"] = [link for link in wf["links"] if link[0] != 71]
    assert problems(wf) == []
    with pytest.raises(ValueError, match=r"node 51 \(ComfySwitchNode\): its on_true is not wired"):
        reduce_for_host(wf)

    wf = template("image_flux3_klein_distilled_image_edit")
    wf["nodes"].append({"id": 90, "type": "SaveImageAdvanced", "pos": [0, 0], "mode": 0, "inputs": [],
                        "outputs": [], "widgets_values": []})
    with pytest.raises(ValueError, match=r"node 90 \(SaveImageAdvanced\): ComfyUI v0\.3\.75 has no"):
        reduce_for_host(wf)
    with pytest.raises(ValueError, match="UI-format"):
        reduce_for_host({"1": {"class_type": "KSampler", "inputs": {}}})


def test_a_size_read_by_a_non_widget_input_fails():
    wf = template("image_flux3_klein_distilled_t2i")
    # ResolutionSelector#19's width also into the bounding-box PreviewAny#24 (a wire input, no widget to hold it)
    preview = edit_template_node(wf, 24)
    preview["inputs"][0]["link"] = 46
    edit_template_node(wf, 25)["outputs"][0]["links"] = []
    edit_template_node(wf, 19)["outputs"][0]["links"].append(46)
    wf["links"] = [link for link in wf["links"] if link[0] != 45] + [[46, 19, 0, 24, 0, "INT"]]
    assert problems(wf) == []
    with pytest.raises(ValueError, match=r"node 19 \(ResolutionSelector\): cannot write its width .*'source'"):
        reduce_for_host(wf)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "swiftdit.cli", *map(str, args)], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=60)


def test_cli_for_host(tmp_path, reduced):
    src, out = tmp_path / "edit.json", tmp_path / "edit_host.json"
    src.write_text(json.dumps(template("image_flux3_klein_distilled_image_edit")))
    done = run_cli("swap", src, out, "--family", "flux3_klein", "--for-host")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == reduced["image_flux3_klein_distilled_image_edit"][0]
    assert "reduced for ComfyUI v0.3.75: 11 change(s)" in done.stdout
    assert "51  ComfySwitchNode: removed, its on_false wired straight through (switch is False;" in done.stdout
    assert "FLUX.3 Klein: swapped 8 node(s)" in done.stdout
    bad = tmp_path / "bad.json"
    wf = template("image_flux3_klein_distilled_image_edit")
    wf["nodes"].append({"id": 90, "type": "SaveImageAdvanced", "mode": 0, "inputs": [], "outputs": []})
    bad.write_text(json.dumps(wf))
    done = run_cli("swap", bad, tmp_path / "x.json", "--family", "flux3_klein", "--for-host")
    assert done.returncode == 2 and "node 90 (SaveImageAdvanced)" in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_size_reaches_inner_widgets_of_a_proxy_widget_subgraph(host_info):
    # Z-Image base: ResolutionSelector#94 feeds subgraph #76, whose values live on the inner nodes
    # (properties.proxyWidgets). Its SaveImageAdvanced (absent on v0.3.75, no rule) is made a SaveImage here.
    wf = template("image_z_image")
    save = edit_template_node(wf, 95)
    save.update(type="SaveImage", widgets_values=["z_image"], widgets_values_named={"filename_prefix": "z_image"})
    out, host_report = reduce_for_host(wf)
    assert problems(out) == []
    prompt = to_api(out, host_info)
    assert (prompt["76:68"]["inputs"]["width"], prompt["76:68"]["inputs"]["height"]) == (1024, 1024)
    assert [what for _, _, what, _ in host_report.changes] == ["width_1 = 1024", "height_1 = 1024", "removed"]
    assert api_problems(prompt, host_info) == []


# Krea 2 (the family table's third row): the official t2i templates reduce and swap to a graph the host runs; the
# prompt refiner (TextGenerate) is skipped, so its stock CLIPLoader feeds only the encode and becomes ours.
KREA2_TEMPLATES = ("image_krea2_turbo_t2i_int8", "image_krea2_turbo_t2i")


@pytest.mark.parametrize("name", KREA2_TEMPLATES)
def test_krea2_t2i_reduced_for_the_host(name, host_info):
    wf, report, host_report = swap_for_host(template(name), "krea2")
    assert problems(wf) == []
    types = node_types(wf)
    assert types - FRONTEND_ONLY <= set(host_info), sorted(types - FRONTEND_ONLY - set(host_info))
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    kinds = {k: v["class_type"] for k, v in prompt.items()}
    assert {k: kinds[k] for k in ("30:10", "30:11", "30:6", "30:3")} == {
        "30:10": "SwiftDiTKrea2Loader", "30:11": "SwiftDiTKrea2TextEncoderLoader",
        "30:6": "SwiftDiTKrea2TextEncode", "30:3": "SwiftDiTKrea2Sampler"}
    assert kinds["30:8"] == "SwiftDiTKrea2VAEDecode" and kinds["30:12"] == "VAELoader"  # ours reads stock's VAE
    # enable_lora? is off in both templates: the switch passes the loader's model on, the LoRA feeds nothing
    assert prompt["30:3"]["inputs"]["model"] == ["30:10", 0] and "30:15" not in prompt
    assert (prompt["30:5"]["inputs"]["width"], prompt["30:5"]["inputs"]["height"]) == (1024, 1024)
    assert report.added == [] and swap_for_host(wf, "krea2")[0] == wf
    assert any(kind == "TextGenerate" and what.startswith("skipped") for _, kind, what, _ in host_report.changes)


def test_math_expression_as_comfyui_computes_it():
    # the H3 t2v template's length for 5 s and 2 s, LTX-2.5's length and half size (reference/templates.md)
    snap = "max(5, round(a * 24)) + (5 - (max(5, round(a * 24)) % 17)) % 17"
    assert (math_expression(snap, {"a": 5.0}), math_expression(snap, {"a": 2})) == (124, 56)
    assert math_expression("a * b + 1", {"a": 5, "b": 24}) == 121 and math_expression("a/2", {"a": 1280}) == 640.0
    assert math_expression("sum(values) if a > 1 else -1", {"a": 2, "b": 3}) == 5
    for bad, why in (("__import__('os')", "not a number, a known name"), ("a +", "does not parse"),
                     ("c * 2", "'c'"), ("2 ** 5000", "exponent"), ("", "empty")):
        with pytest.raises(ValueError, match=why):
            math_expression(bad, {"a": 1})


def test_minimax_h3_t2v_reduced_for_the_host(host_info):
    """Issue 35: the t2v template reduces (size, length expression, switches) and swaps to a graph whose every node
    the host or our pack has; the length the template computes (124 for 5 s) reaches our Text To Video."""
    wf, report, host_report = swap_for_host(template("video_minimax_h3_t2v"), "minimax_h3")
    assert problems(wf) == []
    types = node_types(wf)
    assert types - FRONTEND_ONLY <= set(host_info), sorted(types - FRONTEND_ONLY - set(host_info))
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    t2v, sampler = prompt["140:131"], prompt["140:141"]
    assert t2v["class_type"] == "SwiftDiTMiniMaxH3ImageToVideo"
    assert (t2v["inputs"]["width"], t2v["inputs"]["height"], t2v["inputs"]["length"]) == (864, 480, 124)
    assert sampler["class_type"] == "SwiftDiTMiniMaxH3Sampler"
    assert (sampler["inputs"]["sampler_name"], sampler["inputs"]["scheduler"]) == ("res_multistep", "simple")
    assert sampler["inputs"]["model"] == ["140:127", 0]  # the turbo switch is off: the loader's model
    assert {prompt[k]["class_type"] for k in ("140:130", "92")} == {"CreateVideo", "SaveVideo"}
    assert ("140:132", "ComfyMathExpression") in {(w, k) for w, k, _, _ in host_report.changes}
    assert swap_for_host(wf, "minimax_h3")[0] == wf


@pytest.mark.parametrize("name", ["video_minimax_h3_i2v", "video_minimax_h3_i2v_continuation"])
def test_minimax_h3_image_to_video_reduced_for_the_host(name, host_info):
    """The first-frame templates reduce and swap to graphs the host runs: LoadImage -> our Image To Video's
    first_frame, 640 x 640, 124 frames, res_multistep / simple."""
    wf, report, host_report = swap_for_host(template(name), "minimax_h3")
    assert problems(wf) == []
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    i2v = next(b for b in prompt.values() if b["class_type"] == "SwiftDiTMiniMaxH3ImageToVideo")["inputs"]
    assert (i2v["width"], i2v["height"], i2v["length"]) == (640, 640, 124)
    assert prompt[i2v["first_frame"][0]]["class_type"] == "LoadImage" and "last_frame" not in i2v
    sampler = next(b for b in prompt.values() if b["class_type"] == "SwiftDiTMiniMaxH3Sampler")["inputs"]
    assert (sampler["sampler_name"], sampler["scheduler"]) == ("res_multistep", "simple")


def test_minimax_h3_text_to_image_reduced_for_the_host(host_info):
    """The t2i template reduces (size, switch, LTXVSeparateAVLatent: our decode takes the AV latent) and swaps to a
    graph the host runs: EmptyLatentImage 1296 x 728 into our sampler (30 steps, res_multistep / simple, the
    template's seed), our VAE Decode, SaveImage."""
    wf, report, host_report = swap_for_host(template("image_minimax_h3_t2i"), "minimax_h3")
    assert problems(wf) == []
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    sampler = next(b for b in prompt.values() if b["class_type"] == "SwiftDiTMiniMaxH3Sampler")["inputs"]
    assert (sampler["steps"], sampler["sampler_name"], sampler["scheduler"], sampler["seed"]) == (
        30, "res_multistep", "simple", 697447143149280)
    empty = prompt[sampler["latent_image"][0]]
    assert empty["class_type"] == "EmptyLatentImage" and (empty["inputs"]["width"], empty["inputs"]["height"]) == (
        1296, 728)
    decode = next(b for b in prompt.values() if b["class_type"] == "SwiftDiTMiniMaxH3VAEDecode")["inputs"]
    assert prompt[decode["samples"][0]]["class_type"] == "SwiftDiTMiniMaxH3Sampler"


# LTX-2.5 (issue 36): the t2v template reduced and swapped for the host. The stock nodes newer than v0.3.75 that the
# template's reduced graph still holds before the swap, described as newer ComfyUI gives them in /object_info (input
# names and types only), so that its API form can be made here.
NEWER_STOCK = {
    "LTXVDualCFGGuider": ({"model": "MODEL", "positive": "CONDITIONING", "negative": "CONDITIONING",
                           "video_cfg": "FLOAT", "audio_cfg": "FLOAT"}, ["GUIDER"]),
    "ManualSigmas": ({"sigmas": "STRING"}, ["SIGMAS"]),
    "LTXVEmptyLatentAudio": ({"frames_number": "INT", "frame_rate": "INT", "batch_size": "INT", "audio_vae": "VAE"},
                             ["LATENT"]),
    "LTXVLatentUpsampler": ({"samples": "LATENT", "upscale_model": "LATENT_UPSCALE_MODEL", "vae": "VAE"}, ["LATENT"]),
    "LatentUpscaleModelLoader": ({"model_name": [[]]}, ["LATENT_UPSCALE_MODEL"]),
    "LTXVAudioVAEDecode": ({"samples": "LATENT", "audio_vae": "VAE"}, ["AUDIO"]),
}


def newer_info(host_info: dict) -> dict:
    described = {kind: {"input": {"required": {n: [t] if isinstance(t, str) else t for n, t in ins.items()}},
                        "input_order": {"required": list(ins)}, "output": outs}
                 for kind, (ins, outs) in NEWER_STOCK.items()}
    return {**host_info, **described}


def test_ltx25_t2v_reduced_for_the_host(host_info):
    """The reduction (size, length, half size, frame rate, the enhance switch, the AV plumbing as the pack's twins) and
    the swap (both groups folded) give a graph whose every node the host or our pack has."""
    from dit_core.sampling.ltx25 import STAGE_1_SIGMAS, STAGE_2_SIGMAS, TEMPLATE_SEED
    wf, report, host_report = swap_for_host(template("video_ltx2_5_t2v"), "ltx25")
    assert problems(wf) == []
    types = node_types(wf)
    assert types - FRONTEND_ONLY <= set(host_info), sorted(types - FRONTEND_ONLY - set(host_info))
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    kinds = {k: v["class_type"] for k, v in prompt.items()}
    assert {kinds[k] for k in ("405:340", "405:377")} == {"SwiftDiTLTX25ConcatAVLatent"}
    assert {kinds[k] for k in ("405:367", "405:369")} == {"SwiftDiTLTX25SeparateAVLatent"}
    assert prompt["405:356"]["inputs"] == {"width": 640, "height": 368, "length": 121, "batch_size": 1}
    assert {k: prompt["405:366"]["inputs"][k] for k in ("frames_number", "frame_rate")} == {
        "frames_number": 121, "frame_rate": 24}
    assert prompt["405:365"]["inputs"]["frame_rate"] == prompt["405:370"]["inputs"]["fps"] == 24
    stages = sorted((b["inputs"] for b in prompt.values() if b["class_type"] == "SwiftDiTLTX25Sampler"),
                    key=lambda s: -s["steps"])
    assert [(s["seed"], s["steps"], s["cfg"], s["audio_cfg"], s["sampler_name"], s["scheduler"], s["sigmas"])
            for s in stages] == [(TEMPLATE_SEED, 8, 1, 1, "euler_ancestral", "manual", STAGE_1_SIGMAS),
                                 (42, 3, 1, 1, "euler_ancestral", "manual", STAGE_2_SIGMAS)]
    assert kinds[stages[0]["latent_image"][0]] == kinds[stages[1]["latent_image"][0]] == "SwiftDiTLTX25ConcatAVLatent"
    encode = prompt["405:364"]["inputs"]  # the typed prompt, the enhancer off
    assert kinds[encode["text"][0]] == "PrimitiveStringMultiline"
    assert "405:380" not in prompt and "405:393" not in prompt
    changes = {(where, kind): what for where, kind, what, _ in host_report.changes}
    assert changes[("405:340", "LTXVConcatAVLatent")] == "-> SwiftDiTLTX25ConcatAVLatent"
    assert changes[("405:380", "TextGenerateLTX2Prompt")].startswith("skipped")
    assert changes[("405:393", "CLIPLoader")] == "removed"
    assert len(report.folded) == 2 and swap_for_host(wf, "ltx25")[0] == wf


def test_ltx25_t2v_with_the_enhancer_on_reduces(host_info):
    """prompt_enhance on: the enhancer is skipped (v0.3.75 has none), the prompt reaching the encode as typed."""
    wf = template("video_ltx2_5_t2v")
    wf["nodes"][1]["widgets_values"][1] = True  # the instance's prompt_enhance
    reduced, _, host_report = swap_for_host(wf, "ltx25")
    prompt = to_api(reduced, host_info)
    assert api_problems(prompt, host_info) == [] and "405:380" not in prompt
    assert prompt[prompt["405:364"]["inputs"]["text"][0]]["class_type"] == "PrimitiveStringMultiline"
    assert ("405:382", "ComfySwitchNode") in {(w, k) for w, k, _, _ in host_report.changes}


@pytest.mark.parametrize("name, groups", [("video_ltx2_5_t2v", 2), ("video_ltx2_5_flf2v", 1)])
def test_ltx25_api_form_swaps_as_the_ui_form(host_info, name, groups):
    """The reduced template's API form (its groups still stock) swaps to what the UI swap gives: the same nodes and
    inputs, each folded group under its SamplerCustomAdvanced's id (flf2v: SamplerEulerAncestral's eta and s_noise,
    denoised_output's reader on the sampler's output, the frame nodes ours)."""
    reduced, _ = reduce_for_host(template(name), check=False)
    swapped_api, report = swap_api(to_api(reduced, newer_info(host_info)), "ltx25")
    ui_api = to_api(swap_ui(reduced, "ltx25")[0], host_info)
    assert api_problems(swapped_api, host_info) == [] and len(report.folded) == groups
    kinds = {b["class_type"] for b in swapped_api.values()}
    assert name.endswith("t2v") or {"SwiftDiTLTX25AddGuide", "SwiftDiTLTX25CropGuides"} <= kinds
    new_ids = {k: k for k in ui_api}
    for sid, body in swapped_api.items():  # the UI fold gives each KSampler a new id: match them by steps
        if body["class_type"] == "SwiftDiTLTX25Sampler":
            new_ids[next(k for k, b in ui_api.items() if b["class_type"] == body["class_type"]
                         and b["inputs"]["steps"] == body["inputs"]["steps"])] = sid

    def renamed(prompt):
        return {new_ids[k]: {"class_type": b["class_type"], "inputs": {
            n: [new_ids[v[0]], v[1]] if isinstance(v, list) else v for n, v in b["inputs"].items()}}
            for k, b in prompt.items()}
    assert renamed(ui_api) == {k: {"class_type": b["class_type"], "inputs": b["inputs"]}
                               for k, b in swapped_api.items()}


def test_ltx25_i2v_template_names_its_resize():
    """The i2v template's ResizeImageMaskNode ("scale longer dimension": its size depends on the picture) has no
    reduction rule yet (v0.3.75's ImageScaleToMaxDimension, once its rounding is checked): --for-host names it."""
    with pytest.raises(ValueError, match=re.escape("node 398:351 (ResizeImageMaskNode): ComfyUI v0.3.75 has no")):
        swap_for_host(template("video_ltx2_5_i2v"), "ltx25")


def test_ltx25_flf2v_template_reduces(host_info):
    """The flf2v template on the host: ResizeImageMaskNode ("scale dimensions" of the loaded images, its sizes the
    subgraph's width and height) as ImageScale, GetImageSize of that picture as those sizes; then swapped (frame
    nodes and the sampler ours, eta 0), every node one the host has, the API form what a v0.3.75 server takes;
    reducing again changes nothing."""
    wf, report, host_report = swap_for_host(template("video_ltx2_5_flf2v"), "ltx25")
    assert problems(wf) == [] and report.not_yet == [] and len(report.folded) == 1
    types = node_types(wf)
    assert types - FRONTEND_ONLY <= set(host_info), sorted(types - FRONTEND_ONLY - set(host_info))
    assert not types & HOST_LACKS and {"SwiftDiTLTX25AddGuide", "SwiftDiTLTX25CropGuides", "ImageScale"} <= types
    prompt = to_api(wf, host_info)
    assert api_problems(prompt, host_info) == []
    changes = {(where, kind): what for where, kind, what, _ in host_report.changes}
    assert changes[("251:213", "ResizeImageMaskNode")] == changes[("251:214", "ResizeImageMaskNode")] == \
        "-> ImageScale ['nearest-exact', 1280, 720, 'center']"
    assert changes[("251:203", "GetImageSize")] == "removed"
    assert {k: prompt["251:201"]["inputs"][k] for k in ("width", "height", "length")} == \
        {"width": 1280, "height": 720, "length": 121}
    sampler = next(b["inputs"] for b in prompt.values() if b["class_type"] == "SwiftDiTLTX25Sampler")
    assert (sampler["eta"], sampler["s_noise"], sampler["steps"]) == (0, 1, 8)
    again, second, host_again = swap_for_host(wf, "ltx25")
    assert again == wf and second.changed == [] and host_again.changes == []
