"""One family table (dit_core/families/__init__.py, FAMILIES) drives the engine, the nodes' registry and the swap
tool (issue 33): a family added there is known to all three, and the facts the swap reads agree with the nodes."""
import pytest

from dit_core.families import FAMILIES as TABLE
from swiftdit.families import FAMILIES as SWAP


@pytest.fixture(scope="module")
def registry(swiftdit_pack):
    return swiftdit_pack.nodes.NODES_BY_FAMILY


def test_one_table_drives_all_three(registry, swiftdit_pack):
    assert list(registry) == list(TABLE)  # the same families, in the table's order
    assert list(SWAP) == [name for name, row in TABLE.items() if row.replaces]  # those with templates to swap
    assert list(swiftdit_pack.dit_core.families.FAMILIES) == list(TABLE)  # as ComfyUI imports the engine
    for name, row in TABLE.items():
        assert row.name == name and (name not in SWAP or SWAP[name].title == row.title)
        assert registry[name] is getattr(swiftdit_pack.nodes, name).NODES  # nodes/<name>.py's NODES


def test_a_row_without_templates_has_no_swap_facts():
    """OmniVoice: no stock nodes to replace; a row must give text types and replaced nodes together or neither."""
    from dit_core.families import Family
    assert TABLE["omnivoice"].replaces == () and "omnivoice" not in SWAP
    with pytest.raises(ValueError, match="together .* or neither"):
        Family("x", "X", object, "SwiftDiTX", ("lumina2",), (), (), ())


def test_the_swap_rules_name_the_nodes_of_the_family(registry, swiftdit_pack):
    for name, row in TABLE.items():
        if name not in SWAP:
            continue
        ids = {node.define_schema().node_id for node in registry[name]}
        shared = {node.define_schema().node_id for node in swiftdit_pack.nodes.SHARED_NODES}  # of no family
        ours = {role.ours for role in SWAP[name].roles.values()} - shared
        assert set(SWAP[name].roles) == set(row.replaces)
        assert ours <= ids, sorted(ours - ids)
        assert all(i.startswith(row.node_prefix) for i in ids)


def test_the_swap_runs_what_the_nodes_run(registry):
    """The sampler values the swap accepts and the text loader's type are those of the family's nodes."""
    for name, row in TABLE.items():
        if name not in SWAP:
            continue
        nodes = {node.define_schema().node_id: node for node in registry[name]}
        sampler = nodes[SWAP[name].roles["KSampler"].ours]
        assert (tuple(sampler.SAMPLERS), tuple(sampler.SCHEDULERS)) == (row.samplers, row.schedulers), name
        assert dict(SWAP[name].roles["KSampler"].accepts) == {"sampler_name": row.samplers,
                                                              "scheduler": row.schedulers}
        assert [(i.id, i.default) for i in sampler.extra_inputs()] == list(row.sampler_extra), name
        assert nodes[SWAP[name].roles["CLIPLoader"].ours].TYPE in row.text_types


def test_the_engine_loads_through_the_row():
    from dit_core import load_family
    known = "flux3_klein, krea2, ltx25, minimax_h3, omnivoice, z_image"
    with pytest.raises(ValueError, match=f"unknown family 'sd15'; known: {known}"):
        load_family("sd15", "x.safetensors")
    assert TABLE["krea2"].recipe.__name__ == "Krea2" and callable(TABLE["krea2"].load)
