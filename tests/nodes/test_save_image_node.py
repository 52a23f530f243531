"""Save Image (SwiftDiT) in-process on ComfyUI v0.3.75's modules against the stock SaveImage: the same file names in
the output folder, pixels and text chunks, the images passed on; a name taken meanwhile is never overwritten."""
import io
import json

import numpy as np
import pytest
import torch
from node_contract import DOC
from PIL import Image


@pytest.fixture()
def output_dir(comfy, tmp_path):
    import folder_paths
    before = folder_paths.get_output_directory()
    folder_paths.set_output_directory(str(tmp_path))
    yield tmp_path
    folder_paths.set_output_directory(before)


@pytest.fixture(scope="module")
def node(swiftdit_pack):
    from swiftdit_pack.nodes.save_image import SaveImage
    return SaveImage


def run_with_hidden(node, prompt, extra_pnginfo, **inputs):
    """As ComfyUI's executor runs a V3 output node: a class clone holding the hidden prompt and workflow."""
    clone = node.PREPARE_CLASS_CLONE({"PROMPT": prompt, "EXTRA_PNGINFO": extra_pnginfo})
    with torch.inference_mode():
        return clone.execute(**inputs)


def test_schema(node):
    """The stock node's inputs and (newer ComfyUI's) output, in docs/nodes.md, every input and output told."""
    schema = node.GET_SCHEMA()
    assert [i.id for i in schema.inputs] == ["images", "filename_prefix"] and schema.is_output_node
    assert [o.io_type for o in schema.outputs] == ["IMAGE"] and schema.category == "SwiftDiT"
    assert all(i.tooltip for i in schema.inputs) and all(o.tooltip for o in schema.outputs)
    assert schema.display_name == "Save Image (SwiftDiT)" and f"`{schema.node_id}`" in DOC


@pytest.fixture(scope="module")
def stock_nodes(comfy):
    """ComfyUI's nodes.py (the pack's own `nodes` package has that name on the tests' path)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("comfyui_stock_nodes", Path(comfy.__path__[0]).parent / "nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_files_as_stock_save_image(node, output_dir, stock_nodes):
    images = torch.rand(2, 40, 56, 3)
    prompt = {"3": {"class_type": "KSampler", "inputs": {"seed": 7}}}
    extra = {"workflow": {"nodes": [{"id": 3, "type": "KSampler"}], "note": "caf\u00e9 \u2603"}}
    stock = stock_nodes.SaveImage().save_images(images, "cmp/stock", prompt=prompt, extra_pnginfo=extra)
    out = run_with_hidden(node, prompt, extra, images=images, filename_prefix="cmp/ours")
    assert out.result[0] is images  # passed on, as newer ComfyUI's Save Image does
    ours = out.ui["images"]
    assert [r["filename"] for r in ours] == [r["filename"].replace("stock", "ours") for r in stock["ui"]["images"]]
    assert all(r["subfolder"] == "cmp" and r["type"] == "output" for r in ours)
    for a, b in zip(stock["ui"]["images"], ours):
        pa, pb = Image.open(output_dir / "cmp" / a["filename"]), Image.open(output_dir / "cmp" / b["filename"])
        assert np.array_equal(np.asarray(pa), np.asarray(pb)) and pa.mode == pb.mode == "RGB"
        assert pa.text == pb.text and json.loads(pb.text["prompt"]) == prompt
    again = run_with_hidden(node, None, None, images=images[:1], filename_prefix="cmp/ours").ui["images"]
    assert again[0]["filename"] == "ours_00003_.png"  # the counter goes on from the files there
    assert Image.open(output_dir / "cmp" / "ours_00003_.png").text == {}  # no prompt, no workflow: no text


def test_a_name_taken_meanwhile_is_skipped(swiftdit_pack, tmp_path):
    from swiftdit_pack.nodes.save_image import write_new
    (tmp_path / "x_00001_.png").write_bytes(b"the user's")
    name, counter = write_new(str(tmp_path), lambda c: f"x_{c:05}_.png", 1, b"new")
    assert (name, counter) == ("x_00002_.png", 3) and (tmp_path / "x_00001_.png").read_bytes() == b"the user's"


def test_grey_and_alpha_images(node, output_dir):
    for channels, mode in ((1, "L"), (4, "RGBA")):
        images = torch.rand(1, 9, 11, channels)
        [saved] = run_with_hidden(node, None, None, images=images, filename_prefix=f"c{channels}").ui["images"]
        back = Image.open(io.BytesIO((output_dir / saved["filename"]).read_bytes()))
        assert back.mode == mode and back.size == (11, 9)


def test_not_an_image_names_the_node_and_input(node, output_dir, swiftdit_pack):
    with pytest.raises(swiftdit_pack.nodes.base.SwiftDiTError, match="SwiftDiTSaveImage · images: expected IMAGE"):
        run_with_hidden(node, None, None, images=torch.rand(1, 9, 11, 2), filename_prefix="bad")


@pytest.mark.parametrize("card_has_room", [True, False])
def test_on_a_card_the_same_files(node, output_dir, swiftdit_pack, monkeypatch, card_has_room):
    """Where ComfyUI's device is a card the rows are filtered there (here: the card's function run on the CPU), and
    where the card is out of memory on the CPU: the same files either way."""
    module = swiftdit_pack.nodes.save_image
    real, calls = module.filtered_image, []

    def on_card(image, device):
        calls.append(device)
        if not card_has_room:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(image, "cpu")
    images = torch.rand(1, 23, 17, 3)
    [host] = run_with_hidden(node, None, None, images=images, filename_prefix="host").ui["images"]
    monkeypatch.setattr(module, "filtered_image", on_card)
    monkeypatch.setattr(module.comfy.model_management, "get_torch_device", lambda: torch.device("cuda", 0))
    [card] = run_with_hidden(node, None, None, images=images, filename_prefix="card").ui["images"]
    assert calls == [torch.device("cuda", 0)]
    assert (output_dir / card["filename"]).read_bytes() == (output_dir / host["filename"]).read_bytes()
