"""Graph surgery on a UI-format workflow: remove and add nodes and links, move a link's origin, write a widget or
a promoted subgraph value, with both ends of every link kept in step (what ui_graph.problems checks)."""
from __future__ import annotations

from .ui_graph import LINK_FIELDS, SUBGRAPH_INPUT, SUBGRAPH_OUTPUT, Scope, UIGraph, link_view
from .workflow_api import WIDGET_TYPES

# Widget order of stock nodes whose widgets the reduction writes, for workflows saved without
# `widgets_values_named` (the official templates carry it; the frontend's own saves do not).
KNOWN_WIDGETS = {
    "EmptyFlux2LatentImage": ("width", "height", "batch_size"),
    "EmptySD3LatentImage": ("width", "height", "batch_size"),
    "EmptyLatentImage": ("width", "height", "batch_size"),
    "ComfySwitchNode": ("switch",),
    "ResolutionSelector": ("aspect_ratio", "megapixels", "multiple"),
    "ReferenceMultiLatent": ("resolution", "resolution.megapixels"),  # a DynamicCombo and its child
    "Flux3LayoutPrompt": ("prompt",),
    "ComfyMathExpression": ("expression",),
    "FluxKontextMultiReferenceLatentMethod": ("reference_latents_method",),
    # LTX-2.5's t2v template: its sizes, length and frame rate come from ComfyMathExpression
    "EmptyLTXVLatentVideo": ("width", "height", "length", "batch_size"),
    "LTXVEmptyLatentAudio": ("frames_number", "frame_rate", "batch_size"),
    "LTXVConditioning": ("frame_rate",),
    "CreateVideo": ("fps",),
    **{kind: ("value",) for kind in ("PrimitiveBoolean", "PrimitiveInt", "PrimitiveFloat", "PrimitiveString",
                                     "PrimitiveStringMultiline", "PrimitiveNode")},
}


def _put(raw, name: str, value) -> None:
    """Set one field of a link in either shape (top-level list, subgraph dict)."""
    if isinstance(raw, list):
        raw[LINK_FIELDS.index(name)] = value
    else:
        raw[name] = value


def widget_index(node: dict, name: str) -> int:
    """Where widget `name` sits in the node's widgets_values; ValueError when the node's widgets are unknown."""
    named, values = node.get("widgets_values_named"), node.get("widgets_values")
    if isinstance(named, dict) and isinstance(values, list) and len(named) == len(values) and name in named:
        return list(named).index(name)
    order = KNOWN_WIDGETS.get(node.get("type"), ())
    if name in order and isinstance(values, list) and order.index(name) < len(values):
        return order.index(name)
    raise ValueError(f"node {node.get('id')} ({node.get('type')}): cannot tell which widget value is {name!r}")


def set_widget(node: dict, name: str, value) -> None:
    node["widgets_values"][widget_index(node, name)] = value
    if isinstance(node.get("widgets_values_named"), dict):
        node["widgets_values_named"][name] = value


def promoted_position(body: dict, port_index: int) -> int:
    """Where subgraph input `port_index` sits in an instance's widgets_values (widget-typed inputs only)."""
    return sum(1 for port in body.get("inputs", [])[:port_index] if port.get("type") in WIDGET_TYPES)


class UIEditor:
    """Edits go straight into the workflow dict and into `graph`'s scope maps alike, so lookups see them."""

    def __init__(self, workflow: dict):
        self.wf = workflow
        self.graph = UIGraph(workflow)

    def scope(self, key) -> Scope:
        return self.graph.top if key is None else self.graph.subgraphs[key]

    # --- ids -------------------------------------------------------------------------------------------
    def _next(self, kind: str) -> int:
        """A node or link id no scope uses yet; the root's counters (and each subgraph's state) follow it."""
        if kind == "node":
            used = [n["id"] for s in self.graph.scopes() for n in s.body.get("nodes", [])]
            counters = (("last_node_id", None), ("state", "lastNodeId"))
        else:
            used = [link_view(raw)["id"] for s in self.graph.scopes() for raw in s.body.get("links", []) or []]
            counters = (("last_link_id", None), ("state", "lastLinkId"))
        new = max([0, *[i for i in used if isinstance(i, int)]]) + 1
        for key, inner in counters:
            for body in [self.wf, *(s.body for s in self.graph.subgraphs.values())]:
                if inner is None and isinstance(body.get(key), int):
                    new = max(new, body[key] + 1)
                elif inner and isinstance(body.get(key), dict) and isinstance(body[key].get(inner), int):
                    new = max(new, body[key][inner] + 1)
        for key, inner in counters:
            for body in [self.wf, *(s.body for s in self.graph.subgraphs.values())]:
                if inner is None and key in body:
                    body[key] = new
                elif inner and isinstance(body.get(key), dict) and inner in body[key]:
                    body[key][inner] = new
        return new

    # --- links -----------------------------------------------------------------------------------------
    def origin(self, scope: Scope, node: dict, name: str) -> tuple | None:
        """(origin id, origin slot) of input `name` of `node`, or None when it is not linked."""
        entry = next((e for e in node.get("inputs", []) if e.get("name") == name), None)
        link = scope.link(entry.get("link")) if entry else None
        return (link["origin_id"], link["origin_slot"]) if link else None

    def consumers(self, scope: Scope, node_id, slot: int) -> list:
        ends = {lid: scope.link(lid) for lid in scope.raw_links}
        return [lid for lid, link in ends.items() if (link["origin_id"], link["origin_slot"]) == (node_id, slot)]

    def _origin_port(self, scope: Scope, origin_id, slot: int) -> tuple[dict, str]:
        """The list of link ids at an origin, as (container, key)."""
        if origin_id == SUBGRAPH_INPUT:
            return scope.body["inputs"][slot], "linkIds"
        out = scope.nodes[origin_id]["outputs"][slot]
        if out.get("links") is None:
            out["links"] = []
        return out, "links"

    def _origin_type(self, scope: Scope, origin_id, slot: int):
        if origin_id == SUBGRAPH_INPUT:
            return scope.body["inputs"][slot].get("type")
        return scope.nodes[origin_id]["outputs"][slot].get("type")

    def remove_link(self, scope: Scope, link_id) -> None:
        link = scope.link(link_id)
        if link is None:
            return
        container, key = self._origin_port(scope, link["origin_id"], link["origin_slot"])
        if link_id in container.get(key) or []:
            container[key].remove(link_id)
        if link["target_id"] == SUBGRAPH_OUTPUT:
            ids = scope.body["outputs"][link["target_slot"]].get("linkIds", [])
            if link_id in ids:
                ids.remove(link_id)
        elif link["target_id"] in scope.nodes:
            entry = scope.nodes[link["target_id"]]["inputs"][link["target_slot"]]
            if entry.get("link") == link_id:
                entry["link"] = None
        raw = scope.raw_links.pop(link_id)
        scope.body["links"].remove(raw)

    def add_link(self, scope: Scope, origin_id, slot: int, target_id, target_slot: int) -> int:
        """A new link; the target input must be free. Typed as the origin gives it (LiteGraph's rule)."""
        kind = self._origin_type(scope, origin_id, slot)
        link_id = self._next("link")
        fields = (link_id, origin_id, slot, target_id, target_slot, kind)
        raw = list(fields) if scope.key is None else dict(zip(LINK_FIELDS, fields))
        scope.body.setdefault("links", []).append(raw)
        scope.raw_links[link_id] = raw
        container, key = self._origin_port(scope, origin_id, slot)
        container.setdefault(key, []).append(link_id)
        scope.nodes[target_id]["inputs"][target_slot]["link"] = link_id
        return link_id

    def reorigin(self, scope: Scope, link_id, origin: tuple) -> None:
        """Make link `link_id` start at `origin` (id, slot) instead; its target keeps it."""
        link = scope.link(link_id)
        container, key = self._origin_port(scope, link["origin_id"], link["origin_slot"])
        if link_id in container.get(key) or []:
            container[key].remove(link_id)
        raw = scope.raw_links[link_id]
        _put(raw, "origin_id", origin[0])
        _put(raw, "origin_slot", origin[1])
        _put(raw, "type", self._origin_type(scope, *origin))
        container, key = self._origin_port(scope, *origin)
        container.setdefault(key, []).append(link_id)

    def pass_through(self, scope: Scope, node: dict, slot: int, input_name: str, label=None) -> list:
        """Every consumer of `node`'s output `slot` now reads what its input `input_name` reads; returns the
        moved link ids. ValueError (naming the node as `label`, else by its id) when that input is not linked
        but something consumes the output."""
        moved = self.consumers(scope, node["id"], slot)
        if not moved:
            return []
        origin = self.origin(scope, node, input_name)
        if origin is None:
            raise ValueError(f"node {label or node['id']} ({node['type']}): its {input_name} is not wired, so "
                             f"there is nothing to pass on to what reads its output {slot}")
        for link_id in moved:
            self.reorigin(scope, link_id, origin)
        return moved

    # --- nodes -----------------------------------------------------------------------------------------
    def remove_node(self, scope: Scope, node: dict) -> list:
        """Drop a node and every link at it; returns the (origin id, slot) pairs that fed it."""
        fed_by = []
        for lid in [lid for lid, raw in scope.raw_links.items()
                    if node["id"] in (link_view(raw)["origin_id"], link_view(raw)["target_id"])]:
            link = scope.link(lid)
            if link["target_id"] == node["id"]:
                fed_by.append((link["origin_id"], link["origin_slot"]))
            self.remove_link(scope, lid)
        scope.body["nodes"].remove(node)
        del scope.nodes[node["id"]]
        return fed_by

    def add_node(self, scope: Scope, kind: str, pos, inputs: list, outputs: list, widgets: list) -> dict:
        """A stock node of type `kind`: inputs as (name, type) pairs, outputs as type names."""
        node = {"id": self._next("node"), "type": kind, "pos": list(pos), "size": [270, 60 + 22 * len(widgets)],
                "flags": {}, "order": 0, "mode": 0,
                "inputs": [{"name": name, "type": wire, "link": None} for name, wire in inputs],
                "outputs": [{"name": wire, "type": wire, "links": []} for wire in outputs],
                "properties": {"Node name for S&R": kind}, "widgets_values": list(widgets)}
        scope.body["nodes"].append(node)
        scope.nodes[node["id"]] = node
        return node

    def set_input_value(self, scope: Scope, node_id, name: str, value) -> None:
        """Input `name` of a node becomes the constant `value`: its link goes, and the value is written where
        ComfyUI reads it (the node's widget, or an instance's promoted value, or the inner widgets)."""
        if node_id == SUBGRAPH_OUTPUT:
            raise ValueError(f"{'top level' if scope.key is None else 'subgraph ' + str(scope.key)}: "
                             f"a subgraph output cannot hold a constant")
        node = scope.nodes[node_id]
        entry = next(e for e in node.get("inputs", []) if e.get("name") == name)
        if entry.get("link") is not None:
            self.remove_link(scope, entry["link"])
        if not self.graph.is_instance(node):
            set_widget(node, name, value)
            return
        inner = self.graph.subgraphs[node["type"]]
        index = next(i for i, port in enumerate(inner.body["inputs"]) if port.get("name") == name)
        if (node.get("properties") or {}).get("proxyWidgets") is None:
            values = node.get("widgets_values")
            position = promoted_position(inner.body, index)
            if not isinstance(values, list) or position >= len(values):
                raise ValueError(f"node {node_id} (subgraph instance): no promoted value for {name!r}")
            values[position] = value
            if isinstance(node.get("widgets_values_named"), dict):
                node["widgets_values_named"][name] = value
            return
        for lid in list(inner.body["inputs"][index].get("linkIds", [])):  # proxyWidgets: the inner widgets live
            link = inner.link(lid)
            target = inner.nodes.get(link["target_id"])
            target_name = target["inputs"][link["target_slot"]]["name"] if target else None
            self.set_input_value(inner, link["target_id"], target_name, value)
