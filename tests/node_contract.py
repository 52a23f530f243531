"""The contract a family's nodes keep with docs/nodes.md (their ids, inputs in order and output types), and how
ComfyUI runs a node."""
from pathlib import Path

import torch

DOC = (Path(__file__).resolve().parents[1] / "docs" / "nodes.md").read_text()


def assert_schemas_follow(nodes, contract: dict, category: str) -> None:
    """nodes (a family's NODES) are exactly contract's {node id: (input names in order, output type or a list of
    output types in order)}, each in
    docs/nodes.md, in `category` ("SwiftDiT/<family>"), with a description, a display name that starts with the
    family's name, and a tooltip on every input and output."""
    assert sorted(n.GET_SCHEMA().node_id for n in nodes) == sorted(contract)
    family = category.removeprefix("SwiftDiT/")
    for node in nodes:
        schema = node.GET_SCHEMA()
        inputs, output = contract[schema.node_id]
        assert f"`{schema.node_id}`" in DOC
        assert schema.category == category and schema.description
        assert schema.display_name.startswith(f"{family} ") and schema.display_name.endswith(" (SwiftDiT)")
        assert [i.id for i in schema.inputs] == inputs
        assert [o.io_type for o in schema.outputs] == (list(output) if isinstance(output, list) else [output])
        untold = [i.id for i in schema.inputs if not i.tooltip] + [o.io_type for o in schema.outputs if not o.tooltip]
        assert not untold, f"{schema.node_id}: no tooltip on {untold}"


def run(node, **inputs):
    """node's outputs for inputs, executed as ComfyUI's executor runs every node: under torch.inference_mode(), so
    what a node keeps and what it is given are inference tensors (no version counter, no in-place update outside
    inference mode)."""
    with torch.inference_mode():
        return node.execute(**inputs).result


def pack_tokenizer_dir() -> Path:
    """ComfyUI's Qwen tokenizer folder, which the pack's text encoder loaders read (nodes/base.py)."""
    from swiftdit_pack.nodes.base import TOKENIZER_DIR
    return TOKENIZER_DIR
