"""UI-format workflow -> API-format prompt as the frontend queues it: subgraphs flattened ("57:28" ids), notes
and reroutes gone, muted and bypassed nodes resolved, positional widget values named from /object_info."""
from __future__ import annotations

from .ui_graph import UIGraph

# Frontend-only nodes: never sent to the server (a PrimitiveNode's value already sits in its target's widget).
FRONTEND_ONLY = ("MarkdownNote", "Note", "Reroute", "PrimitiveNode")
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
# Options after which the frontend stores one more widget value of its own (the seed's "randomize",
# LoadImage's upload button).
EXTRA_VALUE_OPTIONS = ("control_after_generate", "image_upload", "video_upload", "audio_upload")
MUTED, BYPASSED = 2, 4
KEEP = object()  # a linked widget whose value is the node's own widget value


def _specs(info: dict) -> list[tuple[str, list]]:
    """A node's inputs in the server's order: required, then optional (object_info's input_order if any)."""
    inputs, order = info.get("input") or {}, info.get("input_order") or {}
    out = []
    for section in ("required", "optional"):
        specs = inputs.get(section) or {}
        for name in order.get(section) or list(specs):
            out.append((name, specs.get(name) or ["*"]))
    return out


def _options(spec) -> dict:
    return spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}


def _is_widget(spec) -> bool:
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not _options(spec).get("forceInput")


def is_link(value) -> bool:
    """An API-format input that is a wire: [origin id, output slot]."""
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int))


def widget_names(info: dict) -> list[str | None]:
    """Input names in the order of a UI node's widgets_values; None marks a value the frontend adds itself."""
    names = []
    for name, spec in _specs(info):
        if _is_widget(spec):
            names.append(name)
            names += [None] * sum(1 for key in EXTRA_VALUE_OPTIONS if _options(spec).get(key))
    return names


def _promoted(graph: UIGraph, instance, index: int):
    """The value of subgraph input `index`, unlinked on `instance`: with proxyWidgets the inner widgets
    are the live ones (KEEP); with promoted inputs the instance's widgets_values match its widget inputs."""
    node = instance.node
    if (node.get("properties") or {}).get("proxyWidgets") is not None:
        return KEEP
    ports = graph.subgraphs[node["type"]].body.get("inputs", [])
    if ports[index].get("type") not in WIDGET_TYPES:
        return None
    position = sum(1 for port in ports[:index] if port.get("type") in WIDGET_TYPES)
    values = node.get("widgets_values")
    return values[position] if isinstance(values, list) and position < len(values) else KEEP


def _source(graph: UIGraph, placed, link_id):
    """An input's value: ("link", [origin id, slot]) of the node that really gives it, ("value", a promoted
    value), KEEP (the widget's own value), or None (nothing: the input stays as its widgets left it)."""
    prefix, scope = placed.path[:-1], placed.scope
    for _ in range(10_000):
        trace = graph.trace(prefix, scope, link_id)
        if trace.promoted:
            value = _promoted(graph, *trace.promoted)
            return value if value is KEEP or value is None else ("value", value)
        origin = trace.origin
        if origin is None:
            return None
        node = origin.node
        if node.get("type") in FRONTEND_ONLY:
            return KEEP
        if node.get("mode") != BYPASSED or origin.off:
            # A muted origin is linked too: the final clean-up drops the input, as the frontend does.
            return ("link", [origin.id, trace.slot])
        # A bypassed node hands on its input of the output's type, the same slot first (the frontend's rule).
        inputs, outputs = node.get("inputs", []), node.get("outputs", [])
        wanted = outputs[trace.slot].get("type") if trace.slot < len(outputs) else None
        order = ([trace.slot] if trace.slot < len(inputs) else []) + list(range(len(inputs)))
        match = next((i for i in order if inputs[i].get("type") == wanted or wanted in ("*", "")), None)
        if match is None or inputs[match].get("link") is None:
            return None
        prefix, scope, link_id = origin.path[:-1], origin.scope, inputs[match]["link"]
    raise ValueError(f"node {placed.id}: bypassed nodes loop")


def _value(value):
    return {"__value__": value} if isinstance(value, list) else value  # the frontend wraps list widget values


def to_api(workflow: dict, object_info: dict) -> dict:
    """The API-format prompt of a UI-format workflow, given the server's /object_info."""
    graph, prompt = UIGraph(workflow), {}
    for placed in graph.placed():
        node, kind = placed.node, placed.node.get("type")
        if graph.is_instance(node) or kind in FRONTEND_ONLY or placed.off:
            continue
        if node.get("mode") in (MUTED, BYPASSED):
            continue
        info = object_info.get(kind)
        if info is None:
            raise ValueError(f"node {placed.id} ({kind}) is not in object_info: install its pack, or pass "
                             f"the /object_info of a server that has it")
        values = node.get("widgets_values")
        names = widget_names(info)
        if isinstance(values, dict):  # some packs store widgets by name
            named = {n: values[n] for n in names if n and n in values}
        else:
            named = {n: v for n, v in zip(names, values or []) if n}
        inputs = {name: _value(named[name]) for name, _ in _specs(info) if name in named}
        for entry in node.get("inputs", []):
            if entry.get("link") is None:
                continue
            source = _source(graph, placed, entry["link"])
            if source not in (None, KEEP):
                kind_of, value = source
                inputs[entry["name"]] = value if kind_of == "link" else _value(value)
        order = [name for name, _ in _specs(info)]
        rank = {name: i for i, name in enumerate(order)}
        inputs = dict(sorted(inputs.items(), key=lambda kv: rank.get(kv[0], len(order))))
        title = node.get("title") or info.get("display_name") or kind
        prompt[placed.id] = {"inputs": inputs, "class_type": kind, "_meta": {"title": title}}
    for body in prompt.values():  # the frontend drops inputs wired to nodes that are not sent
        for name, value in list(body["inputs"].items()):
            if is_link(value) and value[0] not in prompt:
                del body["inputs"][name]
    return prompt
