"""UI-format workflows: scopes, subgraph placements, links traced across subgraph edges, a validity check."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

SUBGRAPH_INPUT, SUBGRAPH_OUTPUT = -10, -20  # ids of a subgraph's input and output pseudo-nodes (frontend)
LINK_FIELDS = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
ANY = "*"


def link_view(raw) -> dict:
    """A link as a dict: top-level links are lists in LINK_FIELDS order, subgraph links are dicts already."""
    return dict(zip(LINK_FIELDS, raw)) if isinstance(raw, list) else raw


def type_ref(raw) -> tuple:
    """Where a link's type is stored, as (container, key), for either link shape."""
    return (raw, 5) if isinstance(raw, list) else (raw, "type")


@dataclass
class Scope:
    """The top-level graph (key None) or one subgraph definition: its nodes and links by id."""
    key: str | None
    body: dict
    nodes: dict = field(default_factory=dict)
    raw_links: dict = field(default_factory=dict)

    def link(self, link_id) -> dict | None:
        raw = self.raw_links.get(link_id)
        return None if raw is None else link_view(raw)


@dataclass(frozen=True)
class Placed:
    """A node where it runs: the chain of subgraph instances holding it, its definition scope, itself."""
    path: tuple
    scope: Scope
    node: dict
    off: bool = False  # inside a muted or bypassed subgraph instance

    @property
    def id(self) -> str:
        return ":".join(str(p) for p in self.path)  # the frontend's API ids: "57:28"


@dataclass
class Trace:
    """Where a link's value really comes from, and every stored type on the way (links, ports, reroutes)."""
    origin: Placed | None = None
    slot: int = 0
    refs: list = field(default_factory=list)
    promoted: tuple | None = None  # (instance Placed, subgraph input index): ended at an unlinked input


def _scope(key, body) -> Scope:
    scope = Scope(key, body)
    for node in body.get("nodes", []):
        scope.nodes[node["id"]] = node
    for raw in body.get("links", []) or []:
        scope.raw_links[link_view(raw)["id"]] = raw
    return scope


class UIGraph:
    """A UI workflow's scopes. Nodes are looked up, never copied: edits go to the workflow dict itself."""

    def __init__(self, workflow: dict):
        self.top = _scope(None, workflow)
        defs = (workflow.get("definitions") or {}).get("subgraphs") or []
        self.subgraphs = {sg["id"]: _scope(sg["id"], sg) for sg in defs}

    def is_instance(self, node: dict) -> bool:
        return node.get("type") in self.subgraphs

    def scopes(self) -> list[Scope]:
        return [self.top, *self.subgraphs.values()]

    def scope_at(self, prefix: tuple) -> Scope:
        scope = self.top
        for inst in prefix:
            scope = self.subgraphs[scope.nodes[inst]["type"]]
        return scope

    def placed(self) -> Iterator[Placed]:
        """Every node of every placement, subgraph instances included (depth first, file order)."""
        def walk(scope, prefix, off, seen):
            for node in scope.body.get("nodes", []):
                here = Placed(prefix + (node["id"],), scope, node, off)
                yield here
                if self.is_instance(node):
                    if node["type"] in seen:
                        raise ValueError(f"subgraph {node['type']} contains itself (node {here.id})")
                    inner_off = off or node.get("mode") in (2, 4)  # muted or bypassed instance
                    yield from walk(self.subgraphs[node["type"]], here.path, inner_off, seen | {node["type"]})
        yield from walk(self.top, (), False, frozenset())

    def trace(self, prefix: tuple, scope: Scope, link_id) -> Trace:
        """Follow link `link_id` of `scope` (placed at `prefix`) back through subgraph edges and reroutes."""
        out = Trace()
        for _ in range(10_000):  # a bound instead of trusting the file to be acyclic
            raw = scope.raw_links.get(link_id)
            if raw is None:
                return out
            out.refs.append(type_ref(raw))
            link = link_view(raw)
            origin, slot = link["origin_id"], link["origin_slot"]
            if origin == SUBGRAPH_INPUT:
                if not prefix or slot >= len(scope.body.get("inputs", [])):
                    return out
                port = scope.body["inputs"][slot]
                out.refs.append((port, "type"))
                inst = self.scope_at(prefix[:-1]).nodes[prefix[-1]]
                entry = next((i for i in inst.get("inputs", []) if i.get("name") == port["name"]), None)
                if entry is None or entry.get("link") is None:
                    parent = self.scope_at(prefix[:-1])
                    out.promoted = (Placed(prefix, parent, inst), slot)
                    return out
                out.refs.append((entry, "type"))
                prefix, scope, link_id = prefix[:-1], self.scope_at(prefix[:-1]), entry["link"]
                continue
            node = scope.nodes.get(origin)
            if node is None:
                return out
            if self.is_instance(node):
                inner = self.subgraphs[node["type"]]
                if slot >= min(len(inner.body.get("outputs", [])), len(node.get("outputs", []))):
                    return out
                port = inner.body["outputs"][slot]
                out.refs += [(node["outputs"][slot], "type"), (port, "type")]
                if not port.get("linkIds"):
                    return out
                prefix, scope, link_id = prefix + (origin,), inner, port["linkIds"][0]
                continue
            if node.get("type") == "Reroute":  # frontend-only pass-through: the value comes from its input
                out.refs += [(node["outputs"][0], "type"), (node["inputs"][0], "type")]
                link_id = node["inputs"][0].get("link")
                continue
            out.origin, out.slot = Placed(prefix + (origin,), scope, node), slot
            return out
        raise ValueError("link chain does not end (a loop of reroutes or subgraphs?)")


def _port_type_ok(link_type, port_type) -> bool:
    """LiteGraph's rule: "*" or an empty type joins anything; "A,B" joins either A or B."""
    if not link_type or not port_type or ANY in (link_type, port_type):
        return True
    return bool(set(str(link_type).split(",")) & set(str(port_type).split(",")))


def problems(workflow: dict) -> list[str]:
    """What the frontend's loader would trip on: links and node slots that do not point at each other, link
    types that differ from the ports they join, subgraph instances that disagree with their definition, widget
    values that are neither a list nor an object."""
    found = []
    graph = UIGraph(workflow)
    for scope in graph.scopes():
        where = "top level" if scope.key is None else f"subgraph {scope.body.get('name') or scope.key}"
        ids = [link_view(raw)["id"] for raw in scope.body.get("links", []) or []]
        if len(ids) != len(set(ids)):
            found.append(f"{where}: duplicate link ids")
        sg_in, sg_out = scope.body.get("inputs", []), scope.body.get("outputs", [])
        for lid, raw in scope.raw_links.items():
            link = link_view(raw)
            o, t = link["origin_id"], link["target_id"]
            if o == SUBGRAPH_INPUT and scope.key is not None:
                port = sg_in[link["origin_slot"]] if link["origin_slot"] < len(sg_in) else None
                ok = port is not None and lid in port.get("linkIds", [])
            else:
                outs = scope.nodes[o].get("outputs", []) if o in scope.nodes else []
                port = outs[link["origin_slot"]] if link["origin_slot"] < len(outs) else None
                ok = port is not None and lid in (port.get("links") or [])
            if not ok:
                found.append(f"{where}: link {lid} is not listed by its origin {o} "
                             f"slot {link['origin_slot']}")
            elif not _port_type_ok(link["type"], port.get("type")):
                found.append(f"{where}: link {lid} is {link['type']} but origin {o} gives {port.get('type')}")
            if t == SUBGRAPH_OUTPUT and scope.key is not None:
                port = sg_out[link["target_slot"]] if link["target_slot"] < len(sg_out) else None
                ok = port is not None and lid in port.get("linkIds", [])
            else:
                ins = scope.nodes[t].get("inputs", []) if t in scope.nodes else []
                port = ins[link["target_slot"]] if link["target_slot"] < len(ins) else None
                ok = port is not None and port.get("link") == lid
            if not ok:
                found.append(f"{where}: link {lid} is not held by its target {t} slot {link['target_slot']}")
            elif not _port_type_ok(link["type"], port.get("type")):
                found.append(f"{where}: link {lid} is {link['type']} but target {t} takes {port.get('type')}")
        for node in scope.nodes.values():
            for i, entry in enumerate(node.get("inputs", [])):
                link = scope.link(entry.get("link"))
                if entry.get("link") is not None and (link is None or (link["target_id"], link["target_slot"])
                                                      != (node["id"], i)):
                    found.append(f"{where}: node {node['id']} input {i} holds link {entry['link']}, "
                                 f"not aimed at it")
            for i, entry in enumerate(node.get("outputs", [])):
                for lid in entry.get("links") or []:
                    link = scope.link(lid)
                    if link is None or (link["origin_id"], link["origin_slot"]) != (node["id"], i):
                        found.append(f"{where}: node {node['id']} output {i} lists link {lid} not from it")
            if "widgets_values" in node and not isinstance(node["widgets_values"], (list, dict)):
                # the editor's schema takes a list or an object ("Invalid workflow against zod schema")
                found.append(f"{where}: node {node['id']} has widgets_values {node['widgets_values']!r}, not a list")
            if graph.is_instance(node):
                found += _instance_problems(where, node, graph.subgraphs[node["type"]].body)
        for side, ports, end in (("input", sg_in, "origin"), ("output", sg_out, "target")):
            pseudo = SUBGRAPH_INPUT if side == "input" else SUBGRAPH_OUTPUT
            for i, port in enumerate(ports):
                for lid in port.get("linkIds", []):
                    link = scope.link(lid)
                    if link is None or (link[f"{end}_id"], link[f"{end}_slot"]) != (pseudo, i):
                        found.append(f"{where}: subgraph {side} {port.get('name')} lists link {lid}, "
                                     f"not at it")
    return found


def _instance_problems(where: str, node: dict, sg: dict) -> list[str]:
    found = []
    declared = {port["name"]: port.get("type") for port in sg.get("inputs", [])}
    for entry in node.get("inputs", []):
        if entry.get("name") not in declared:
            found.append(f"{where}: instance {node['id']} has input {entry.get('name')} its subgraph lacks")
        elif not _port_type_ok(entry.get("type"), declared[entry["name"]]):
            found.append(f"{where}: instance {node['id']} input {entry['name']} is {entry.get('type')}, "
                         f"its subgraph says {declared[entry['name']]}")
    for i, entry in enumerate(node.get("outputs", [])):
        ports = sg.get("outputs", [])
        if i >= len(ports) or not _port_type_ok(entry.get("type"), ports[i].get("type")):
            found.append(f"{where}: instance {node['id']} output {i} does not match its subgraph's outputs")
    return found
